"""The package's import graph is one-way: no module imports, directly or through others, a module that
imports it back. Read from the source with `ast` (nothing is imported), so it covers modules whose
frameworks are not installed, imports inside functions, and relative imports.

Edges: `import a.b.c` imports module a.b.c if it exists (else its nearest existing parent); `from p import
n` imports p.n when that is a module, else p itself; a package stands for its `__init__`. Parent packages
that Python also runs are not edges: a package `__init__` re-exporting its submodules is not a cycle.
Imports under `if TYPE_CHECKING:` never run, so they are not edges either.
"""
from __future__ import annotations

import ast
from collections import deque
from pathlib import Path

from conftest import ROOT


def package_dirs(root: Path) -> dict[str, Path]:
    """setup.py's package_dir (the repository keeps mpijob/, models/, data/ at top level)."""
    for node in ast.parse((root / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PACKAGE_DIR" for t in node.targets):
            return {name: root / d for name, d in ast.literal_eval(node.value).items()}
    raise AssertionError("setup.py has no PACKAGE_DIR")


def find_modules(packages: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package's __init__), over every package and its subpackages."""
    found: dict[str, tuple[Path, bool]] = {}

    def walk(name: str, directory: Path) -> None:
        found.setdefault(name, (directory / "__init__.py", True))
        for path in sorted(directory.iterdir()):
            if path.is_dir() and (path / "__init__.py").is_file():
                walk(f"{name}.{path.name}", path)
            elif path.suffix == ".py" and path.name != "__init__.py":
                found.setdefault(f"{name}.{path.stem}", (path, False))

    for name, directory in packages.items():
        walk(name, directory)
    return found


def _runtime_imports(tree: ast.AST):
    """Import statements that can run: anywhere (functions included), except under `if TYPE_CHECKING:`."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            test = getattr(child, "test", None) if isinstance(child, ast.If) else None
            if test is not None and "TYPE_CHECKING" in ast.unparse(test):
                todo.extend(child.orelse)
            else:
                todo.append(child)


def module_imports(name: str, path: Path, is_package: bool, known: set[str]) -> dict[str, int]:
    """The package modules `name` imports -> the first line that does."""
    def nearest(dotted: str) -> str | None:
        parts = dotted.split(".")
        for n in range(len(parts), 0, -1):
            if ".".join(parts[:n]) in known:
                return ".".join(parts[:n])
        return None

    out: dict[str, int] = {}
    for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        targets: list[str | None]
        if isinstance(node, ast.Import):
            targets = [nearest(alias.name) for alias in node.names]
        else:
            if node.level:  # relative: from the package holding this module, up level - 1 more
                package = name.split(".") if is_package else name.split(".")[:-1]
                base_parts = package[:len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else nearest(base) for a in node.names]
        for target in targets:
            if target is not None:  # None: outside the package (os, numpy, torch)
                out.setdefault(target, node.lineno)
    return out


def import_graph(root: Path) -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    modules = find_modules(package_dirs(root))
    known = set(modules)
    graph = {name: module_imports(name, path, is_pkg, known) for name, (path, is_pkg) in modules.items()}
    return graph, {name: path for name, (path, _) in modules.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One shortest cycle per strongly connected group of modules, as [a, b, ..., a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def strong(v: str) -> None:  # Tarjan; the graph is small, recursion depth is fine
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1 or v in graph.get(v, {}):
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            strong(v)

    found = []
    for group in groups:
        start = min(group)
        previous: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth first inside the group: the shortest way back to `start`
            v = queue.popleft()
            if start in graph[v]:
                path = [v]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                found.append([start] + path[::-1][1:] + [start] if v != start else [start, start])
                break
            for w in sorted(graph[v]):
                if w in group and w not in previous and w != start:
                    previous[w] = v
                    queue.append(w)
    return sorted(found)


def describe(cycle: list[str], graph: dict[str, dict[str, int]], files: dict[str, Path], root: Path) -> str:
    steps = [f"    {a} -> {b}  ({files[a].relative_to(root)}:{graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(cycle) + "\n" + "\n".join(steps)


def test_no_import_cycles():
    graph, files = import_graph(ROOT)
    assert {"hvdk8s.spec", "hvdk8s.mpijob.render", "hvdk8s.models.registry", "hvdk8s.data.cache.diskio"} <= set(graph)
    assert "hvdk8s.spec" in graph["hvdk8s.mpijob.render"]  # the edges are really read
    found = cycles(graph)
    assert not found, "import cycles (a module imports, through others, one that imports it back):\n" + \
        "\n".join(describe(c, graph, files, ROOT) for c in found)


def test_the_graph_reading_itself(tmp_path):
    """The reader on a small real tree: relative and absolute, top-level and in-function imports, a
    package standing for its __init__, re-exports that are not cycles, and cycles that are."""
    (tmp_path / "setup.py").write_text('PACKAGE_DIR = {"app": "src", "app.extra": "extra"}\n')
    files = {
        "src/__init__.py": "",
        "src/a.py": "from . import b\n",
        "src/b.py": "def f():\n    import app.sub.c\n",
        "src/sub/__init__.py": "from .c import thing\n",
        "src/sub/c.py": "from ..a import x\nthing = 1\n",
        "src/d.py": "from app.sub import thing\nimport os, numpy\n",
        "src/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app import d\nelse:\n    pass\n",
        "extra/__init__.py": "from .y import z\n",
        "extra/y.py": "from app.extra import z as _\nz = 1\n",
        "extra/w.py": "from . import w\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    graph, _ = import_graph(tmp_path)
    assert graph["app.a"] == {"app.b": 1} and graph["app.b"] == {"app.sub.c": 2}
    assert graph["app.sub.c"] == {"app.a": 1} and graph["app.sub"] == {"app.sub.c": 1}
    assert graph["app.d"] == {"app.sub": 1} and graph["app.e"] == {} and graph["app"] == {}
    assert graph["app.extra.y"] == {"app.extra": 1}
    assert cycles(graph) == [["app.a", "app.b", "app.sub.c", "app.a"],
                             ["app.extra", "app.extra.y", "app.extra"],
                             ["app.extra.w", "app.extra.w"]]


# The floors (issue 27): a module imports only modules on its own floor or below, so each floor can be read,
# tested and replaced without the ones above it. Longest prefix wins; every module must be on a floor.
FLOORS: dict[str, tuple[int, str]] = {
    # 0 ground: the pieces everything uses, importing nothing of the project above them. `hvdk8s.core` is the
    # ground floor's own folder (errors, strict, atomic, quantity, k8snames, safeyaml, digest, suggest, the
    # pods' layout), which imports nothing of the project outside itself (test below); the rest of the floor:
    # the lists of choices the job file and the adapters share, the MPIJob API's identity, the generic
    # OpenAPI schema engine and the ObjectMeta rules it applies.
    "hvdk8s.core": (0, "ground"),
    **{f"hvdk8s.{m}": (0, "ground") for m in (
        "_version", "events", "logformat", "schedule", "compression", "precision", "tuning", "faults", "gloo",
        "_torch_wait", "mpijob.api", "mpijob.topology", "mpijob.problems", "mpijob.podsecurity",
        "mpijob.security", "mpijob.validate.schema", "mpijob.validate.objectmeta",
        "launch.procs", "launch.workers", "launch.memlock")},
    # 1 data and models: datasets, loaders, the node-local cache, the model registry.
    "hvdk8s.data": (1, "data and models"), "hvdk8s.models": (1, "data and models"),
    # 2 the job: the job file (spec/, its sections, loading and errors) and what reads it alone; users'
    # factories, resolved before data is built.
    **{f"hvdk8s.{m}": (2, "the job") for m in (
        "spec", "spec.values", "spec.workload", "spec.resources", "spec.kubernetes", "spec.observability",
        "spec.job", "spec.problems", "spec.loading", "overrides", "entrypoint", "jobsize", "jobprint", "factories")},
    "hvdk8s": (2, "the job"),  # the package's __init__: __version__ and the job file's names
    # 3 the renderer and the adapters (hvdk8s.torch, hvdk8s.tensorflow, the Horovod drop-in) and their parts.
    **{f"hvdk8s.{m}": (3, "renderer and adapters") for m in (
        "mpijob", "mpijob.validate", "_adapter", "torch", "tensorflow", "_torch_launch", "_torch_sharded",
        "_torch_powersgd", "_tf_powersgd", "horovod",
        "checkpoint", "metrics", "tensorboard", "runfiles", "failures", "preflight")},
    # 4 the trainer, the launchers and the benchmarks (which start ranks through the local launcher).
    **{f"hvdk8s.{m}": (4, "trainer, launchers, bench") for m in ("trainer", "launch", "rankmain", "bench")},
    # 5 the command line: the package hvdk8s.cli (its verb groups, the one console and error handler).
    **{f"hvdk8s.{m}": (5, "command line") for m in ("cli", "__main__")},
}


def floor_of(module: str, floors: dict[str, tuple[int, str]]) -> tuple[int, str] | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in floors:
            return floors[".".join(parts[:n])]
    return None


def floor_violations(graph: dict[str, dict[str, int]], floors: dict[str, tuple[int, str]]) -> list[str]:
    """Each module without a floor, and each import of a module on a higher floor."""
    found = [f"{m}: on no floor (add it to FLOORS)" for m in sorted(graph) if floor_of(m, floors) is None]
    for module in sorted(graph):
        mine = floor_of(module, floors)
        for target, line in sorted(graph[module].items()):
            theirs = floor_of(target, floors)
            if mine and theirs and theirs[0] > mine[0]:
                found.append(f"{module} (floor {mine[0]}, {mine[1]}) imports {target} (floor {theirs[0]}, "
                             f"{theirs[1]}) at line {line}")
    return found


def test_every_module_imports_only_its_floor_and_below():
    graph, _ = import_graph(ROOT)
    problems = floor_violations(graph, FLOORS)
    assert not problems, "imports that go up a floor:\n  " + "\n  ".join(problems)


def outside_imports(graph: dict[str, dict[str, int]], package: str) -> list[str]:
    """Each import by a module of `package` (the package itself included) of a project module outside it."""
    def inside(module: str) -> bool:
        return module == package or module.startswith(package + ".")

    return [f"{module} imports {target} at line {line}" for module in sorted(graph) if inside(module)
            for target, line in sorted(graph[module].items()) if not inside(target)]


def test_the_ground_floor_imports_nothing_of_the_project_outside_it():
    """`hvdk8s/core/` can be read, tested and reused alone: its modules import, of the project, only
    each other (its own `__init__` included). Standard library and third-party imports are not edges."""
    graph, _ = import_graph(ROOT)
    core = sorted(m for m in graph if m == "hvdk8s.core" or m.startswith("hvdk8s.core."))
    assert {"hvdk8s.core", "hvdk8s.core.errors", "hvdk8s.core.layout", "hvdk8s.core.atomic"} <= set(core)
    problems = outside_imports(graph, "hvdk8s.core")
    assert not problems, "the ground floor (hvdk8s/core/) imports the project outside it:\n  " + \
        "\n  ".join(problems)


def test_an_import_out_of_a_package_is_found():
    graph = {"app.core": {}, "app.core.a": {"app.core.b": 1, "app.core": 2}, "app.core.b": {"app.spec": 4},
             "app.spec": {"app.core.a": 1}, "app.corex": {"app.spec": 1}}
    assert outside_imports(graph, "app.core") == ["app.core.b imports app.spec at line 4"]


def reachable(graph: dict[str, dict[str, int]], module: str) -> set[str]:
    """Every module `module` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in graph.get(todo.pop(), {}):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_adapters_read_no_job_file():
    """Users' `hvdk8s.torch` and `hvdk8s.tensorflow` take their metrics settings from whoever knows the job
    (the trainer, `hvdk8s.rankmain`), never from the job file: nothing they import reaches `hvdk8s.spec`."""
    graph, _ = import_graph(ROOT)
    assert "hvdk8s.spec" in reachable(graph, "hvdk8s.rankmain")  # the check can see the job file
    for adapter in ("hvdk8s._adapter", "hvdk8s.torch", "hvdk8s.tensorflow"):
        found = sorted(m for m in reachable(graph, adapter) if m.split(".")[:2] == ["hvdk8s", "spec"])
        assert not found, f"{adapter} imports the job file: {found}"


def test_an_import_up_a_floor_is_found():
    floors = {"app.ground": (0, "ground"), "app.data": (1, "data"), "app.cli": (2, "cli")}
    graph = {"app.ground": {}, "app.data": {"app.ground": 1}, "app.cli": {"app.data": 3}, "app.data.x": {"app.cli": 7},
             "app.new": {}}
    assert floor_violations(graph, floors) == [
        "app.new: on no floor (add it to FLOORS)",
        "app.data.x (floor 1, data) imports app.cli (floor 2, cli) at line 7"]
