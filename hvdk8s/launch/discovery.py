"""The host discovery an elastic job's launcher gives horovodrun on a cluster:
`python -m hvdk8s.launch.discovery --port 2222 --slots N [SCRIPT]`.

mpi-operator v0.8.2 keeps `/etc/mpi/discover_hosts.sh` up to date with one `echo` per Running worker
pod. Running is not reachable: a worker's DNS name resolves only once its pod is Ready (the job's
Service does not publish not-ready addresses), and its sshd may not listen yet, so a host straight from
that script can fail horovodrun's ssh and be dropped from the job. This runs the operator's script and
prints `host:slots` only for the hosts whose name resolves and whose sshd answers now (probed in
parallel, each within --probe-timeout seconds; horovodrun asks again every second). It exits non-zero
only when the operator's script fails, and then says why on stderr.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from typing import Optional, Sequence

from hvdk8s.launch.workers import hosts_from_hostfile, wait_for

OPERATOR_SCRIPT = "/etc/mpi/discover_hosts.sh"


def reachable(hosts: Sequence[str], port: int, timeout: float) -> list[str]:
    """HOSTS (in their order, once each) whose name resolves and whose sshd answers on PORT within TIMEOUT."""
    missing = wait_for(hosts, port, timeout, probe_timeout=timeout)
    return [h for h in dict.fromkeys(hosts) if h not in missing]


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hvdk8s.launch.discovery", description=__doc__.split("\n\n")[0])
    parser.add_argument("script", nargs="?", default=OPERATOR_SCRIPT, help="the operator's discovery script")
    parser.add_argument("--port", type=int, default=2222, help="the workers' sshd port")
    parser.add_argument("--slots", type=int, required=True, help="ranks per worker (the MPIJob's slotsPerWorker)")
    parser.add_argument("--probe-timeout", type=float, default=2.0)
    args = parser.parse_args(argv)
    try:
        out = subprocess.run([args.script], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        sys.exit(f"hvdk8s: the discovery script {args.script} did not run: {e}")
    if out.returncode != 0:
        sys.exit(f"hvdk8s: the discovery script {args.script} exited with {out.returncode}: {out.stderr.strip()[:500]}")
    for host in reachable(hosts_from_hostfile(out.stdout), args.port, args.probe_timeout):
        print(f"{host}:{args.slots}")


if __name__ == "__main__":
    main()
