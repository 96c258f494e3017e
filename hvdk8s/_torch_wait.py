"""Waiting for Horovod handles asleep, for hvdk8s.torch's optimizers (the data-parallel one and the sharded one).

Horovod 0.28's synchronize() waits for each collective in a loop of sched_yield(): the training thread
stays runnable, a full core, while the background thread does the work. On shared cores that core is
taken from the collective itself, the peer rank and any other job (a 2-rank wait of 2 s measured 3.2
CPU-s against 2.0 with a sleeping poll). So wait here, asleep between polls, until the handles are done;
Horovod's synchronize() then finds them finished. Most waits are the last gradients' collective, a
millisecond or two, and a pause is also how late the step may resume: polled every 100 us at most
(against a 500 us cap, interleaved A/B: 0.91x the step time of a 2-rank MLP beside a second job, 0.96x
idle, 0.92-0.96x a many-small-tensor model idle, ResNet-20 level; docs/performance.md). A wait past 2 ms
is a late peer: pauses grow to 500 us, so it costs ~3% of a core (a 1.5 s wait:
`test_a_rank_waiting_for_its_peer_sleeps_instead_of_spinning`).
"""
from __future__ import annotations

import time
from typing import Iterable

import horovod.torch as hvd

_POLL_FIRST_S, _POLL_SHORT_MAX_S, _POLL_LONG_MAX_S, _SHORT_WAIT_S = 50e-6, 100e-6, 500e-6, 2e-3


def wait_asleep(handles: Iterable) -> None:
    """Return once every Horovod handle (an int; anything else is skipped) has finished."""
    began = time.perf_counter()
    for handle in handles:
        pause = _POLL_FIRST_S
        while isinstance(handle, int) and not hvd.poll(handle):
            time.sleep(pause)
            longest = _POLL_SHORT_MAX_S if time.perf_counter() - began < _SHORT_WAIT_S else _POLL_LONG_MAX_S
            pause = min(2 * pause, longest)
