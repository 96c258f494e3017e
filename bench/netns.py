"""An emulated cluster network on this machine: "nodes" as network namespaces, each joined to a bridge by
a veth pair whose two ends are shaped to a link rate with tc's token bucket (tbf), on a private /24 that
routes nowhere. Ranks start in them through mpirun's rsh agent (`agent_script`), which enters the node's
namespace (and a UTS namespace named after it) instead of ssh'ing to a host.

Needs root and iproute2. This kernel has tbf but not netem, so links get a rate, not a delay: what is
emulated is bandwidth (the cost that grows with gradient size), not latency.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from hvdk8s.bench.core import BenchError

SUBNET = "10.77.{id}.0/24"


@dataclass
class Node:
    name: str        # the network namespace (and the hostname its ranks see)
    address: str     # its address on the emulated network
    veth: str        # the bridge's end of its link


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise BenchError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
    return proc


def _tc(*args: str) -> None:
    proc = subprocess.run(["tc", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"tc {' '.join(args)}: {proc.stderr.strip()}")


def missing() -> Optional[str]:
    """Why the emulated network cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"needs {tool} (iproute2, util-linux)"
    return None


def shape(nodes: list[Node], gbit: Optional[float]) -> None:
    """Every link at `gbit` Gbit/s each way (None: unshaped, as fast as the veth copies)."""
    for node in nodes:
        for where, dev in (([], node.veth), (["-n", node.name], "eth0")):  # both directions
            subprocess.run(["tc", *where, "qdisc", "del", "dev", dev, "root"], capture_output=True)
            if gbit is not None:
                # burst: 4 ms of the rate (at least 64 KiB), so that the bucket does not starve the sender
                burst = max(64 << 10, int(gbit * 1e9 / 8 * 0.004))
                _tc(*where, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{gbit * 1000:g}mbit",
                    "burst", str(burst), "latency", "50ms")


_sets = itertools.count()


@contextlib.contextmanager
def emulated_nodes(count: int, tag: Optional[str] = None) -> Iterator[list[Node]]:
    """`count` nodes on a bridge of their own, removed afterwards (also on failure: only what this made)."""
    why = missing()
    if why:
        raise BenchError(f"the emulated network {why}")
    serial = next(_sets)
    tag = tag or f"{os.getpid() % 10000}x{serial}"
    subnet_id = (os.getpid() + 7 * serial) % 200 + 20
    bridge = f"hvbr{tag}"
    nodes = [Node(f"hvdk8s-n{i}-{tag}", f"10.77.{subnet_id}.{i + 1}", f"hvv{i}-{tag}") for i in range(count)]
    made: list[tuple[str, ...]] = []  # how to remove each thing made, newest last
    # A SIGTERM (a stopped benchmark) ends the run through the finally below, so nothing is left behind.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm) if _main_thread() else None
    try:
        _ip("link", "add", bridge, "type", "bridge")
        made.append(("link", "del", bridge))
        _ip("addr", "add", f"10.77.{subnet_id}.254/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for node in nodes:
            _ip("netns", "add", node.name)
            made.append(("netns", "del", node.name))
            _ip("link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.name)
            made.append(("link", "del", node.veth))
            _ip("link", "set", node.veth, "master", bridge)
            _ip("link", "set", node.veth, "up")
            _ip("-n", node.name, "addr", "add", f"{node.address}/24", "dev", "eth0")
            _ip("-n", node.name, "link", "set", "eth0", "up")
            _ip("-n", node.name, "link", "set", "lo", "up")
        yield nodes
    finally:
        for undo in reversed(made):
            _ip(*undo, check=False)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def agent_script(nodes: list[Node], directory: Path) -> Path:
    """mpirun's rsh agent for these nodes: `AGENT HOST COMMAND...` runs COMMAND in HOST's namespace, under
    the node's own hostname (so ranks of one node see one host, ranks of two see two)."""
    cases = "\n".join(f'  {n.address}) ns={n.name} ;;' for n in nodes)
    path = directory / "netns-agent.sh"
    path.write_text(f"""#!/bin/sh
# mpirun's rsh agent for the emulated nodes (bench/netns.py in the hvdk8s source)
while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done
host=$1; shift
case $host in
{cases}
  *) echo "netns-agent: unknown host $host" >&2; exit 1 ;;
esac
exec ip netns exec "$ns" unshare --uts /bin/sh -c 'hostname "$0"; exec /bin/sh -c "$1"' "$ns" "$*"
""")
    path.chmod(0o755)
    return path
