"""`hvdk8s launch --local`: N ranks of `hvdk8s train` (or the job's own entrypoint) on this machine,
through mpirun (the MPI controller) or horovodrun (Gloo, elastic).

The MPI controller's ranks are started by mpirun directly, with the command line horovodrun would give
it. horovodrun first checks that Horovod was built with MPI by importing `horovod.tensorflow` (all of
TensorFlow, even for a PyTorch job) in a forked process: 5 s of every launch on an idle 2-core machine,
11 s beside another job (`horovodrun -np 2 -H localhost:2 --mpi true` against 0.1 s for mpirun). Gloo
and elastic runs need horovodrun's rendezvous and driver, and pay that check.

The ranks get the job one way, as on a cluster: the validated job with every default filled in, in a
file that JOB_ENV names (a cluster mounts the same text from the job's ConfigMap), never the user's
file re-read and `--set` re-applied by each rank.

The controller defaults to MPI: on 2 CPU ranks Gloo took 1.64x as long per step
(`hvdk8s bench --only knobs`; about 1.5x in earlier measurements by hand). Rank 0's events are drawn as progress; other output passes through.
With `--log-format json`, all of it is logged as JSON lines instead (`hvdk8s.logformat`).
"""
from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from hvdk8s import events, failures, logformat, metrics, tuning
from hvdk8s.core.errors import UserError
from hvdk8s.core.termination import stopped_by_signals
from hvdk8s.entrypoint import local_argv
from hvdk8s.faults import stall_env
from hvdk8s.gloo import GLOO_TIMEOUT_SECONDS
from hvdk8s.launch import procs
from hvdk8s.launch.base import FAILED, RUNNING, SUCCEEDED, JobStatus, WaitTimeout
from hvdk8s.launch.progress import ProgressView
from hvdk8s.preflight import check_checkpoint_dir, check_metrics_ports
from hvdk8s.runfiles import horovod_env
from hvdk8s.spec import JOB_ENV, dump_job, with_backend_defaults

CONTROLLERS = ("mpi", "gloo")
DEFAULT_CONTROLLER = "mpi"


class LaunchError(UserError):
    """The ranks could not be started (missing tool, bad arguments)."""

    def __init__(self, message: str):
        super().__init__(message)


def horovodrun() -> list[str]:
    """horovodrun on this interpreter: Horovod's command line behind `hvdk8s.launch.horovodrun`, whose main
    module makes each discovery poll of an elastic job a third as costly."""
    import importlib.util

    if importlib.util.find_spec("horovod") is None:
        raise LaunchError(f"horovodrun not found: Horovod is not installed for {sys.executable} "
                          "(bash scripts/setup.sh installs it), or activate its venv")
    return [sys.executable, "-m", "hvdk8s.launch.horovodrun"]


@dataclass(frozen=True)
class Elastic:
    """horovodrun's elastic mode: between min_np and max_np ranks, on the hosts and slots that the
    discovery script prints (`host:slots` lines), read again every second."""

    min_np: int
    max_np: int
    discovery_script: Path


def mpirun() -> str:
    found = shutil.which("mpirun")
    if not found:
        raise LaunchError("mpirun not found: install OpenMPI (bash scripts/setup.sh does), or use --gloo")
    return found


def command(program: Sequence[str], np: int, controller: str = DEFAULT_CONTROLLER,
            elastic: Optional[Elastic] = None) -> list[str]:
    """The command line that starts `np` ranks of `program` (argv) on this machine."""
    if controller not in CONTROLLERS:
        raise LaunchError(f"controller must be one of {', '.join(CONTROLLERS)}, got {controller!r}")
    if np < 1:
        raise LaunchError(f"-np must be at least 1, got {np}")
    if elastic is None and controller == "mpi":
        # What horovodrun 0.28.1 runs for `-np N -H localhost:N --mpi` (its --verbose output), less the -x
        # of every variable: ranks on this machine inherit mpirun's environment.
        return [mpirun(), "--tag-output", "-np", str(np), "-H", f"localhost:{np}", "-bind-to", "none",
                "-map-by", "slot", "-mca", "pml", "ob1", "-mca", "btl", "^openib", "-mca", "btl_tcp_if_include",
                "lo", "-x", "NCCL_SOCKET_IFNAME=lo", *program]
    if elastic is None:
        return [*horovodrun(), "-np", str(np), "-H", f"localhost:{np}", f"--{controller}", *program]
    # Elastic Horovod runs on Gloo only. On one machine Gloo must be told the loopback interface: without
    # it, it hung in interface discovery (measured here, 60 s until killed).
    return [*horovodrun(), "-np", str(np), "--min-np", str(elastic.min_np), "--max-np", str(elastic.max_np),
            "--host-discovery-script", str(elastic.discovery_script), "--gloo", "--network-interfaces", "lo",
            "--gloo-timeout-seconds", str(GLOO_TIMEOUT_SECONDS), *program]


