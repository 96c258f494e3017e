"""How `pytest -n N --dist loadgroup` (scripts/test.sh) shares the suite among its workers.

- Tests marked `ranks` start real Horovod ranks: 2 ranks use a 2-core machine's cores. They run two at a
  time: those whose ranks run TensorFlow one after another on one worker (work unit "ranks-tensorflow"),
  the others on another ("ranks"); the two streams are of about the same length (TensorFlow's start-up
  and tracing make its fewer tests as long), so neither waits alone for the other at the end. Those
  also marked `one_rank` (one rank, one core) run beside them anywhere.
- Tests that take the API server (`cluster`, `own_cluster`, `namespace`) share one worker, and so one
  server (work unit "cluster"), those that also start ranks too: on another worker, the session's cluster
  fixture started a second control plane for them, which cost ~32 CPU-s (its start, then idle until the
  session ended), more than their ranks (two tiny scripts) beside the rank streams.
- Tests marked `real_node` (tests/test_cluster_node.py: a cluster and a real node of their own) share one
  worker (work unit "node"), beside the rank tests: their ranks run in pods whose CPU limits add up to the
  machine's cores, and much of their time is spent waiting for pods, probes and the operator. That worker
  is free long before the rank streams end, so the files marked `after_the_node` (their module's
  pytestmark) run their non-TensorFlow rank tests on it too, after the node's (files sort after
  test_cluster_node.py, and its cluster stops when its module ends): a third rank stream, which shortens
  the longest (`ranks`) by what it takes over.
- Tests marked `tensorflow_here` import TensorFlow into the worker's own process (9 CPU-s with Keras and
  what it pulls in): they run on one worker (work unit "tensorflow-here"), which alone pays that; their
  files import it when their tests run, not when every worker collects them.
- Every other test goes to whichever worker is free.

xdist's scheduler sees test ids only, not marks (its own `xdist_group` mark has no effect under pytest 9,
which keeps a test's id where xdist 3.8 no longer writes the group into it), so the marks and fixture
arguments are read from the test file's source here, and `check` stops a run where the collected marks
say otherwise.
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Optional

CLUSTER_FIXTURES = frozenset({"cluster", "own_cluster", "namespace"})
STREAMS = ("node", "ranks", "ranks-tensorflow", "cluster")  # the work units of many tests


@functools.lru_cache(maxsize=None)
def _units(path: Path) -> dict[str, Optional[str]]:
    """Each test function of a file and its work unit: 'node', 'ranks', 'ranks-after-the-node', 'cluster',
    'tensorflow-here', or None (a unit of its own)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    module_marks = " ".join(ast.unparse(node.value) for node in tree.body if isinstance(node, ast.Assign)
                            and any(getattr(t, "id", None) == "pytestmark" for t in node.targets))
    whole = "mark.ranks" in module_marks
    ranks = "ranks-after-the-node" if "mark.after_the_node" in module_marks else "ranks"
    units: dict[str, Optional[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            marks = {ast.unparse(d).rsplit(".", 1)[-1] for d in node.decorator_list}
            if "mark.real_node" in module_marks or "real_node" in marks:
                units[node.name] = "node"
            elif CLUSTER_FIXTURES & {a.arg for a in node.args.args}:
                units[node.name] = "cluster"
            elif "one_rank" in marks:
                units[node.name] = None
            elif whole or "ranks" in marks:
                units[node.name] = ranks
            elif "mark.tensorflow_here" in module_marks or "tensorflow_here" in marks:
                units[node.name] = "tensorflow-here"
    return units


# A rank test runs TensorFlow when its file, function or parameters name it (test_tensorflow.py,
# test_horovod_tf2.py, [tensorflow], [custom_keras.py], ...).
_TENSORFLOW = re.compile(r"tensorflow|keras|tf2|(^|_)tf(_|\b)", re.IGNORECASE)


def work_unit(nodeid: str, rootdir: Path) -> str:
    """'node', 'ranks', 'ranks-tensorflow', 'cluster', 'tensorflow-here', or the test's own id (a unit of its
    own)."""
    path, _, rest = nodeid.partition("::")
    try:
        unit = _units(rootdir / path).get(rest.split("[", 1)[0])
    except (OSError, SyntaxError):
        unit = None
    if unit in ("ranks", "ranks-after-the-node") and _TENSORFLOW.search(nodeid):
        return "ranks-tensorflow"
    if unit == "ranks-after-the-node":
        return "node"
    return unit or nodeid


def check(items, rootdir: Path) -> None:
    """Stop the run (before any test) where a test's marks or fixtures disagree with its work unit."""
    import pytest

    for item in items:
        unit = work_unit(item.nodeid, rootdir)
        if item.get_closest_marker("real_node") and unit != "node":
            raise pytest.UsageError(f"{item.nodeid} is marked `real_node` in a way tests/workgroups.py cannot read: "
                                    "mark the test function or the module (pytestmark)")
        after_the_node = unit == "node" and item.get_closest_marker("after_the_node")
        if item.get_closest_marker("ranks") and not item.get_closest_marker("one_rank") and \
                unit not in ("ranks", "ranks-tensorflow", "cluster") and not after_the_node:
            raise pytest.UsageError(f"{item.nodeid} is marked `ranks` in a way tests/workgroups.py cannot read: "
                                    "mark the test function or the module (pytestmark)")
        if item.get_closest_marker("tensorflow_here") and unit != "tensorflow-here" and \
                not item.get_closest_marker("ranks"):
            raise pytest.UsageError(f"{item.nodeid} is marked `tensorflow_here` in a way tests/workgroups.py cannot "
                                    "read: mark the test function or the module (pytestmark)")
        if "cluster" in item.fixturenames and unit not in ("node", "ranks", "ranks-tensorflow", "cluster"):
            raise pytest.UsageError(f"{item.nodeid} uses the API server: take one of "
                                    f"{', '.join(sorted(CLUSTER_FIXTURES))} as an argument of the test function")
