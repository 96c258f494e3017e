"""The suite's split among xdist workers (tests/workgroups.py) follows the marks and fixtures of each test."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import workgroups


def _write(tmp_path, name: str, source: str) -> str:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / name).write_text(textwrap.dedent(source))
    return f"tests/{name}"


def test_marked_functions_and_modules_run_on_the_ranks_worker(tmp_path):
    some = _write(tmp_path, "test_some.py", """\
        import pytest

        @pytest.mark.ranks
        @pytest.mark.parametrize("x", [1, 2])
        def test_starts_ranks(x): ...

        @pytest.mark.ranks
        @pytest.mark.one_rank
        def test_starts_one_rank(): ...

        def test_takes_the_server(namespace): ...

        def test_plain(tmp_path): ...
    """)
    whole = _write(tmp_path, "test_whole.py", """\
        import pytest
        pytestmark = [pytest.mark.ranks]

        def test_anything(tmp_path): ...

        def test_ranks_and_the_server(cluster): ...
    """)
    assert workgroups.work_unit(f"{some}::test_starts_ranks[1]", tmp_path) == "ranks"
    # TensorFlow's rank tests are a second stream, run beside the first.
    assert workgroups.work_unit(f"{some}::test_starts_ranks[tensorflow]", tmp_path) == "ranks-tensorflow"
    assert workgroups.work_unit(f"{some}::test_starts_ranks[custom_keras.py]", tmp_path) == "ranks-tensorflow"
    assert workgroups.work_unit(f"{some}::test_starts_one_rank", tmp_path) == f"{some}::test_starts_one_rank"
    assert workgroups.work_unit(f"{some}::test_takes_the_server", tmp_path) == "cluster"
    assert workgroups.work_unit(f"{some}::test_plain", tmp_path) == f"{some}::test_plain"
    assert workgroups.work_unit(f"{whole}::test_anything", tmp_path) == "ranks"
    # A rank test that takes the API server runs with the server's tests: elsewhere it would start a second.
    assert workgroups.work_unit(f"{whole}::test_ranks_and_the_server", tmp_path) == "cluster"
    node = _write(tmp_path, "test_node.py", """\
        import pytest
        pytestmark = [pytest.mark.skipif(False, reason="built"), pytest.mark.real_node]

        def test_a_pod(cluster): ...

        @pytest.mark.ranks
        def test_a_job(tmp_path): ...
    """)
    assert workgroups.work_unit(f"{node}::test_a_pod", tmp_path) == "node"
    assert workgroups.work_unit(f"{node}::test_a_job", tmp_path) == "node"
    # A file marked after_the_node: its rank tests follow the node's on that worker (TensorFlow's keep theirs).
    after = _write(tmp_path, "test_after.py", """\
        import pytest
        pytestmark = [pytest.mark.ranks, pytest.mark.after_the_node]

        @pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
        def test_a_launch(framework): ...
    """)
    assert workgroups.work_unit(f"{after}::test_a_launch[pytorch]", tmp_path) == "node"
    assert workgroups.work_unit(f"{after}::test_a_launch[tensorflow]", tmp_path) == "ranks-tensorflow"


def test_tests_that_import_tensorflow_here_share_one_worker(tmp_path):
    marked = _write(tmp_path, "test_tf_here.py", """\
        import pytest
        pytestmark = pytest.mark.tensorflow_here

        @pytest.mark.parametrize("x", [1, 2])
        def test_in_process(x): ...
    """)
    one = _write(tmp_path, "test_one_here.py", """\
        import pytest

        @pytest.mark.tensorflow_here
        def test_marked(): ...

        def test_plain(): ...
    """)
    assert workgroups.work_unit(f"{marked}::test_in_process[1]", tmp_path) == "tensorflow-here"
    assert workgroups.work_unit(f"{marked}::test_in_process[2]", tmp_path) == "tensorflow-here"
    assert workgroups.work_unit(f"{one}::test_marked", tmp_path) == "tensorflow-here"
    assert workgroups.work_unit(f"{one}::test_plain", tmp_path) == f"{one}::test_plain"


def test_a_file_it_cannot_read_leaves_each_test_on_its_own(tmp_path):
    broken = _write(tmp_path, "test_broken.py", "def test_x(:\n")
    assert workgroups.work_unit(f"{broken}::test_x", tmp_path) == f"{broken}::test_x"
    assert workgroups.work_unit("tests/test_absent.py::test_y", tmp_path) == "tests/test_absent.py::test_y"


def test_a_mark_or_fixture_it_cannot_see_stops_the_run(tmp_path):
    """A real collection (pytest in a process of its own) whose conftest checks as ours does."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent("""\
        import pytest
        import workgroups

        @pytest.fixture
        def cluster(): ...

        @pytest.fixture
        def launched(cluster): ...

        def pytest_collection_modifyitems(config, items):
            workgroups.check(items, config.rootpath)
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    ranks: starts ranks\n    tensorflow_here: imports it\n")
    (tmp_path / "test_marked.py").write_text(textwrap.dedent("""\
        import pytest
        RANKS = pytest.mark.ranks

        @RANKS
        def test_marked_by_name(): ...
    """))
    (tmp_path / "test_server.py").write_text("def test_server_through_another_fixture(launched): ...\n")
    (tmp_path / "test_tf_by_name.py").write_text(textwrap.dedent("""\
        import pytest
        HERE = pytest.mark.tensorflow_here

        @HERE
        def test_imports_tensorflow(): ...
    """))
    env = {**os.environ, "PYTHONPATH": str(Path(workgroups.__file__).parent)}

    def collect(name: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                               "-p", "no:xdist", name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)

    marked = collect("test_marked.py")
    assert marked.returncode != 0 and "test_marked_by_name is marked `ranks`" in marked.stdout + marked.stderr
    server = collect("test_server.py")
    assert server.returncode != 0 and "uses the API server" in server.stdout + server.stderr
    here = collect("test_tf_by_name.py")
    assert here.returncode != 0 and "is marked `tensorflow_here`" in here.stdout + here.stderr
