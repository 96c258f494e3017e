"""A script job's rank (run by tests/test_tuning_profile.py): writes OUT/rank<r>.json with the tuning
variables of its environment as the launcher gave it, and as they are after hvdk8s.torch's init (which may
add the profile itself where no hvdk8s launcher did)."""
import json
import os
import sys
from pathlib import Path

from hvdk8s import tuning

NAMES = (tuning.PROFILE_ENV, *tuning.SHARED_CPU_VARIABLES)


def tuning_vars() -> dict:
    return {name: os.environ[name] for name in NAMES if name in os.environ}


given = tuning_vars()
import hvdk8s.torch as ht  # noqa: E402

ht.init()
(Path(sys.argv[1]) / f"rank{ht.rank()}.json").write_text(json.dumps({"given": given, "after_init": tuning_vars()}))

from hvdk8s.core.exiting import exit_at_once  # noqa: E402

exit_at_once(0)  # as hvdk8s's own ranks end: after the exit handlers (Horovod's shutdown), no teardown (~0.8 CPU-s)
