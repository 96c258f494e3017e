"""Run a job's own script or module as a rank's `__main__`, its stdout written a whole line at a time.

Why: mpirun forwards each rank's output in the chunks the rank writes, and `--tag-output` tags each
chunk. Unbuffered Python (`-u`, PYTHONUNBUFFERED) writes `print`'s text and its newline separately, so
two ranks' lines interleave mid-line; block buffering instead holds output back until exit. A
line-buffered stdout is both live and whole.

The rank also dies with the process that started it from its first line on (`die_with_parent`), not
only once the script calls `hvdk8s.torch.init()` or `hvdk8s.tensorflow.init()`, which may be never.

    python -m hvdk8s.rankmain --script PATH [ARGS...]
    python -m hvdk8s.rankmain --module NAME [ARGS...]
"""
from __future__ import annotations

import os
import runpy
import sys

from hvdk8s import metrics
from hvdk8s._adapter import die_with_parent  # framework-free: no torch or tensorflow import here
from hvdk8s.failures import report_uncaught


def line_buffered_stdout() -> None:
    """One write per line on stdout and stderr from here on, PYTHONUNBUFFERED or not (which the launchers
    set so that processes a rank starts stay live). stderr too: an unbuffered print(..., file=sys.stderr)
    writes its text and its newline apart, and another rank's line landed between them."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # absent where a stream was replaced
        if reconfigure is not None:
            reconfigure(line_buffering=True, write_through=False)  # also under PYTHONUNBUFFERED


def main(argv: list[str]) -> None:
    die_with_parent()  # before the user's code: a script that never calls init() must not outlive its launcher
    if len(argv) < 2 or argv[0] not in ("--script", "--module"):
        sys.exit("usage: python -m hvdk8s.rankmain --script PATH | --module NAME [ARGS...]")
    kind, target, args = argv[0], argv[1], argv[2:]
    line_buffered_stdout()
    from hvdk8s.runfiles import make_dirs  # after die_with_parent: it imports the job schema
    from hvdk8s.spec import JOB_ENV, current_job

    report_uncaught()  # the script's failure as an event, before Horovod's shutdown tells the other ranks
    # The script's metrics() (hvdk8s.torch, hvdk8s.tensorflow) follow the job's observability.metrics: this
    # entry names the job for them, read only if asked for, as the adapters read no job file.
    metrics.rank_of(lambda: current_job() if os.environ.get(JOB_ENV) else None)

    make_dirs()  # the run directory, before the script's hvd.init() opens Horovod's timeline and autotune log
    if kind == "--module":
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))  # as `python PATH` sets it
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