# What an MPI process's own job puts in its environment (Open MPI 4.1's singleton init, as Horovod's init in a
# process started on its own does: PMIx's server and namespace, the ess/pmix components of that job). A
# launch from such a process (a notebook that ran hvd.init(), then `hvdk8s launch`) inherits them, and its
# mpirun then ended at once with status 1 and no word: they belong to that job, never to a new one.
_MPI_JOB_VARIABLES = frozenset({"OMPI_MCA_ess", "OMPI_MCA_pmix", "OMPI_MCA_orte_launch", "OMPI_MCA_orte_ess_num_procs",
                                "OMPI_MCA_orte_precondition_transports", "OMPI_APP_CTX_NUM_PROCS",
                                "ORTE_SCHIZO_DETECTION"})


def _inherited_mpi_job(name: str) -> bool:
    return name.startswith("PMIX_") or name in _MPI_JOB_VARIABLES


def check_np(spec, np: int) -> None:
    """An elastic job's -np must lie within its bounds (a local worker is one rank)."""
    e = spec.training.elastic
    if e is not None and not e.min_workers <= np <= e.max_workers:
        raise LaunchError(f"-np {np}: training.elastic runs {e.min_workers} to {e.max_workers} workers "
                          "(a local worker is one rank)")


def local_discovery_script(directory: Path, np: int) -> Path:
    """A discovery script that always offers this machine with `np` slots."""
    script = Path(directory) / "discover_hosts.sh"
    script.write_text(f"#!/bin/sh\necho localhost:{np}\n", encoding="utf-8")
    script.chmod(0o755)
    return script


def check_discovery_script(path: Path) -> Optional[str]:
    """Why `path` cannot be a discovery script, or None."""
    if not path.is_file():
        return f"{path}: no such file"
    if not os.access(path, os.X_OK):
        return f"{path}: not executable (chmod +x)"
    return None


def rank_program(spec, job_file: Path, job_dir: Path, source: str, resume: bool = True) -> list[str]:
    """argv of one rank: `hvdk8s train` over the written job, or the job's own entrypoint."""
    if spec.entrypoint is not None:
        return local_argv(spec, job_dir, source)
    return [sys.executable, "-m", "hvdk8s", "train", str(job_file), *([] if resume else ["--no-resume"])]


def environment(np: int, base: Optional[dict] = None, job_file: Optional[Path] = None,
                job_dir: Optional[Path] = None, stall_timeout: Optional[int] = None, profile: str = "auto",
                elastic: bool = False) -> dict[str, str]:
    """The ranks' environment: one share of the cores each, MPI allowed as root, events as JSON, the
    job file, the job file's folder importable (for `factory` paths and scripts' own modules), the
    bound on a hung rank, and the tuning `profile` (the job's resources.tuning) for `np` ranks here."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not _inherited_mpi_job(k)}
    placement = tuning.Placement(ranks=np, gpus=tuning.gpus_visible(env), elastic=elastic,
                                 library=tuning.local_library(), rules=tuning.local_rules())
    profile_env = tuning.profile_env(profile, placement, env)
    env.update(stall_env(stall_timeout))
    if job_file is not None:
        env[JOB_ENV] = str(job_file)
    if job_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(job_dir).resolve()), env.get("PYTHONPATH")) if p)
    cores = os.cpu_count() or 1
    env.update({
        "OMP_NUM_THREADS": str(max(1, cores // np)),
        # Containers and CI run as root; OpenMPI refuses that unless told.
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # More ranks than cores is fine for a local run (slower, not wrong).
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        "PYTHONUNBUFFERED": "1",
        "HVDK8S_EVENTS": "json",
        "TF_CPP_MIN_LOG_LEVEL": env.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    })
    env.update(profile_env)  # computed from the environment the caller gave, as the renderer does from the job's
    return env


def prepare_dataset(spec):
    """Sync a cached dataset into this machine's cache before the ranks start (once; reused later).

    Returns the sync's hold on the dataset (None without one), taken before the sync let go of it, so
    that an eviction between the sync and the ranks' own holds cannot remove it. It lasts until
    `release()` or this process's exit, never garbage collection: the launcher outlives its ranks."""
    dataset = spec.cached_dataset
    if dataset is None:
        return None
    # Here: a launch without a cached dataset need not load the cache (rich) and numpy, ~0.1 s.
    from hvdk8s.data import cache
    from hvdk8s.data.datasets import cache_root, storage_options

    return cache.sync(dataset.path, cache_root(), version=dataset.version, storage_options=storage_options(dataset),
                      progress=True, keep_hold=True).hold


