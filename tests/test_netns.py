"""The emulated cluster network of `hvdk8s bench --only network` (bench/netns.py): nodes as network
namespaces on a bridge, links shaped by tc, ranks started in them by mpirun through its rsh agent."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hvdk8s.bench import netns
from hvdk8s.bench.ranks import rank_env
from hvdk8s.launch import local

pytestmark = pytest.mark.skipif(netns.missing() is not None, reason=f"the emulated network {netns.missing()}")


def _names(kind: str) -> str:
    return subprocess.run(["ip", *kind.split()], capture_output=True, text=True).stdout


def test_mpirun_starts_each_rank_in_its_node_with_the_nodes_name_and_address(tmp_path):
    with netns.emulated_nodes(2, tag="t1") as nodes:
        agent = netns.agent_script(nodes, tmp_path)
        subnet = nodes[0].address.rsplit(".", 1)[0] + ".0/24"
        cmd = [local.mpirun(), "-np", "3", "-H", f"{nodes[0].address}:2,{nodes[1].address}:1",
               "-mca", "plm_rsh_agent", str(agent), "-mca", "oob_tcp_if_include", subnet,
               "sh", "-c", "echo rank $OMPI_COMM_WORLD_RANK $(hostname) $(ip -4 -o addr show eth0 | awk '{print $4}')"]
        run = subprocess.run(cmd, env=rank_env(3, None), capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr
        lines = sorted(run.stdout.split("\n"))[1:]
        assert lines == [f"rank 0 {nodes[0].name} {nodes[0].address}/24", f"rank 1 {nodes[0].name} {nodes[0].address}/24",
                         f"rank 2 {nodes[1].name} {nodes[1].address}/24"], run.stdout
        names = [n.name for n in nodes]
        assert all(name in _names("netns list") for name in names)
    assert not any(name in _names("netns list") for name in names)  # removed afterwards
    assert "hvbrt1" not in _names("link show") and "hvv0-t1" not in _names("link show")


def test_links_are_shaped_both_ways_and_unshaped_again():
    with netns.emulated_nodes(2, tag="t2") as nodes:
        netns.shape(nodes, 2.5)
        for node in nodes:
            outside = subprocess.run(["tc", "qdisc", "show", "dev", node.veth], capture_output=True, text=True).stdout
            inside = subprocess.run(["tc", "-n", node.name, "qdisc", "show", "dev", "eth0"], capture_output=True,
                                    text=True).stdout
            assert "tbf" in outside and "rate 2500Mbit" in outside, outside
            assert "tbf" in inside and "rate 2500Mbit" in inside, inside
        netns.shape(nodes, None)
        outside = subprocess.run(["tc", "qdisc", "show", "dev", nodes[0].veth], capture_output=True, text=True).stdout
        assert "tbf" not in outside, outside


def test_a_failed_setup_removes_what_it_made():
    """A second set with the same tag cannot make its bridge: it says so and leaves the first one alone."""
    with netns.emulated_nodes(1, tag="t3") as nodes:
        with pytest.raises(netns.BenchError, match="ip link add hvbrt3 type bridge"):
            with netns.emulated_nodes(1, tag="t3"):
                pass
        assert nodes[0].name in _names("netns list")


def test_a_benchmark_stopped_by_sigterm_leaves_no_namespace_behind():
    import signal
    import sys

    code = ("import sys, time; from hvdk8s.bench import netns\n"
            "with netns.emulated_nodes(2, tag='t4'):\n"
            "    print('ready', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        assert "hvdk8s-n1-t4" in _names("netns list")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    assert "-t4" not in _names("netns list") and "t4" not in _names("link show")
