"""12. Training across slow links, emulated on this machine (hvdk8s.bench.netns): 2 "nodes" (network
namespaces on a bridge, each link shaped with tbf) x 1 rank, and x 2 ranks at 1 Gbit/s in the full run
(fast inside a node, the shaped link between), training a 29.4M-parameter MLP (0.8M with --quick):
hvdk8s.torch with compression none, fp16 and PowerSGD (rank 4), uncompressed without hvdk8s's allreduce
rules (Open MPI's own algorithm) or its malloc thresholds (glibc's), and uncompressed and fp16 without its
TCP fragment size (Open MPI's), against torch DDP (gloo) with no hook, its fp16 hook and its PowerSGD hook
(rank 4), the hooks also with hvdk8s's allocator settings, per link rate.

- `network`: ms per step, per link rate (a group each), ratios against hvdk8s uncompressed on that link;
  each row's extra holds the gradient bytes a rank sends per step.

hvdk8s's ranks start through mpirun, whose rsh agent enters each node's namespace; DDP's through one
torchrun per node. Interleaved and repeated: the shaping moves no CPU time, but the 2-core machine's noise
does, so only ratios within one link rate mean anything.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from hvdk8s import tuning
from hvdk8s.bench import netns
from hvdk8s.bench.core import BenchError, CannotRunHere, Comparison, Row, interleaved
from hvdk8s.bench.ranks import TIMEOUT, kill_tree, rank_env
from hvdk8s.launch import local

RANK = "hvdk8s.bench.network_rank"
CONFIGS = {"hvdk8s": ("hvdk8s", "none"), "hvdk8s fp16": ("hvdk8s", "fp16"), "hvdk8s powersgd": ("hvdk8s", "powersgd"),
           "hvdk8s, Open MPI's allreduce": ("hvdk8s", "none"), "hvdk8s, Open MPI's TCP fragments": ("hvdk8s", "none"),
           "hvdk8s fp16, Open MPI's TCP fragments": ("hvdk8s", "fp16"),
           "hvdk8s, glibc's malloc": ("hvdk8s", "none"),
           "DDP": ("ddp", "none"), "DDP fp16 hook": ("ddp", "fp16"), "DDP powersgd hook": ("ddp", "powersgd"),
           "DDP fp16 hook, hvdk8s's allocators": ("ddp", "fp16"),
           "DDP powersgd hook, hvdk8s's allocators": ("ddp", "powersgd")}
# hvdk8s's rows run with its tuning profile (hvdk8s/tuning.py); these without the profile's allreduce rules, its
# TCP fragment size (Open MPI's own) or its malloc thresholds (glibc's own). DDP's run as torchrun starts them,
# and its hooks also with the allocator settings hvdk8s gives its ranks.
_OWN_FRAGMENTS = dict.fromkeys(tuning.TCP_FRAGMENTS)
CONFIG_ENV = {"hvdk8s, Open MPI's allreduce": dict.fromkeys(tuning.allreduce_rules("")),
              "hvdk8s, Open MPI's TCP fragments": _OWN_FRAGMENTS, "hvdk8s fp16, Open MPI's TCP fragments": _OWN_FRAGMENTS,
              "hvdk8s, glibc's malloc": dict.fromkeys(tuning.MALLOC),
              "DDP fp16 hook, hvdk8s's allocators": tuning.ALLOCATORS,
              "DDP powersgd hook, hvdk8s's allocators": tuning.ALLOCATORS}
LINKS_GBIT = (None, 10.0, 1.0)  # None: unshaped (veth copies, several Gbit/s here)
_PORTS = itertools.count(29677)  # torchrun's master port, one per DDP run
GRACE = 120  # seconds the rest of a run may take to end after one of its processes has ended


def _link_label(gbit) -> str:
    return "unshaped" if gbit is None else f"{gbit:g} Gbit/s"


def _run(nodes: list[netns.Node], per_node: int, agent: Path, mode: str, config: dict,
         extra_env: Optional[dict] = None) -> dict:
    np = len(nodes) * per_node
    with tempfile.TemporaryDirectory(prefix="hvdk8s-bench-") as tmp:
        out = Path(tmp) / "result.json"
        threads = max(1, (os.cpu_count() or 1) // np)  # every rank shares this one machine's cores
        program = [sys.executable, "-m", RANK, json.dumps({**config, "out": str(out), "threads": threads})]
        env = {**rank_env(np, {"OMP_NUM_THREADS": str(threads), **(extra_env or {})}, mode),
               "GLOO_SOCKET_IFNAME": "eth0"}
        subnet = nodes[0].address.rsplit(".", 1)[0] + ".0/24"
        if mode == "hvdk8s":
            commands = [[local.mpirun(), "-np", str(np), "-H", ",".join(f"{n.address}:{per_node}" for n in nodes),
                         "-bind-to", "none", "-map-by", "slot", "-mca", "plm_rsh_agent", str(agent),
                         "-mca", "oob_tcp_if_include", subnet, "-mca", "btl_tcp_if_include", subnet,
                         "-mca", "pml", "ob1", "-mca", "btl", "self,vader,tcp", *program]]
        else:
            port = next(_PORTS)  # a port of its own: the run before may still hold the last one's sockets
            commands = [["ip", "netns", "exec", node.name, sys.executable, "-m", "torch.distributed.run",
                         f"--nnodes={len(nodes)}", f"--nproc-per-node={per_node}", f"--node-rank={i}",
                         f"--master-addr={nodes[0].address}", f"--master-port={port}", *program[1:]]
                        for i, node in enumerate(nodes)]
        what = f"{mode} x{np} {config['compression']} across emulated nodes"
        logs = [Path(tmp) / f"out{i}.log" for i in range(len(commands))]
        with contextlib.ExitStack() as stack:
            procs = []
            for command, log in zip(commands, logs):
                proc = subprocess.Popen(command, env=env, stdout=stack.enter_context(open(log, "w")),
                                        stderr=subprocess.STDOUT)
                stack.callback(kill_tree, proc)
                procs.append(proc)
            why = _wait_all(procs)
        if why or not out.exists():
            said = "".join(f"--- {' '.join(c[:6])} ...\n{log.read_text()[-2000:]}" for c, log in zip(commands, logs))
            raise BenchError(f"{what} failed ({why or 'no result written'}; "
                             f"return codes {[p.returncode for p in procs]}):\n{said}")
        return json.loads(out.read_text())


def _wait_all(procs: list[subprocess.Popen], timeout: float = TIMEOUT, grace: float = GRACE) -> str:
    """Wait for every process of one run; '' when all ended well, else why not. A run's processes end
    together (their ranks meet at a last barrier), so once one has ended the rest get `grace` seconds, and
    one that fails ends the wait at once: its peers would wait for it until their own timeouts."""
    deadline, first_end = time.monotonic() + timeout, None
    while True:
        codes = [p.poll() for p in procs]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        running = [i for i, code in enumerate(codes) if code is None]
        if failed:
            return f"process {failed[0]} failed"
        if not running:
            return ""
        now = time.monotonic()
        if now > deadline:
            return f"no end after {timeout:g}s"
        if len(running) < len(procs):
            first_end = first_end or now
            if now - first_end > grace:
                return f"process {running[0]} still running {grace:g}s after another ended"
        time.sleep(0.2)


def run(quick: bool) -> Comparison:
    why = netns.missing()
    if why:
        raise CannotRunHere(f"the emulated network {why}")
    model, steps, repeats = ("mlp", 3, 1) if quick else ("mlp-30m", 5, 2)
    # ranks per node: the link rates each runs at (2 per node: 4 ranks on this machine's 2 cores, at the
    # slowest link only, where the network matters most)
    shapes = {1: (1.0,)} if quick else {1: LINKS_GBIT, 2: (1.0,)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvdk8s-netns-") as tmp, netns.emulated_nodes(2) as nodes:
        agent = netns.agent_script(nodes, Path(tmp))
        for per_node, links in shapes.items():
            for gbit in links:
                netns.shape(nodes, gbit)
                sent = {}

                def measure(label, per_node=per_node):
                    mode, compression = CONFIGS[label]
                    result = _run(nodes, per_node, agent, mode, {"mode": mode, "compression": compression, "rank": 4,
                                                                  "model": model, "batch": 32, "steps": steps},
                                  CONFIG_ENV.get(label))
                    sent[label] = result["sent_bytes"]
                    return 1000 * result["seconds_per_step"]

                samples = interleaved({label: (lambda label=label: measure(label)) for label in CONFIGS}, repeats)
                group = f"2 nodes x {per_node}, {_link_label(gbit)}"
                rows += [Row(config=label, group=group, samples=s, x=gbit or 0.0,
                             extra={"sent_MB_per_step": sent[label] / 1e6}) for label, s in samples.items()]
    return Comparison("network", f"Across emulated slow links: 2 nodes, {'0.8M' if quick else '29.4M'}-parameter "
                                 "MLP, step time by compression, hvdk8s vs torch DDP hooks", "ms/step",
                      higher_is_better=False, baseline="hvdk8s", rows=rows,
                      notes=f"{steps} steps per launch between barriers after 3 warm-up steps, {repeats} "
                            "interleaved launches per configuration. Links shaped with tc tbf on both veth ends "
                            "(this kernel has no netem: rate only, no added delay). PowerSGD rank 4 from the "
                            "first step (hvdk8s) / the third (DDP's hook needs start_powerSGD_iter > 1). "
                            "extra.sent_MB_per_step: gradient bytes a rank hands to the allreduce per step.")