def preflight(spec, np: int, source: str) -> None:
    """What would fail the ranks after they started, checked before any starts (UserError naming the field):
    -np within an elastic job's bounds (before a dataset sync, not after it), a writable checkpoint
    directory, free metrics ports; then a cached dataset synced here."""
    from hvdk8s.data.cache import CacheError  # the cache loads rich: only where a dataset is synced

    check_np(spec, np)
    check_checkpoint_dir(spec, source)
    check_metrics_ports(spec, np, source)
    try:
        prepare_dataset(spec)
    except CacheError as e:
        raise UserError(f"{source}: the dataset could not be synced", [("dataset.path", str(e))]) from None


def run(spec, job_dir: Path, source: str, np: int, controller: str = DEFAULT_CONTROLLER, resume: bool = True,
        console=None, discovery_script: Optional[Path] = None,
        log_format: str = logformat.DEFAULT_FORMAT) -> tuple[int, Optional[failures.Failure]]:
    """Start the ranks on the validated `spec` (from the job file `source` in `job_dir`), draw rank 0's
    progress (or log it, with log_format "json"), and return their exit status and, if they failed, the
    rank that failed first. Ctrl-C, SIGTERM or SIGHUP stops the ranks, then raises KeyboardInterrupt."""
    view = view_for(log_format, spec.name, console)
    launcher = LocalLauncher(np, controller, resume, discovery_script)
    # The trainer's rank 0 reports at least every few seconds while it trains; scripts need not.
    watchdog = spec.training.stall_timeout_seconds if spec.entrypoint is None else None
    first = failures.FirstFailure()
    with stopped_by_signals():  # a `kill` of the launch raises KeyboardInterrupt here, as Ctrl-C does
        try:
            launcher.submit(spec, job_dir, source)
            code = _follow(launcher.proc, launcher.token, view, watchdog, first)
        finally:
            launcher.close()  # ends ranks still running (stopped, or an error here); removes the job file
    failed = first.first() if code else None
    view.exit(code, SUCCEEDED if code == 0 else FAILED, failed.summary() if failed else "")
    return code, failed


def view_for(log_format: str, job: str, console=None):
    """What shows a job's events and output: the progress view for people, JSON lines for log stacks."""
    if log_format == "json":
        return logformat.JsonLog(job)
    from rich.console import Console

    return ProgressView(console or Console())


