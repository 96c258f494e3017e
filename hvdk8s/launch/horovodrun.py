"""horovodrun as `python -m hvdk8s.launch.horovodrun ARGS`: Horovod's own command line (the same
arguments, the same run), from a main module that imports nothing until it runs.

An elastic job's horovodrun runs the discovery script every second, each time through a middleman process
that Horovod starts with multiprocessing's spawn (`safe_shell_exec.execute`), and a spawned process first
imports its parent's main module. Horovod's `horovodrun` script imports all of `horovod.runner` there: 0.19
CPU-s a poll (measured here, 10 polls, twice), a fifth of a core for the job's whole life on its launcher;
from this module 0.065. Ranks started by Gloo go through the same middleman."""
from __future__ import annotations


def main() -> None:
    from horovod.runner.launch import run_commandline  # here, not above: a spawned middleman imports this module

    run_commandline()


if __name__ == "__main__":
    main()
