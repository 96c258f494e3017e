"""Starting benchmark ranks: plain processes, Horovod ranks (mpirun or horovodrun, as `launch --local`
starts them) and torch.distributed ranks (torchrun, gloo), each given the same share of the cores."""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from hvdk8s.bench.core import BenchError
from hvdk8s.launch import local, procs

STEP_RANK = "hvdk8s.bench.step_rank"
TIMEOUT = 1200


def _argv(program: list[str], mode: str, np: int, controller: str = local.DEFAULT_CONTROLLER,
          launcher: Optional[bool] = None) -> list[str]:
    """How `np` ranks of `mode` start. launcher: through `launch --local`'s command line (default for
    Horovod modes), or as a plain process (default for `plain`; one rank only)."""
    if mode == "ddp":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={np}",
                *program[1:]]  # torchrun takes `-m module` itself
    if mode in ("hvdk8s", "horovod") if launcher is None else launcher:
        return local.command(program, np, controller)
    if np != 1:
        raise BenchError(f"mode {mode} without a launcher runs one process, not {np}")
    return program


def rank_env(np: int, extra: Optional[dict], mode: str = "hvdk8s") -> dict:
    """The environment `launch --local` gives ranks; without hvdk8s's tuning for the peers (raw Horovod
    runs with OpenMPI's and Horovod's own defaults, as a user of horovodrun gets them)."""
    env = local.environment(np, profile="auto" if mode == "hvdk8s" else "none")
    env.pop("HVDK8S_EVENTS", None)
    for name, value in (extra or {}).items():
        if value is None:
            env.pop(name, None)  # unset: e.g. Horovod's own default instead of hvdk8s's
        else:
            env[name] = value
    return env