class LocalLauncher:
    """The launcher protocol (`hvdk8s.launch.base.Launcher`) on this machine: one job, its ranks under
    mpirun or horovodrun. `run` is submit, the progress view over `logs`, and the exit status, in the foreground."""

    def __init__(self, np: int, controller: str = DEFAULT_CONTROLLER, resume: bool = True,
                 discovery_script: Optional[Path] = None):
        self.np, self.controller, self.resume = np, controller, resume
        self.discovery_script = discovery_script  # elastic jobs: default, this machine with np slots
        self.token = events.new_token()  # rank 0's events carry it: other output cannot pose as one
        self.proc: Optional[subprocess.Popen] = None
        self.name: Optional[str] = None
        self._tmp: Optional[tempfile.TemporaryDirectory] = None

    def submit(self, spec, job_dir: Path, source: str) -> str:
        """The preflight, then the ranks started; returns the job's name."""
        if self.proc is not None:
            raise LaunchError(f"this launcher already runs job {self.name}")
        preflight(spec, self.np, source)
        self._tmp = tempfile.TemporaryDirectory(prefix="hvdk8s-job-")
        job_file = Path(self._tmp.name) / "job.yaml"
        spec = with_backend_defaults(spec, cluster=False)  # what the ranks see: metrics off unless asked for
        job_file.write_text(dump_job(spec), encoding="utf-8")
        elastic = None
        if spec.training.elastic is not None:
            script = self.discovery_script or local_discovery_script(Path(self._tmp.name), self.np)
            elastic = Elastic(spec.training.elastic.min_workers, spec.training.elastic.max_workers, script)
        cmd = command(rank_program(spec, job_file, job_dir, source, self.resume), self.np, self.controller, elastic)
        env = environment(self.np, job_file=job_file, job_dir=job_dir,
                          stall_timeout=spec.training.stall_timeout_seconds, profile=spec.resources.tuning,
                          elastic=elastic is not None)
        env[events.TOKEN_ENV] = self.token
        env.update(horovod_env(spec))
        env[metrics.ADDRESS_ENV] = "127.0.0.1"  # a local job's metrics stay on this machine
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", bufsize=1)  # ranks may print any bytes
        self.name = spec.name
        return spec.name

    def _job(self, name: str) -> subprocess.Popen:
        if self.proc is None or name != self.name:
            raise LaunchError(f"no local job {name} runs from this launcher")
        return self.proc

    def status(self, name: str):
        code = self._job(name).poll()
        return JobStatus(name=name, phase=RUNNING if code is None else SUCCEEDED if code == 0 else FAILED,
                         exit_code=code)

    def logs(self, name: str, follow: bool = True):
        """The ranks' combined output as it comes (a pipe: read once, and only followed)."""
        for line in self._job(name).stdout:
            yield line.rstrip("\n")

    def wait(self, name: str, timeout: Optional[float] = None, on_change=None):
        try:
            self._job(name).wait(timeout)
        except subprocess.TimeoutExpired:
            raise WaitTimeout(f"local job {name} still runs after {timeout:g}s") from None
        self._remove_job_file()
        status = self.status(name)
        if on_change:
            on_change(status)
        return status

    def delete(self, name: str) -> list[str]:
        self._job(name)
        return [f"ranks of {name}"] if self.close() else []

    def close(self) -> bool:
        """End the ranks if they still run (True if they did) and remove the job file; whatever part of
        `submit` happened."""
        stopped = self.proc is not None and self.proc.poll() is None
        if stopped:
            self.proc.terminate()
            self.proc.wait()
        self._remove_job_file()
        return stopped

    def _remove_job_file(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def _follow(proc: subprocess.Popen, token: str, view, watchdog: Optional[int] = None,
            first: Optional[failures.FirstFailure] = None) -> int:
    """Draw rank 0's events from the running ranks `proc`, each line read by `first` too; with `watchdog`,
    end the job when no event arrives for that many seconds once training started (a hung rank blocks
    rank 0 in a collective, and a frozen rank also blocks Horovod's own stall check, which runs between
    collectives)."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [*map(lines.put, proc.stdout), lines.put(None)], daemon=True).start()
    launcher_errors = _LauncherTraceback()
    last_event, cpu = None, _RankCPU(proc.pid)
    try:
        while True:
            try:
                line = lines.get(timeout=1.0)
            except queue.Empty:
                if watchdog and last_event is not None and time.monotonic() - last_event > watchdog:
                    view.close()
                    return _stop_hung(proc, watchdog, cpu.idle_ranks(), view)
                cpu.sample()
                continue
            if line is None:
                return proc.wait()
            event = events.parse(line, token)
            if first is not None:
                first.feed(line, event)
            if event is not None:
                last_event = time.monotonic()
                view.show(event)
            elif not launcher_errors.swallow(line):
                view.passthrough(line.rstrip("\n"))
    finally:
        view.close()


class _RankCPU:
    """CPU time per rank, sampled each quiet second: a rank that used none in the last one is the
    likely hung one (the others spin in MPI's busy poll waiting for it)."""

    def __init__(self, root: int):
        self.root, self.seen = root, {}

    def sample(self) -> None:
        self.seen = {r: procs.cpu_seconds(p) for r, p in procs.ranks(self.root).items()}

    def idle_ranks(self) -> list[int]:
        now = {r: procs.cpu_seconds(p) for r, p in procs.ranks(self.root).items()}
        moved = {r: (now.get(r) or 0.0) - (self.seen.get(r) or 0.0) for r in now}
        self.seen = now
        busiest = max(moved.values(), default=0.0)
        return sorted(r for r, used in moved.items() if used < 0.05 * busiest or used < 0.01)


def _stop_hung(proc: subprocess.Popen, watchdog: int, idle: list[int], view) -> int:
    who = f"rank {', '.join(map(str, idle))} made no progress" if idle else "no rank could be singled out"
    view.fail(f"no progress from the ranks for {watchdog}s ({who}); stopping the job "
              "(training.stall_timeout_seconds)")
    for pid in procs.descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    return 124


class _LauncherTraceback:
    """horovodrun's own Python traceback (with --gloo, when a rank dies) is noise to a user: keep its
    closing exception lines, which name the rank and its exit code, and drop the frames. Ranks'
    output is tagged (`[1,0]<stderr>:` under MPI, `[1]<stderr>:` under Gloo) and always passes."""

    def __init__(self):
        self.inside = False

    def swallow(self, line: str) -> bool:
        if line.startswith("["):
            self.inside = False
            return False
        if line.startswith("Traceback (most recent call last):"):
            self.inside = True
            return True
        if self.inside and line.startswith((" ", "\t")):
            return True  # a frame
        self.inside = False
        return False
