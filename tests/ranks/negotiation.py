"""Runs on 2 real Horovod ranks (MPI controller); writes OUT/rank<r>.json for tests/test_sleepy_negotiation.py.

Rank 1 stops itself (SIGSTOP) so that rank 0's Horovod background thread waits for it in the per-cycle
negotiation for SECONDS; rank 0 records its own CPU time meanwhile (its training thread sleeps), then
resumes rank 1. Then Open MPI's MPI_Allreduce as every caller in the process finds it (the preloaded one
where hvdk8s preloads it) with MPI_BAND, MPI_BOR and MPI_SUM on 64-bit integers."""
import ctypes
import json
import os
import resource
import signal
import sys
import threading
import time
from pathlib import Path

import horovod.torch as hvd
import torch

out_dir, seconds = Path(sys.argv[1]), float(sys.argv[2])
hvd.init()
rank = hvd.rank()
pids = hvd.allgather_object(os.getpid(), name="pids")  # one machine: rank 0 can signal rank 1
cpu_s = slept = None


def sleeps() -> int:
    """Voluntary context switches of every thread but this one: each time a thread blocked (a nanosleep, a
    wait). A thread that polls with sched_yield is switched out involuntarily, if at all."""
    me = str(threading.get_native_id())
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if tid != me:
            with open(f"/proc/self/task/{tid}/status") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches"))
    return total


if rank == 1:
    os.kill(os.getpid(), signal.SIGSTOP)  # until rank 0 sends SIGCONT
else:
    while open(f"/proc/{pids[1]}/stat").read().rsplit(")", 1)[1].split()[0] != "T":
        time.sleep(0.01)
    before, slept = resource.getrusage(resource.RUSAGE_SELF), sleeps()
    time.sleep(seconds)  # the background thread waits for the stopped peer meanwhile
    after, slept = resource.getrusage(resource.RUSAGE_SELF), sleeps() - slept
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    os.kill(pids[1], signal.SIGCONT)

process = ctypes.CDLL(None)  # the global scope: LD_PRELOAD first, then Open MPI (Horovod loads it RTLD_GLOBAL)


def predefined(name: str) -> ctypes.c_void_p:
    """An Open MPI predefined handle (MPI_COMM_WORLD, MPI_BAND, ...): the address of its global object."""
    return ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(process, name)))


IN_PLACE = ctypes.c_void_p(1)  # MPI_IN_PLACE in Open MPI


def allreduce(values: list[int], op: str) -> list[int]:
    buffer = (ctypes.c_longlong * len(values))(*values)
    rc = process.MPI_Allreduce(IN_PLACE, buffer, len(values), predefined("ompi_mpi_long_long_int"),
                               predefined(op), predefined("ompi_mpi_comm_world"))
    assert rc == 0, rc
    return list(buffer)


mine = [0b1010 | (1 << (4 + rank)), -1, 1 << (20 + rank), 0]
result = {"cpu_s": cpu_s, "sleeps": slept, "wall_s": seconds, "and": allreduce(mine, "ompi_mpi_op_band"),
          "or": allreduce(mine, "ompi_mpi_op_bor"), "sum": allreduce([rank + 1, 10], "ompi_mpi_op_sum")}
hvd.allreduce(torch.zeros(1), name="done")
(out_dir / f"rank{rank}.json").write_text(json.dumps(result))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
