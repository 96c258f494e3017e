"""YAML from users, read within bounds: a size limit (checked before reading the rest, so /dev/zero or
a 50 MB file is refused at once), UTF-8 only, no duplicate keys (a second `training:` would silently
replace the first), string keys only (YAML 1.1 reads `on:` as True), and limits on nesting and on the
size after aliases expand ("billion laughs"), so nothing downstream walks an exponential structure.
Every refusal is a `YAMLInputError` with a one-line reason and, where known, the line and column."""
from __future__ import annotations

import os
from typing import Any, Union

import yaml

MAX_BYTES = 1 << 20        # a job file is a few KB; a large MPIJob YAML a few hundred
MAX_DEPTH = 64
MAX_NODES = 200_000        # mappings, lists and scalars, counting each alias expansion


class YAMLInputError(ValueError):
    """Input that is not acceptable YAML for hvdk8s; str() is a one-line reason."""


class _StrictLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)  # resolves `<<` merges first, as SafeLoader does
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, str):
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is not a string (quote it: YAML reads on/off/yes/no, numbers "
                                    "and ~ as other types)", key_node.start_mark)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def _where(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""


def _check_size(docs: list, max_depth: int, max_nodes: int) -> None:
    """Expanded size and depth, computed once per distinct object (aliases share objects)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, int, bool]] = [(d, 1, False) for d in docs]
    while stack:
        node, depth, children_done = stack.pop()
        if not isinstance(node, (dict, list)) or id(node) in sizes and not children_done:
            continue
        if depth > max_depth:
            raise YAMLInputError(f"nested more than {max_depth} levels deep")
        children = list(node.values()) if isinstance(node, dict) else node
        if children_done:
            total = 1 + sum(sizes.get(id(c), 1) for c in children)
            if total > max_nodes:
                raise YAMLInputError(f"more than {max_nodes} values once aliases are expanded")
            sizes[id(node)] = total
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if isinstance(c, (dict, list)) and id(c) not in sizes)


def loads(text: Union[str, bytes], *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH,
          max_nodes: int = MAX_NODES) -> list:
    """The non-empty documents of `text`."""
    if isinstance(text, bytes):
        if len(text) > max_bytes:
            raise YAMLInputError(f"larger than {max_bytes // 1024} KiB")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise YAMLInputError(f"not UTF-8 text (byte {e.start}: {text[e.start:e.start + 1]!r})") from None
    elif len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        raise YAMLInputError(f"larger than {max_bytes // 1024} KiB")
    try:
        docs = [d for d in yaml.load_all(text, Loader=_StrictLoader) if d is not None]
    except yaml.YAMLError as e:
        raise YAMLInputError(f"not valid YAML: {_where(e)}{getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise YAMLInputError("nested too deeply to read") from None
    _check_size(docs, max_depth, max_nodes)
    return docs


def read_bytes(path: Union[str, os.PathLike], max_bytes: int = MAX_BYTES) -> bytes:
    """At most max_bytes + 1 bytes of the file at `path`: enough for `loads` to refuse a larger one. OSError
    for a file that cannot be read (the caller names it)."""
    with open(path, "rb") as f:
        return f.read(max_bytes + 1)


def read(path: Union[str, os.PathLike], *, max_bytes: int = MAX_BYTES, **limits: int) -> list:
    """The documents of the file at `path`, reading at most max_bytes + 1 bytes of it. OSError for a
    file that cannot be read (the caller names it)."""
    return loads(read_bytes(path, max_bytes), max_bytes=max_bytes, **limits)


def load_value(text: str) -> Any:
    """One YAML value typed on a command line (`--set field=VALUE`), under the same rules."""
    docs = loads(text)
    if len(docs) > 1:
        raise YAMLInputError("more than one YAML document")
    return docs[0] if docs else None