def run_json(module: str, config: dict, mode: str, np: int, env: Optional[dict] = None,
             controller: str = local.DEFAULT_CONTROLLER, launcher: Optional[bool] = None) -> dict:
    """Run `python -m module CONFIG` as `np` ranks of `mode`; the JSON rank 0 wrote to config['out']."""
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-") as tmp:
        out = Path(tmp) / "result.json"
        program = [sys.executable, "-m", module, json.dumps({**config, "out": str(out)})]
        proc = subprocess.run(_argv(program, mode, np, controller, launcher), env=rank_env(np, env, mode),
                              capture_output=True, text=True, timeout=TIMEOUT)
        if proc.returncode != 0 and out.exists() and _aborted_at_exit(proc, mode):
            print(f"  ({mode} x{np}: a gloo rank aborted at exit after the result was written; result kept)",
                  file=sys.stderr, flush=True)
        elif proc.returncode != 0 or not out.exists():
            # stderr too: torchrun (ddp) and a rank's traceback write there, not to stdout
            raise BenchError(f"{mode} x{np} {module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def _aborted_at_exit(proc: subprocess.CompletedProcess, mode: str) -> bool:
    """Whether a torchrun's only failure is a gloo rank's abort as it exited (the ranks write their result
    after the last barrier, so the measurement is whole): a rare flake that otherwise ends an hour-long
    `hvdk8s bench` (2026-12-04: a full run's `peers` ended so after 16 minutes, Mode.close notwithstanding)."""
    return mode == "ddp" and "terminate called without an active exception" in proc.stderr


def step_seconds(config: dict, mode: str, np: int, env: Optional[dict] = None,
                 controller: str = local.DEFAULT_CONTROLLER, launcher: Optional[bool] = None) -> float:
    return run_json(STEP_RANK, {**config, "mode": mode}, mode, np, env, controller, launcher)["seconds_per_step"]


@contextlib.contextmanager
def contending_job(model: str = "mlp", np: int = 2):
    """A second 2-rank job (torch DDP, training until stopped) beside whatever runs inside."""
    program = [sys.executable, "-m", STEP_RANK,
               json.dumps({"mode": "ddp", "model": model, "batch": 32, "steps": 0, "forever": True, "out": ""})]
    env = rank_env(np, None, "ddp")
    proc = subprocess.Popen(_argv(program, "ddp", np), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        kill_tree(proc)


def taking_turns(configs: dict[str, tuple[str, Optional[dict], bool]], config: dict, turns: int,
                 steps_per_turn: int) -> dict[str, list[float]]:
    """{name: [seconds per step, one per turn]} of one single-rank process per configuration (name:
    (mode, extra env, launcher)), all training config's model at once but taking turns: one runs
    `steps_per_turn` steps while the others wait blocked on a pipe, the order rotating every turn.
    A shared machine's speed drifts by 10-40% within minutes here, so one run after another (`interleaved`)
    cannot resolve a 2% difference; turns a second apart can. A waiting process's background threads
    still wake (Horovod's cycle, 50 times a second at one rank) and cost the others what they cost it."""
    with tempfile.TemporaryDirectory(prefix="hvdk8s-turns-") as tmp, contextlib.ExitStack() as stack:
        started = {}
        for i, (name, (mode, env, launcher)) in enumerate(configs.items()):
            go, done = Path(tmp) / f"go{i}", Path(tmp) / f"done{i}"
            os.mkfifo(go)
            os.mkfifo(done)
            program = [sys.executable, "-m", STEP_RANK, json.dumps(
                {**config, "mode": mode, "steps": steps_per_turn, "turns": {"go": str(go), "done": str(done)}})]
            log = stack.enter_context(open(Path(tmp) / f"log{i}", "w+"))
            proc = subprocess.Popen(_argv(program, mode, 1, launcher=launcher), env=rank_env(1, env, mode),
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            stack.callback(kill_tree, proc)
            started[name] = _Turns(proc, log, go, done)
        for name, one in started.items():  # every process warmed up and waiting before the first turn
            one.connect(name)
        samples: dict[str, list[float]] = {name: [] for name in configs}
        names = list(configs)
        for turn in range(turns):
            for name in names[turn % len(names):] + names[:turn % len(names)]:
                samples[name].append(started[name].take(name))
        for one in started.values():
            one.finish()
        return samples


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a process that is still running and everything it started: torchrun and mpirun start ranks
    in sessions or process groups of their own, so its process group is not enough."""
    for pid in [*procs.descendants(proc.pid), proc.pid] if proc.poll() is None else []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


class _Turns:
    """The parent's end of one process's pipes (`taking_turns`); every wait bounded, and a process that
    ends early is reported with its output."""

    def __init__(self, proc: subprocess.Popen, log, go: Path, done: Path):
        self.proc, self.log, self.go_path, self.done_path = proc, log, go, done
        self.go: Optional[int] = None
        self.done: Optional[int] = None
        self.buffer = b""

    def _check(self, name: str, deadline: float) -> None:
        if self.proc.poll() is not None or time.monotonic() > deadline:
            self.log.seek(0)
            why = "ended" if self.proc.poll() is not None else "did not answer"
            raise BenchError(f"turn-taking {name} {why} ({self.proc.returncode}):\n{self.log.read()[-3000:]}")

    def connect(self, name: str) -> None:
        """Wait for the rank to open its end of `go` (after its warm-up steps), then open `done`."""
        deadline = time.monotonic() + TIMEOUT
        while self.go is None:
            try:
                self.go = os.open(self.go_path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: nobody reads yet
                self._check(name, deadline)
                time.sleep(0.05)
        self.done = os.open(self.done_path, os.O_RDONLY | os.O_NONBLOCK)

    def take(self, name: str) -> float:
        deadline = time.monotonic() + TIMEOUT
        os.write(self.go, b"go\n")
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.done], [], [], 0.5)
            read = os.read(self.done, 4096) if ready else b""
            self.buffer += read
            if not read:
                self._check(name, deadline)
        line, self.buffer = self.buffer.split(b"\n", 1)
        return float(line)

    def finish(self) -> None:
        if self.go is not None:
            os.close(self.go)  # the rank's loop ends, and the process with it
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pass  # kill_tree kills it
        if self.done is not None:
            os.close(self.done)
