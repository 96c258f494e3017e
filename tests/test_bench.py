"""`hvdk8s bench`: the pieces a quick CI run (.ci/run) does not prove, and bad input.

No timing is asserted anywhere: numbers belong in the report, not in tests."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, cli
from hvdk8s.bench.core import Comparison, Row, fast_mode_threshold, interleaved

GPU_JOB = ROOT / "tests" / "golden" / "gpu-4x8-rdma" / "job.yaml"


def test_ratios_are_against_the_baseline_of_each_group():
    c = Comparison("x", "t", "ms", False, {"a": "base", "b": "other"},
                   [Row("base", [2.0, 4.0, 3.0], group="a"), Row("new", [6.0], group="a"),
                    Row("other", [1.0], group="b"), Row("new", [5.0], group="b"), Row("lone", [1.0], group="c")])
    assert [c.ratio(r) for r in c.rows] == [1.0, 2.0, 1.0, 5.0, None]
    assert c.to_json()["rows"][1] == {**c.to_json()["rows"][1], "median": 6.0, "ratio": 2.0}


def test_configurations_are_measured_in_turn():
    order = []
    samples = interleaved({"a": lambda: order.append("a") or 1.0, "b": lambda: order.append("b") or 2.0}, 3)
    assert order == ["a", "b"] * 3 and samples == {"a": [1.0] * 3, "b": [2.0] * 3}


def test_a_failed_rank_run_says_why_with_its_stderr():
    """A baseline's ranks that fail end the benchmark with their exit status and the tail of what they
    wrote, stderr included (torchrun and a rank's traceback write there); `hvdk8s bench` prints it as a
    message and exits 1, not a traceback of its own."""
    from hvdk8s.bench.core import BenchError
    from hvdk8s.bench.ranks import run_json

    with pytest.raises(BenchError, match=r"(?s)plain x1 hvdk8s\.bench\.no_such_rank failed \(1\):.*"
                                         r"No module named hvdk8s\.bench\.no_such_rank"):
        run_json("hvdk8s.bench.no_such_rank", {}, "plain", 1)


@pytest.mark.parametrize("args, says", [
    (("--only", "wrapper,nope"), "--only: unknown benchmark nope"),
    (("--render", GPU_JOB, "--from-logs", GPU_JOB), "--render, --from-logs: one at a time"),
    (("--set", "name=x"), "--set: only with --render"),
    (("-d", "/proc/hvdk8s-bench"), "--output-dir: cannot write to /proc/hvdk8s-bench"),
])
def test_bad_arguments_are_one_line(args, says):
    run = cli("bench", *args)
    assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr


def test_the_cluster_benchmark_renders_two_valid_mpijobs_with_and_without_rdma(tmp_path):
    from hvdk8s.mpijob import validate as mv

    run = cli("bench", "--render", GPU_JOB, "-d", tmp_path)
    assert run.returncode == 0, run.stderr
    jobs = {label: yaml.safe_load((tmp_path / label / "mpijob.yaml").read_text()) for label in ("rdma", "tcp")}
    for label, job in jobs.items():
        assert job["metadata"]["name"] == f"lm-4x8-rdma-bench-{label}"
        assert mv.validate_mpijob(job) == []
        launcher = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        assert launcher["command"][-3:] == ["--module", "hvdk8s.bench.cluster_rank", label]
        assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4  # the job's nodes, as written
    worker = {label: json.dumps(job["spec"]["mpiReplicaSpecs"]["Worker"]) for label, job in jobs.items()}
    assert "rdma/rdma_shared_device_a" in worker["rdma"] and "rdma/rdma_shared_device_a" not in worker["tcp"]


def test_the_cluster_benchmark_needs_a_gpu_job_with_rdma_configured(tmp_path):
    run = cli("bench", "--render", ROOT / "examples" / "digits.yaml", "-d", tmp_path)
    assert run.returncode == 2 and "resources.gpus" in run.stderr and "resources.rdma.enabled" in run.stderr
    assert not any(tmp_path.iterdir())


@pytest.mark.ranks
def test_a_cluster_rank_log_becomes_the_report(tmp_path):
    """The rank program the rendered MPIJobs run, on 2 real local ranks; its log read back by --from-logs."""
    from hvdk8s.launch import local
    import subprocess

    cmd = local.command([sys.executable, "-m", "hvdk8s.bench.cluster_rank", "tcp", "16384", "2"], 2)
    proc = subprocess.run(cmd, env=local.environment(2), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = tmp_path / "launcher.log"
    result_lines = [line for line in proc.stdout.splitlines() if "@hvdk8s-bench " in line]
    assert len(result_lines) == 1 and result_lines[0].endswith("}"), proc.stdout  # one whole line
    log.write_text("some mpirun noise\n" + proc.stdout)
    bad = tmp_path / "other.log"
    bad.write_text("no results here\n")

    run = cli("bench", "--from-logs", log, "-d", tmp_path / "report")
    assert run.returncode == 0, run.stderr
    result = json.loads((tmp_path / "report" / "results.json").read_text())
    names = [b["name"] for b in result["benchmarks"]]
    assert names == ["cluster_allreduce", "cluster_training"]
    allreduce = result["benchmarks"][0]["rows"]
    assert {r["group"] for r in allreduce} == {"1 KB", "4 KB", "16 KB"}
    assert all(r["median"] > 0 for r in allreduce)
    training = result["benchmarks"][1]["rows"]
    assert {r["group"] for r in training} == {"mlp", "resnet", "transformer"} and all(r["ratio"] == 1.0 for r in training)
    assert (tmp_path / "report" / "cluster_allreduce.png").stat().st_size > 0
    assert "## Allreduce bus bandwidth, 2 ranks on 1 nodes" in (tmp_path / "report" / "README.md").read_text()

    run = cli("bench", "--from-logs", bad, "-d", tmp_path / "report2")
    assert run.returncode == 2 and f"{bad}: no benchmark result" in run.stderr


def test_the_contending_job_leaves_no_process_behind():
    """torchrun puts its ranks in sessions of their own; stopping the contending job must end them too."""
    import time

    from hvdk8s.bench.ranks import contending_job
    from hvdk8s.launch import procs

    with contending_job() as proc:
        deadline = time.monotonic() + 120
        while len(procs.descendants(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)  # torchrun and its two ranks
        started = procs.descendants(proc.pid)
        assert len(started) >= 2, started
    def running(pid: int) -> bool:
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(") ", 1)[1][0] != "Z"
        except OSError:
            return False

    time.sleep(0.5)
    assert [p for p in started if running(p)] == []


def test_any_log_becomes_a_report_or_a_message_naming_the_file(tmp_path_factory):
    """--from-logs reads files users hand in: whatever the result line holds, a report or a UserError."""
    from hypothesis import HealthCheck, given, settings, strategies as st

    from hvdk8s.bench import cluster, report
    from hvdk8s.core.errors import UserError

    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
    near = st.fixed_dictionaries({
        "label": st.text(max_size=5), "ranks": st.integers(-2, 10), "nodes": st.integers(-2, 4),
        "allreduce": st.fixed_dictionaries({"sizes": st.lists(st.integers(-5, 1 << 60), max_size=3),
                                            "fp32": st.lists(st.floats(), max_size=3),
                                            "fp16": st.lists(st.floats(), max_size=3)}),
        "samples_per_s": st.dictionaries(st.text(max_size=4), st.floats(), max_size=2)})

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(result=values | near, framing=st.sampled_from(["{}\n", "[1,0]<stdout>:{}[1,0]<stdout>:\n", "{}"]))
    def check(result, framing):
        log = tmp_path_factory.mktemp("log") / "launcher.log"
        log.write_text("noise\n" + framing.format("@hvdk8s-bench " + json.dumps(result)))
        try:
            comparisons = cluster.comparisons(cluster.read_logs([str(log)]))
        except UserError as e:
            assert str(log) in str(e)
            return
        assert "## Allreduce bus bandwidth" in report.markdown(comparisons, {}, False)

    check()


def test_two_modes_split_only_where_the_values_are_bimodal():
    fast, slow = [2300.0, 2250.0, 2410.0, 2330.0], [1600.0, 1650.0, 1560.0]
    threshold = fast_mode_threshold(fast + slow)
    assert max(slow) < threshold < min(fast)
    assert fast_mode_threshold(fast) is None  # noise within one mode never splits
    assert fast_mode_threshold([2300.0]) is None and fast_mode_threshold([]) is None


def test_paired_ratios_are_the_median_of_each_pair_not_of_the_medians():
    rows = [Row("plain", [10.0, 40.0, 20.0], group="g"), Row("hvdk8s", [11.0, 20.0, 44.0], group="g")]
    assert Comparison("c", "t", "ms", False, "plain", rows, paired=True).ratio(rows[1]) == pytest.approx(1.1)
    assert Comparison("c", "t", "ms", False, "plain", rows).ratio(rows[1]) == pytest.approx(1.0)


def test_processes_taking_turns_answer_every_turn():
    from hvdk8s.bench.ranks import taking_turns

    turned = taking_turns({"a": ("plain", None, False), "b": ("plain", None, False)}, {"model": "mlp", "batch": 4},
                          turns=3, steps_per_turn=1)
    assert [len(v) for v in turned.values()] == [3, 3] and all(s > 0 for v in turned.values() for s in v)


@pytest.mark.ranks
def test_the_gpu_check_runs_dry_on_cpu_and_records_its_provenance(tmp_path):
    """bench/gpu_check.py waits for a GPU machine; its dry run keeps every path of it running here (CI too),
    and its report says what was measured: the commit and the tuning profile in force."""
    proc = subprocess.run([sys.executable, "-m", "hvdk8s.bench.gpu_check", "--dry-run", "-d", str(tmp_path)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["group"], r["config"]) for r in result["benchmarks"][0]["rows"]}
    assert rows == {("resnet", c) for c in ("plain", "horovod", "hvdk8s, tuning none", "hvdk8s, tuning shared-cpu")}
    assert result["machine"]["tuning"] == "shared-cpu" and result["machine"]["commit"]
    assert {"horovod", "torch", "tensorflow"} <= set(result["machine"])


def test_a_benchmark_this_machine_cannot_run_is_skipped_and_the_others_run(tmp_path, monkeypatch):
    """`network` needs root; without it `hvdk8s bench` says why it skipped it and runs the rest. (This
    machine runs as root, so the condition is made here: a benchmark of this module that cannot run.)"""
    from hvdk8s.bench import run as bench_run

    monkeypatch.setitem(bench_run.BENCHMARKS, "cannot", ("test_bench:_cannot_run_here", "needs what is missing"))
    monkeypatch.setitem(bench_run.BENCHMARKS, "can", ("test_bench:_runs_anywhere", "runs"))
    said = []
    results = bench_run.run(["cannot", "can"], True, tmp_path, said.append)
    assert [c.name for c in results] == ["can"]
    assert "cannot: skipped: needs a thing this machine lacks" in said and "can: done in 0s" in said, said
    assert "## one" in (tmp_path / "README.md").read_text()


def _cannot_run_here(quick):
    from hvdk8s.bench.core import CannotRunHere

    raise CannotRunHere("needs a thing this machine lacks")


def _runs_anywhere(quick):
    return Comparison("can", "one", "ms", False, "a", [Row("a", [1.0])])


def test_a_network_run_ends_when_one_of_its_processes_fails_or_outlives_the_others():
    """The emulated network's runs start a process per node (DDP: a torchrun each); a peer that fails, or
    ends while another waits on, must end the wait at once or within the grace, not after the timeout."""
    from hvdk8s.bench.network import _wait_all
    from hvdk8s.bench.ranks import kill_tree

    def started(*commands):
        return [subprocess.Popen(["sh", "-c", c]) for c in commands]

    runs = [started("exit 0", "exit 0"), started("sleep 600", "exit 3"), started("exit 0", "sleep 600")]
    try:
        assert _wait_all(runs[0], timeout=600, grace=600) == ""
        assert _wait_all(runs[1], timeout=600, grace=600) == "process 1 failed"
        assert runs[1][0].poll() is None  # the caller kills the rest (kill_tree)
        assert _wait_all(runs[2], timeout=600, grace=0.5) == "process 1 still running 0.5s after another ended"
    finally:
        for proc in (p for run in runs for p in run):
            kill_tree(proc)
