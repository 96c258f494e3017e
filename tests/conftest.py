"""Shared helpers: run the real CLI, and start real Horovod ranks through the project's launcher."""
from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

ROOT = Path(__file__).resolve().parents[1]
RANK_SCRIPTS = Path(__file__).resolve().parent / "ranks"


def _operator_crd() -> Path:
    """The MPIJob CRD of the mpi-operator module scripts/k8s/build-135.sh built (the one the test cluster
    installs), else the copy in shared/k8s/ beside the repository."""
    cache = Path(os.environ.get("HVDK8S_BUILD_CACHE") or
                 Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdk8s")
    built = sorted(cache.glob("k8s-*-mpi-operator-*/crd/kubeflow.org_mpijobs.yaml"))
    return built[-1] if built else Path(__file__).resolve().parents[2] / "shared" / "k8s" / "mpijob-crd.yaml"


OPERATOR_CRD = _operator_crd()


@pytest.fixture(scope="session")
def crd_schema() -> dict:
    """OPERATOR_CRD's v2beta1 schema; a missing file fails in CI (a core path never skips there) and skips
    elsewhere, saying why."""
    from hvdk8s.mpijob.validate import load_crd_schema

    if not OPERATOR_CRD.is_file():
        reason = (f"MPIJob CRD not found: neither built (bash scripts/k8s/build-135.sh) nor at {OPERATOR_CRD} "
                  "(shared/k8s/ beside the repository)")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return load_crd_schema(OPERATOR_CRD)
DIGITS_JOB = ROOT / "examples" / "digits.yaml"


# Hypothesis judges no example by its wall time (its default deadline is 200 ms): how long an example takes
# depends on the machine and on what else runs; hangs and exponential work are caught by cpu_bounded.
settings.register_profile("hvdk8s", deadline=None)
settings.load_profile("hvdk8s")

# How many generated inputs each fuzz target tried, accepted and refused: {target: Counter}, printed at the end
# of the session (none escaped, or a test failed).
FUZZ_TALLY: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def tally(target: str) -> collections.Counter:
    """The counts of one fuzz target: tally("job files: validate")["refused"] += 1."""
    return FUZZ_TALLY[target]


def pytest_sessionfinish(session) -> None:
    """An xdist worker hands its fuzz counts to the controller, which prints them (pytest_testnodedown)."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fuzz_tally"] = {target: dict(counts) for target, counts in FUZZ_TALLY.items()}


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_testnodedown(node, error) -> None:
    for target, counts in getattr(node, "workeroutput", {}).get("fuzz_tally", {}).items():
        FUZZ_TALLY[target].update(counts)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: tests that start ranks one at a time (tests/workgroups.py)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    import workgroups

    class ByWorkUnit(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return workgroups.work_unit(nodeid, config.rootpath)

    return ByWorkUnit(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    import workgroups

    workgroups.check(items, config.rootpath)


# CPU seconds each test phase used: this worker's and its children's (ranks, launchers, servers reaped in
# the phase; a server a session fixture keeps running counts when it stops). The suite is bound by CPU
# (docs/contributing.md), so where its CPU goes says what to cut; wall durations on a shared machine do not.
CPU_SPENT: dict[str, float] = collections.defaultdict(float)
CPU_BY_UNIT: dict[str, float] = collections.defaultdict(float)
WALL_BY_UNIT: dict[str, float] = collections.defaultdict(float)
# With HVDK8S_TEST_TIMES: each test phase's [worker, nodeid, phase, start, stop] and, at each report, the
# machine's idle and total CPU ticks (/proc/stat): where the streams left the cores idle.
TIMELINE: list[list] = []


def _cpu_ticks() -> tuple[int, int]:
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)  # idle + iowait, all


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown":  # setup, call and teardown: carried to the controller on the last report
        began = item.stash.get(_CPU_BEGAN, None)
        if began is not None:
            outcome.get_result().user_properties.append(("cpu_s", round(_cpu_seconds() - began, 2)))


_CPU_BEGAN = pytest.StashKey[float]()


def pytest_runtest_setup(item) -> None:
    item.stash[_CPU_BEGAN] = _cpu_seconds()


def pytest_runtest_logreport(report) -> None:
    """On the controller (or the one process): each test's CPU seconds (from its teardown report) and wall
    seconds (its three phases), by test and by stream."""
    import workgroups

    unit = workgroups.work_unit(report.nodeid, Path(__file__).parent.parent)
    unit = unit if unit in workgroups.STREAMS else "other"
    WALL_BY_UNIT[unit] += report.duration
    if os.environ.get("HVDK8S_TEST_TIMES"):
        TIMELINE.append([getattr(report, "worker_id", None), report.nodeid, report.when, report.start, report.stop,
                         time.time(), *_cpu_ticks()])
    spent = dict(report.user_properties).get("cpu_s") if report.when == "teardown" else None
    if spent is not None:
        CPU_SPENT[report.nodeid] += spent
        CPU_BY_UNIT[unit] += spent


def pytest_terminal_summary(terminalreporter) -> None:
    if CPU_SPENT and os.environ.get("HVDK8S_TEST_TIMES"):  # every test's CPU seconds, for a closer look
        Path(os.environ["HVDK8S_TEST_TIMES"]).write_text(json.dumps(dict(CPU_SPENT), indent=0))
        Path(os.environ["HVDK8S_TEST_TIMES"] + ".timeline").write_text(json.dumps(TIMELINE))
    if CPU_SPENT:
        terminalreporter.section("CPU seconds (this process and the ones it reaped): by stream, file, slowest 30")
        for unit in sorted(CPU_BY_UNIT, key=lambda u: -CPU_BY_UNIT[u]):
            terminalreporter.write_line(f"{unit:>18}: CPU {CPU_BY_UNIT[unit]:7.0f} s  wall {WALL_BY_UNIT[unit]:7.0f} s")
        terminalreporter.write_line(f"{'total':>18}: CPU {sum(CPU_BY_UNIT.values()):7.0f} s")
        by_file: dict[str, float] = collections.defaultdict(float)
        for nodeid, seconds in CPU_SPENT.items():
            by_file[nodeid.split("::")[0]] += seconds
        for path, seconds in sorted(by_file.items(), key=lambda kv: -kv[1])[:20]:
            terminalreporter.write_line(f"{seconds:8.1f}s {path}")
        for nodeid, seconds in sorted(CPU_SPENT.items(), key=lambda kv: -kv[1])[:30]:
            terminalreporter.write_line(f"{seconds:8.1f}s {nodeid}")
    if FUZZ_TALLY:
        terminalreporter.section("fuzz tally")
        for target, counts in sorted(FUZZ_TALLY.items()):
            terminalreporter.write_line(f"{target}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


@contextlib.contextmanager
def cpu_bounded(seconds: float, what: object = ""):
    """Fails if the block takes more than `seconds` of this thread's CPU time. For checks that an input is
    refused without an exponential walk or a huge number: CPU time, unlike wall time, does not grow when
    other work shares the cores, so the bound (set far above the milliseconds a refusal takes) holds on a
    busy machine as on an idle one."""
    began = time.thread_time()
    yield
    used = time.thread_time() - began
    assert used < seconds, f"{what} used {used:.2f} s of CPU (bound {seconds} s)"


def cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`hvdk8s ARGS` as a user runs it (a separate process, output captured)."""
    return subprocess.run([sys.executable, "-m", "hvdk8s", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")  # NaN, Infinity: Python reads them, log stacks do not


def events_of(log: str, *kinds: str) -> list[dict]:
    """What a `--log-format json` launch (or `hvdk8s logs`) wrote, read back (hvdk8s.logformat: one JSON
    record a line): rank 0's events with their fields, the ranks' other output ("output"), the job's end
    ("exit"), in order; only those of `kinds` where given. Tests read a job's progress here, not in the
    progress view's text. Any other line fails; a last line without its newline (a launch killed while it
    wrote) is not one yet."""
    found = []
    for line in log.split("\n")[:-1]:  # split("\n"), not splitlines(): U+2028 in a record ends no line
        try:
            found.append(json.loads(line, parse_constant=_not_json))
        except ValueError:
            raise AssertionError(f"not a log record: {line!r}") from None
    return [r for r in found if not kinds or r["event"] in kinds]


def check_reported_events(stdout: str, checkpoint_dir, epochs: int, keep: int = 3) -> dict:
    """A `launch --log-format json` run's records, checked for what rank 0 reports whatever the framework:
    progress within every epoch (run with HVDK8S_PROGRESS_EVERY_S=0), a checkpoint event per epoch
    naming its file, the newest `keep` of them on disk. Returns the `done` event."""
    of = {kind: events_of(stdout, kind) for kind in ("progress", "checkpoint", "done")}
    assert sorted({r["epoch"] for r in of["progress"]}) == list(range(1, epochs + 1)), of["progress"]
    assert all(0 < r["step"] < r["steps"] and r["loss"] > 0 and r["samples_per_s"] > 0 for r in of["progress"])
    assert [(r["epoch"], r["path"]) for r in of["checkpoint"]] == \
        [(e, str(Path(checkpoint_dir) / f"epoch-{e:05d}.ckpt")) for e in range(1, epochs + 1)]
    assert all(Path(r["path"]).is_file() for r in of["checkpoint"][-keep:])
    assert len(of["done"]) == 1
    return of["done"][0]


def invoke(*args: str, env: dict | None = None):
    """`hvdk8s ARGS` in this process (click's CliRunner): the real command, fast enough for many inputs.
    An exception that escaped the command (a user would see its traceback) is raised here, so the test fails
    with it; exits (0, 2, ...) come back as the result's exit_code, with stdout and stderr apart."""
    from click.testing import CliRunner

    from hvdk8s.cli import cli as command

    result = CliRunner().invoke(command, [str(a) for a in args], prog_name="hvdk8s", env=env)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def run_ranks(script: str, *args: str, np: int = 2, controller: str = "mpi", timeout: float = 300):
    """Run SCRIPT (a path, or a name in tests/ranks) on `np` real Horovod ranks; fail with their output if any rank fails."""
    from hvdk8s.launch import local

    path = Path(script) if Path(script).is_absolute() else RANK_SCRIPTS / script
    cmd = local.command([sys.executable, str(path), *map(str, args)], np, controller)
    proc = subprocess.run(cmd, env=local.environment(np), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"ranks failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def elastic_launch(job: Path, tmp_path: Path, steps: list, timeout: float = 400,
                   log_format: str = "text") -> tuple[int, str, int]:
    """`hvdk8s launch --local -np 2 JOB` over a discovery script that offers what tmp_path/hosts says (at
    first `localhost:2`). `steps`: (condition, action) pairs taken in order: once the output meets the next
    condition, its action(hosts) runs. A condition is a pattern that a line of the output matches (re.search),
    or with log_format "json" (`--log-format json`) a function of each record (events_of), true for the one
    awaited. A hang past `timeout` s kills the launch, so the test fails with the output so far. Returns (exit
    code, output, the number of steps taken); the output is stdout and stderr together, or with log_format
    "json" the records only (the launcher's stderr goes to tmp_path/launch.stderr; the exit record carries
    the failure it names)."""
    import re
    import threading

    hosts, script = tmp_path / "hosts", tmp_path / "discover.sh"
    hosts.write_text("localhost:2\n")
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    as_json = log_format == "json"
    with open(tmp_path / "launch.stderr", "w") as errors:
        proc = subprocess.Popen([sys.executable, "-m", "hvdk8s", "launch", "--local", "-np", "2", str(job),
                                 "--discovery-script", str(script), "--log-format", log_format],
                                stdout=subprocess.PIPE, stderr=errors if as_json else subprocess.STDOUT, text=True,
                                cwd=ROOT, start_new_session=True)

    def kill_all() -> None:  # the launcher and all it started (horovodrun and its ranks outlive a killed launcher)
        for pid in session_members(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill_all)
    timer.start()
    def met(line: str, condition) -> bool:
        return any(map(condition, events_of(line))) if as_json else re.search(condition, line) is not None

    lines, taken = [], 0
    try:
        for line in proc.stdout:
            lines.append(line)
            if taken < len(steps) and met(line, steps[taken][0]):
                steps[taken][1](hosts)
                taken += 1
    finally:
        timer.cancel()
    return proc.wait(), "".join(lines), taken


def session_members(session: int) -> list[int]:
    """Live processes of a session, e.g. a launcher started with start_new_session=True and everything it
    started (mpirun gives ranks process groups of their own, in its session); zombies are already dead."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[3]) == session and stat[0] != "Z":
            found.append(int(pid))
    return found


def sleepy_negotiation_library() -> Path:
    """The library pip built from hvdk8s/native/sleepy_negotiation.c (the project's set-up installs a C compiler)."""
    from hvdk8s import tuning

    found = tuning.sleepy_negotiation_library()
    assert found is not None, "pip install builds hvdk8s/native/sleepy_negotiation.c (a C compiler is needed)"
    return found


def rank_results(out_dir: Path, np: int = 2) -> list[dict]:
    return [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(np)]


@pytest.fixture
def job_file(tmp_path):
    """Write a job file from the digits example with fields changed: job_file({"training": {...}})."""

    def make(changes: dict | None = None, name: str = "job.yaml") -> Path:
        data = yaml.safe_load(DIGITS_JOB.read_text())
        for section, value in (changes or {}).items():
            if isinstance(value, dict) and isinstance(data.get(section), dict):
                data[section].update(value)
            else:
                data[section] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data))
        return path

    return make


@pytest.fixture(scope="module")
def s3_endpoint():
    """moto's S3 server on loopback (one per test module): its endpoint URL."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


# --- a real Kubernetes API server for the cluster tests (tests/cluster_helpers) --------------------

@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """The cluster the cluster tests use: the project's own (Kubernetes 1.35, the real mpi-operator and
    Kueue, kwok's nodes, all on 127.0.0.1, started once per session and stopped after it), or
    HVDK8S_TEST_KUBECONFIG's cluster (with `operator` set where a real mpi-operator runs there)."""
    import cluster_helpers as ch
    from cluster_helpers.kubelet import FakeKubelet

    external = os.environ.get("HVDK8S_TEST_KUBECONFIG")
    if external:
        other = ch.Cluster(Path(external).expanduser(), own=False)
        other.operator = ch.operator_in(other)
        yield other
        return
    kubelet = FakeKubelet()
    try:
        started = ch.own_cluster(tmp_path_factory.mktemp("k8s"), kubelet)
        try:
            yield started
        finally:
            ch.stop(started)
    finally:
        kubelet.close()


@pytest.fixture
def own_cluster(cluster):
    """The project's own cluster: for tests that stop its API server, swap its CRD, use its rights-less
    user, or end containers and write their logs through kwok's nodes."""
    if not cluster.own:
        pytest.skip("needs the project's own cluster (HVDK8S_TEST_KUBECONFIG names another cluster)")
    return cluster


@pytest.fixture
def namespace(cluster):
    """A fresh namespace for one test (made and deleted through the worker's own client: a kubectl process
    each way cost ~0.1 CPU-s)."""
    import cluster_helpers as ch
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    name = ch.unique("t")
    with cluster.api() as api:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": name}})
    yield name
    try:
        with cluster.api() as api:  # a client of its own: the test may have stopped and restarted the server
            client.CoreV1Api(api).delete_namespace(name)  # returns at once, as `kubectl delete --wait=false`
    except (ApiException, HTTPError) as e:  # a test that broke the server has its own failure to report
        print(f"namespace {name} not deleted: {e}")
