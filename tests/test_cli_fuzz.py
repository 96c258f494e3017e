"""Generated job files and MPIJob YAML through the real command (in this process, click's CliRunner):
`hvdk8s validate FILE` and `hvdk8s render FILE -d DIR` exit 0 or 2, never with a traceback, within a time
limit; every exit 2 names the file (and, in its lines, the fields); a refused render leaves nothing in DIR.

The inputs are the examples (and a rendered MPIJob) mutated: values of the wrong type, integers past 32 and
64 bits, odd unicode, keys YAML reads as non-strings, deep nesting, fields deleted, renamed or added, then
the text itself cut, spliced, its lines repeated or re-encoded; and YAML generated from nothing."""
from __future__ import annotations

import copy
import itertools
import re
import shutil
import time
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ROOT, invoke, tally

LIMIT = 5.0  # CPU seconds per command (not wall time, which a busy machine stretches): refusals take
# milliseconds; an exponential walk is the catch
SETTINGS = dict(deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
EXAMPLES = {path.relative_to(ROOT / "examples").as_posix(): yaml.safe_load(path.read_text())
            for path in sorted((ROOT / "examples").rglob("*.yaml"))}
_counter = itertools.count()

# -- values, keys and mutations -----------------------------------------------------------------------------

DEEP, HUGE = "zzdeepzz", "zzhugezz"  # placeholders written into the text after dumping (see _text)
_odd_text = st.sampled_from([
    "", " ", "UPPER", "a.b", "-a", "a" * 64, "x" * 300, "\u202eevil", "zero\u200bwidth", "🙂🙂", "é", "日本",
    "tab\there", "new\nline", "a: b", "[1", "{", "*x", "&x", "!!python/object:os.system", "~", "null", "yes", "on",
    ".inf", ".nan", "0x10", "1e3", "010", "1:30", "\ufeff", "\x85", "\u2028", "$(id)", "../../etc/passwd", "C:\\x",
    "s3://bucket/p", "http://[::1", DEEP, HUGE])
_odd_number = st.sampled_from([0, -1, 1, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -2**63 - 1,
                               10**100, 0.5, -0.0, 1e-300, 1e308, float("inf"), float("-inf"), float("nan"), True,
                               False])
_scalar = st.none() | _odd_number | _odd_text | st.integers() | st.floats() | st.text(max_size=12)
_value = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
_key = st.text(max_size=10) | st.sampled_from([1, 0, -1, 1.5, True, False, None, "on", "~", "<<", "name", "args"])


def _paths(node, prefix=()):
    """Every path to a mapping value or list item in `node`."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield prefix + (key,)
        yield from _paths(child, prefix + (key,))


def _parent(data, path):
    for key in path[:-1]:
        data = data[key]
    return data


def _like(value) -> st.SearchStrategy:
    """A value of the same kind as `value`, often one a field accepts: so that some mutants pass."""
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(0, 64)
    if isinstance(value, float):
        return st.floats(0.0, 1.0)
    if isinstance(value, str):
        return st.sampled_from([value, value.upper(), value + "-2"]) | st.from_regex(r"[a-z][a-z0-9-]{0,8}",
                                                                                     fullmatch=True)
    return st.just(copy.deepcopy(value))


@st.composite
def _mutated(draw, base: dict) -> dict:
    data = copy.deepcopy(base)
    for _ in range(draw(st.sampled_from([0, 1, 1, 1, 2, 3]))):
        paths = list(_paths(data))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent, last = _parent(data, path), path[-1]
        op = draw(st.sampled_from(["like", "like", "set", "set", "delete", "rename", "add"]))
        if op == "like":
            parent[last] = draw(_like(parent[last]))
        elif op == "set":
            parent[last] = draw(_value)
        elif op == "delete":
            del parent[last]
        elif isinstance(parent, dict):
            key = draw(_key) if op == "add" else f"{last}{draw(st.sampled_from(['s', '_', 'X', ' ']))}"
            value = draw(_value) if op == "add" else parent.pop(last)
            if key not in parent:
                parent[key] = value
        else:
            parent.append(draw(_value))
    return data


@st.composite
def _text(draw, data) -> bytes:
    """`data` as YAML (placeholders made deep nesting or 1 MiB of text), then perhaps broken as text: cut, a
    character spliced in, a line repeated, re-encoded."""
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=draw(st.booleans()), width=10_000)
    depth = draw(st.sampled_from([3, 63, 64, 65, 500]))
    text = text.replace(DEEP, "[" * depth + "]" * depth).replace(HUGE, "x" * (1 << 20))
    edit = draw(st.sampled_from(["none"] * 6 + ["cut", "splice", "repeat", "latin-1", "utf-16"]))
    if edit == "cut":
        text = text[:draw(st.integers(0, len(text)))]
    elif edit == "splice":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.sampled_from(["\t", ":", " :", "- ", "[", "{", "&a ", "*a", "!!", "%", "\x00",
                                                 "\ufeff", "'", '"', "#", "\n  ", "<<: *a\n"])) + text[at:]
    elif edit == "repeat":
        lines = text.splitlines(keepends=True) or [""]
        i = draw(st.integers(0, len(lines) - 1))
        text = "".join(lines[:i + 1] + lines[i:])
    if edit == "latin-1":
        return text.encode("latin-1", "replace")
    return text.encode("utf-16" if edit == "utf-16" else "utf-8", "surrogatepass")


_generated = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(_key, inner, max_size=4), max_leaves=12)


# -- the checks ---------------------------------------------------------------------------------------------

def _run(target: str, *args):
    began = time.thread_time()
    result = invoke(*args)  # an exception that escapes the command fails the test here
    took = time.thread_time() - began
    counts = tally(target)
    counts["tried"] += 1
    counts["accepted" if result.exit_code == 0 else "refused"] += 1
    counts["most CPU ms"] = max(counts["most CPU ms"], int(took * 1000))
    assert took < LIMIT, f"{args} took {took:.1f} s of CPU"
    assert result.exit_code in (0, 2), f"{args}: exit {result.exit_code}\n{result.output}"
    assert "Traceback" not in result.output, result.output
    return result


def _names_its_input(result, path: Path, out: Path | None = None) -> bool:
    """The message names the file, the -d directory, or a field (a `  field.path: message` line)."""
    fields = [line for line in result.stderr.splitlines() if re.match(r"^  (?!\(top level\))\S[^:]*: ", line)]
    return str(path) in result.stderr or (out is not None and f"--output-dir {out}" in result.stderr) or bool(fields)


def _check_job_file(tmp_path: Path, example: str, content: bytes) -> None:
    work = tmp_path / f"job{next(_counter)}"
    shutil.copytree((ROOT / "examples" / example).parent, work,
                    ignore=shutil.ignore_patterns("__pycache__", "*.yaml"))
    path = work / "job.yaml"
    path.write_bytes(content)
    out = work / "rendered"
    try:
        # --no-import: the factories' example builds a model with whatever args were generated (a rank's
        # business; here, in this process, a `hidden: [2**40]` would take the memory)
        checked = _run("job files: validate", "validate", "--no-import", path)
        assert checked.exit_code == 0 or _names_its_input(checked, path), checked.stderr
        rendered = _run("job files: render -d", "render", path, "-d", out)
        if rendered.exit_code == 0:
            assert checked.exit_code == 0, f"render took what validate refused:\n{checked.stderr}"
            written = sorted(p.name for p in out.iterdir())  # a PodMonitor too, where the job asks for one
            assert written in (["configmap.yaml", "kustomization.yaml", "mpijob.yaml"],
                               ["configmap.yaml", "kustomization.yaml", "mpijob.yaml", "podmonitor.yaml"]), written
            listed = yaml.safe_load((out / "kustomization.yaml").read_text())["resources"]
            assert sorted(listed) == [f for f in written if f != "kustomization.yaml"]
        else:
            assert _names_its_input(rendered, path, out), rendered.stderr
            assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())
    finally:
        shutil.rmtree(work, ignore_errors=True)


@settings(max_examples=120, **SETTINGS)
@given(data=st.data(), example=st.sampled_from(sorted(EXAMPLES)))
def test_mutated_job_files_exit_0_or_2_naming_the_file(tmp_path, data, example):
    content = data.draw(_text(data.draw(_mutated(EXAMPLES[example]))))
    _check_job_file(tmp_path, example, content)


@settings(max_examples=40, **SETTINGS)
@given(data=st.data(), doc=_generated)
def test_generated_yaml_as_a_job_file_exits_0_or_2(tmp_path, data, doc):
    _check_job_file(tmp_path, "digits.yaml", data.draw(_text(doc)))


# -- MPIJobs ------------------------------------------------------------------------------------------------

def _rendered_mpijob() -> dict:
    from hvdk8s.mpijob import render
    from hvdk8s.spec import load_job

    return render.mpijob(load_job(ROOT / "examples" / "digits.yaml"))


MPIJOB = _rendered_mpijob()


@settings(max_examples=60, **SETTINGS)
@given(data=st.data())
def test_mutated_mpijobs_exit_0_or_2_naming_the_file(tmp_path, data):
    doc = data.draw(_mutated(MPIJOB))
    path = tmp_path / f"mpijob{next(_counter)}.yaml"
    path.write_bytes(data.draw(_text(doc)))
    try:
        result = _run("MPIJob YAML: validate", "validate", path)
        assert result.exit_code == 0 or _names_its_input(result, path), result.stderr
    finally:
        path.unlink()
