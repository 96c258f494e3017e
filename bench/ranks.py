"""Starting benchmark ranks: plain processes, Horovod ranks (mpirun or horovodrun, as `launch --local`
starts them) and torch.distributed ranks (torchrun, gloo), each given the same share of the cores."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from hvdk8s import tuning
from hvdk8s.launch import local, procs

STEP_RANK = "hvdk8s.bench.step_rank"
TIMEOUT = 1200


class BenchError(RuntimeError):
    pass


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
    env = local.environment(np)
    env.pop("HVDK8S_EVENTS", None)
    if mode != "hvdk8s":
        for name in (*tuning.DEFAULTS, "LD_PRELOAD"):  # back to what this process was given
            env.pop(name, None)
            if name in os.environ:
                env[name] = os.environ[name]
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
        if proc.returncode != 0 or not out.exists():
            raise BenchError(f"{mode} x{np} {module} failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        return json.loads(out.read_text())


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
        # torchrun starts each rank in a session of its own: its process group is not enough.
        for pid in [*procs.descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
