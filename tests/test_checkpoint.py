"""Checkpoint files: atomic writes, pruning, newest-valid resume (no ranks needed)."""
import os

import pytest
import torch

from hvdk8s import checkpoint


def write(obj, path):
    torch.save(obj, path)


def read(path):
    return torch.load(path, weights_only=True)


def test_save_is_atomic_and_keeps_the_newest(tmp_path):
    for epoch in range(1, 6):
        checkpoint.save(tmp_path, epoch, {"epoch": epoch, "w": torch.full((3,), float(epoch))}, write, keep=2)
    assert [e for e, _ in checkpoint.list_checkpoints(tmp_path)] == [5, 4]
    assert sorted(os.listdir(tmp_path)) == ["epoch-00004.ckpt", "epoch-00005.ckpt"]  # no temporary left


def test_a_failed_write_leaves_nothing_under_a_final_name(tmp_path):
    def crash(obj, path):
        path.write_bytes(b"half a checkpoint")
        raise OSError("disk full")

    with pytest.raises(OSError):
        checkpoint.save(tmp_path, 1, {}, crash)
    assert os.listdir(tmp_path) == []


def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, capsys):
    checkpoint.save(tmp_path, 1, {"epoch": 1}, write)
    checkpoint.save(tmp_path, 2, {"epoch": 2}, write)
    path2 = checkpoint.path_for(tmp_path, 2)
    path2.write_bytes(path2.read_bytes()[:40])  # truncated by hand
    epoch, path, payload = checkpoint.load_latest(tmp_path, read)
    assert (epoch, payload["epoch"]) == (1, 1)
    assert "skipping unreadable checkpoint" in capsys.readouterr().err


def test_resume_skips_files_of_another_kind(tmp_path):
    checkpoint.save(tmp_path, 1, {"epoch": 1, "model": {}, "optimizer": {}}, write)
    checkpoint.save(tmp_path, 2, {"something": "else"}, write)
    epoch, _, _ = checkpoint.load_latest(tmp_path, read, valid=lambda d: "model" in d)
    assert epoch == 1


def test_no_checkpoints(tmp_path):
    assert checkpoint.load_latest(tmp_path / "absent", read) is None


def test_pruning_never_removes_the_checkpoint_just_written(tmp_path):
    """Checkpoints of later epochs (an earlier run abandoned with --no-resume, or damaged ones that
    resume skipped) must not survive the new run's save: a later resume would continue the old run."""
    for epoch in (5, 6, 7):  # the earlier run
        checkpoint.save(tmp_path, epoch, {"epoch": epoch, "run": "old"}, write)
    path = checkpoint.save(tmp_path, 1, {"epoch": 1, "run": "new"}, write, keep=3)
    assert [e for e, _ in checkpoint.list_checkpoints(tmp_path)] == [1] and path.exists()
    checkpoint.save(tmp_path, 2, {"epoch": 2, "run": "new"}, write, keep=3)
    epoch, _, payload = checkpoint.load_latest(tmp_path, read)
    assert (epoch, payload["run"]) == (2, "new")


def test_temporary_files_of_a_killed_writer_are_removed_by_the_next_save(tmp_path):
    from hvdk8s.core.atomic import part_path

    leftover = part_path(checkpoint.path_for(tmp_path, 3))
    leftover.write_bytes(b"x" * 1000)  # what kill -9 during a write leaves
    checkpoint.save(tmp_path, 3, {"epoch": 3}, write)
    assert sorted(os.listdir(tmp_path)) == ["epoch-00003.ckpt"]
