"""What `hvdk8s.torch` and `hvdk8s.tensorflow` share: the contract both honour (same verb names, same
parameters, same meaning) and the framework-free parts of those verbs.

Each adapter imports this module; this module imports no framework and no adapter.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional

from hvdk8s import metrics as _metrics, tuning
from hvdk8s.schedule import lr_scale

# Verbs (and constants) both adapters export with identical parameters; tests/test_contract.py checks it.
CONTRACT = (
    "init", "distribute", "broadcast_state", "load_checkpoint", "save_checkpoint", "scaled_learning_rate",
    "metric_average", "metric_sum", "allreduce", "log", "is_rank0", "rank", "size", "local_rank", "local_size",
    "cross_size", "resolve_compression", "Average", "Sum", "ElasticState", "run_elastic", "metrics",
)


def die_with_parent() -> None:
    """Linux: end this rank the moment the process that started it (mpirun, orted, horovodrun's
    helper) dies. mpirun puts ranks in their own process group, so a kill of the launcher's group
    would otherwise leave them running for seconds, still writing checkpoints."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the call: it will not signal us
        os._exit(137)


def start_horovod(hvd: Any, gpus: bool, **init_args: Any) -> None:
    """`hvd.init(**init_args)` (horovod.torch or horovod.tensorflow), after the tuning profile a launcher did not give
    this rank (`tuning.in_rank`; `gpus`: whether this rank sees one) is put in this process's environment,
    where MPI_Init and Horovod read it; rank 0 logs what could not be applied from here. Should the
    launcher's variables have said one rank when there are more (a launcher not in
    tuning.WORLD_SIZE_VARIABLES), say so: Horovod reads its cycle only at init, and each step would wait for it."""
    before = dict(os.environ)
    notes = tuning.in_rank(os.environ, gpus)
    hvd.init(**init_args)
    if hvd.rank() == 0:
        for line in notes:
            print(line, file=sys.stderr, flush=True)
    added = {k: v for k, v in tuning.SINGLE_RANK.items() if k not in before and os.environ.get(k) == v}
    if added and hvd.size() > 1:
        print(f"hvdk8s: started Horovod with {', '.join(f'{k}={v}' for k, v in added.items())} for a single rank, "
              f"but this job has {hvd.size()} ranks: set HOROVOD_CYCLE_TIME (Horovod's default is 1 ms) in the "
              "ranks' environment", file=sys.stderr, flush=True)


def alone(size: int) -> bool:
    """Whether a rank of a job of `size` ranks is its only rank for good: one rank, not elastic (whose
    size may grow). Such a rank's collectives have nothing to exchange."""
    return size == 1 and not tuning.elastic(os.environ)


def cpu_threads(threads_per_rank: Optional[int], local_size: int) -> int:
    """Intra-op threads for one rank on CPU: the node's cores shared among its ranks, at least one."""
    return threads_per_rank or max(1, (os.cpu_count() or 1) // max(1, local_size))


def rank0_print(rank: int, *args: Any, **kwargs: Any) -> None:
    """print() on rank 0 only, flushed at once (the launcher interleaves the ranks' output)."""
    if rank == 0:
        print(*args, **kwargs, flush=True)


def scaled_learning_rate(base: float, rule: str, ranks: int, backward_passes_per_step: int) -> float:
    return base * lr_scale(rule, ranks, backward_passes_per_step)



def metrics(rank: int, local_rank: int, local_size: int, port: Optional[int], job=None):
    """This rank's Prometheus metrics (`hvdk8s.metrics.Metrics`), served from the first call on.

    On when `port` is given, or when the job (`job`, else the one whoever started this rank named:
    `hvdk8s.metrics.job_of_process`) has them on; otherwise a Metrics that records nothing, so callers
    need not check. The job file itself is read by the rank's entry (`hvdk8s.rankmain`), not here: the
    adapters stay below the job file's floor."""
    if job is None:
        job = _metrics.job_of_process()
    if port is None:
        if job is None or not job.observability.metrics.enabled:
            return _metrics.current()
        port = job.observability.metrics.port
    return _metrics.start(job.name if job is not None else "", rank, local_rank, local_size, port)
