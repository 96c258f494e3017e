"""Defaults that follow measurement: compression `auto`, learning-rate scaling and warmup, controller."""
import pytest

from hvdk8s.compression import resolve
from hvdk8s.launch import local
from hvdk8s.schedule import lr_scale, warmup_lr


@pytest.mark.parametrize("nodes,expected", [
    (1, "none"),  # one node: shared memory, nothing to save on the wire (fp16 1.34x slower on 2 CPU ranks)
    (2, "fp16"),  # gradients cross a network (0.65x at 1 Gbit/s, 0.94x at 10 Gbit/s: `bench --only network`)
    (4, "fp16"),
])
def test_auto_compression(nodes, expected):
    assert resolve("auto", nodes=nodes) == expected


def test_explicit_compression_wins():
    assert resolve("fp16", nodes=1) == "fp16"
    assert resolve("none", nodes=8) == "none"
    assert resolve("powersgd", nodes=1) == "powersgd"  # never chosen by auto
    with pytest.raises(ValueError):
        resolve("int8", nodes=1)


def test_lr_scaling_rules():
    assert lr_scale("linear", 8, 1) == 8
    assert lr_scale("linear", 4, 2) == 8  # accumulated passes grow the global batch too
    assert lr_scale("sqrt", 16, 1) == 4
    assert lr_scale("none", 16, 4) == 1


def test_warmup_ramps_linearly_to_peak():
    assert warmup_lr(0, 4, 0.1, 0.5) == pytest.approx(0.2)
    assert warmup_lr(3, 4, 0.1, 0.5) == pytest.approx(0.5)
    assert warmup_lr(10, 4, 0.1, 0.5) == 0.5
    assert warmup_lr(0, 0, 0.1, 0.5) == 0.5


def test_local_launch_defaults_to_mpi_and_allows_root(monkeypatch):
    monkeypatch.setattr(local, "horovodrun", lambda: ["horovodrun"])
    monkeypatch.setattr(local, "mpirun", lambda: "mpirun")
    cmd = local.command(["prog"], 3)
    assert cmd[:5] == ["mpirun", "--tag-output", "-np", "3", "-H"] and cmd[5] == "localhost:3" and cmd[-1] == "prog"
    assert local.command(["prog"], 3, "gloo") == ["horovodrun", "-np", "3", "-H", "localhost:3", "--gloo", "prog"]
    env = local.environment(2, {})
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["HVDK8S_EVENTS"] == "json"
    with pytest.raises(local.LaunchError):
        local.command(["prog"], 0)
    with pytest.raises(local.LaunchError):
        local.command(["prog"], 2, "nccl")
