"""How `pytest -n N --dist loadgroup` (scripts/test.sh) shares the suite among its workers.

- Tests marked `ranks` start real Horovod ranks: each uses every core, and some bound how long a rank
  may take to die. They run one at a time, on one worker, as they would alone (work unit "ranks"),
  except those also marked `one_rank`: one rank uses one core, so they may run beside the others.
- Tests that take the API server (`cluster`, `own_cluster`, `namespace`) share one worker, and so one
  server (work unit "cluster").
- Every other test goes to whichever worker is free.

xdist's scheduler sees test ids only, not marks (its own `xdist_group` mark has no effect under pytest 9,
which keeps a test's id where xdist 3.8 no longer writes the group into it), so the marks and fixture
arguments are read from the test file's source here, and `check` stops a run where the collected marks
say otherwise.
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

CLUSTER_FIXTURES = frozenset({"cluster", "own_cluster", "namespace"})


@functools.lru_cache(maxsize=None)
def _read(path: Path) -> tuple[bool, frozenset[str], frozenset[str], frozenset[str]]:
    """(the module is marked `ranks`, its test functions marked `ranks`, those marked `one_rank`, those
    taking the API server)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    whole = any(isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets)
                and "mark.ranks" in ast.unparse(node.value) for node in tree.body)
    ranks, one_rank, cluster = set(), set(), set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            marks = {ast.unparse(d).rsplit(".", 1)[-1] for d in node.decorator_list}
            if "ranks" in marks:
                ranks.add(node.name)
            if "one_rank" in marks:
                one_rank.add(node.name)
            if CLUSTER_FIXTURES & {a.arg for a in node.args.args}:
                cluster.add(node.name)
    return whole, frozenset(ranks), frozenset(one_rank), frozenset(cluster)


def work_unit(nodeid: str, rootdir: Path) -> str:
    """'ranks', 'cluster', or the test's own id (a unit of its own)."""
    path, _, rest = nodeid.partition("::")
    function = rest.split("[", 1)[0]
    try:
        whole, ranks, one_rank, cluster = _read(rootdir / path)
    except (OSError, SyntaxError):
        return nodeid
    if function in one_rank:
        return nodeid
    if whole or function in ranks:
        return "ranks"
    return "cluster" if function in cluster else nodeid


def check(items, rootdir: Path) -> None:
    """Stop the run (before any test) where a test's marks or fixtures disagree with its work unit."""
    import pytest

    for item in items:
        unit = work_unit(item.nodeid, rootdir)
        if item.get_closest_marker("ranks") and unit != "ranks" and not (
                item.get_closest_marker("one_rank") and unit == item.nodeid):
            raise pytest.UsageError(f"{item.nodeid} is marked `ranks` in a way tests/workgroups.py cannot read: "
                                    "mark the test function or the module (pytestmark)")
        if "cluster" in item.fixturenames and unit not in ("ranks", "cluster"):
            raise pytest.UsageError(f"{item.nodeid} uses the API server: take one of {', '.join(sorted(CLUSTER_FIXTURES))} "
                                    "as an argument of the test function")
