"""Atomic file writes (hvdk8s.core.atomic) and the writers that use them: whole files or none, readable modes,
no temporary files left behind, temporary names the cache recognises as leftovers."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from conftest import DIGITS_JOB
from hvdk8s import checkpoint
from hvdk8s.core.atomic import atomic_path, atomic_write, is_part, part_path
from hvdk8s.data import shards
from hvdk8s.data.cache import diskio
from hvdk8s.mpijob import render as renderer
from hvdk8s.spec import load_job


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def strict_umask():
    """A umask that would make new files private: the writers must set their mode themselves."""
    old = os.umask(0o077)
    yield
    os.umask(old)


def test_atomic_write_str_and_bytes_with_mode(tmp_path, strict_umask):
    atomic_write(tmp_path / "a.txt", "héllo")
    atomic_write(tmp_path / "b.bin", b"\x00\x01")
    atomic_write(tmp_path / "c", b"secret", mode=0o600)
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert (mode(tmp_path / "a.txt"), mode(tmp_path / "b.bin"), mode(tmp_path / "c")) == (0o644, 0o644, 0o600)
    atomic_write(tmp_path / "a.txt", "new")  # replacing keeps it whole and readable
    assert (tmp_path / "a.txt").read_text() == "new" and sorted(os.listdir(tmp_path)) == ["a.txt", "b.bin", "c"]


def test_a_failing_writer_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    final = tmp_path / "model.ckpt"
    final.write_text("old")
    with pytest.raises(RuntimeError, match="disk on fire"):
        with atomic_path(final) as tmp:
            tmp.write_text("half of the new")
            raise RuntimeError("disk on fire")
    assert final.read_text() == "old" and os.listdir(tmp_path) == ["model.ckpt"]
    with pytest.raises(KeyboardInterrupt):  # also on an interrupt, not only on errors
        with atomic_path(tmp_path / "other") as tmp:
            tmp.write_text("x")
            raise KeyboardInterrupt
    assert os.listdir(tmp_path) == ["model.ckpt"]


def test_writers_that_need_a_path(tmp_path, strict_umask):
    with atomic_path(tmp_path / "arrays.npz") as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".") and is_part(tmp.name)
        with open(tmp, "wb") as f:  # np.savez appends .npz to a bare path; a handle keeps the name
            np.savez(f, x=np.arange(3))
    with np.load(tmp_path / "arrays.npz") as z:
        assert z["x"].tolist() == [0, 1, 2]
    assert mode(tmp_path / "arrays.npz") == 0o644 and os.listdir(tmp_path) == ["arrays.npz"]


def test_temporary_names_are_the_caches_part_names(tmp_path):
    assert diskio.atomic_write is atomic_write and diskio.part_path is part_path and diskio.is_part is is_part
    long = tmp_path / ("x" * 250)
    for final in (tmp_path / "manifest.json", long):
        tmp = part_path(final)
        assert tmp.parent == tmp_path and is_part(tmp.name) and len(tmp.name.encode()) <= 255
    assert not is_part("manifest.json") and part_path(long) != part_path(long)


def test_checkpoint_save_is_atomic(tmp_path, strict_umask):
    first = checkpoint.save(tmp_path, 1, "one", lambda obj, path: path.write_text(obj))

    def broken(obj, path):
        path.write_text("partial")
        raise OSError("no space left")

    with pytest.raises(OSError):
        checkpoint.save(tmp_path, 2, "two", broken)
    assert os.listdir(tmp_path) == [first.name] and first.read_text() == "one" and mode(first) == 0o644


def test_rendered_gitops_files_are_0644_and_whole(tmp_path, strict_umask):
    written = renderer.write_directory(load_job(DIGITS_JOB), tmp_path / "out")
    names = sorted(p.name for p in written)
    assert sorted(os.listdir(tmp_path / "out")) == names and "mpijob.yaml" in names
    assert all(mode(p) == 0o644 for p in written)


def test_shard_index_is_written_atomically(tmp_path, strict_umask):
    index = shards.write_shards(tmp_path, {"x": np.zeros((5, 2), np.float32)}, samples_per_shard=2, info={})
    assert mode(index) == 0o644 and not [n for n in os.listdir(tmp_path) if n.startswith(".")]


def test_a_set_of_files_is_replaced_whole_or_not_at_all(tmp_path):
    """A write that fails midway (here: a file-size limit, as a full disk would) keeps the old set of
    rendered files and leaves no temporary file; the CLI names the destination, exit 2."""
    import resource
    import signal
    import subprocess
    import sys

    old = {name: f"old {name}\n" for name in ("configmap.yaml", "mpijob.yaml", "kustomization.yaml")}
    out = tmp_path / "out"
    out.mkdir()
    for name, text in old.items():
        (out / name).write_text(text)
    sizes = {p.name: len(p.read_bytes()) for p in renderer.write_directory(load_job(DIGITS_JOB), tmp_path / "ok")}
    limit = sizes["configmap.yaml"] + 1  # the ConfigMap fits, the MPIJob does not
    assert sizes["mpijob.yaml"] > limit

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    run = subprocess.run([sys.executable, "-m", "hvdk8s", "render", str(DIGITS_JOB), "-d", str(out)],
                         capture_output=True, text=True, preexec_fn=small_files, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert f"--output-dir {out}: cannot write" in run.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == old
