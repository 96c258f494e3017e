"""The ranks of a local launch as processes (Linux /proc): which they are, which rank each is, and
whether each is still running, so the launcher can name a rank that hangs."""
from __future__ import annotations

import os
from typing import Optional

_RANK_VARS = (b"OMPI_COMM_WORLD_RANK", b"HOROVOD_RANK")  # set by mpirun; by horovodrun --gloo


def _stat(pid: int) -> Optional[list[str]]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()  # fields after the command name
    except OSError:
        return None


def descendants(root: int) -> list[int]:
    """Every live process below `root` (ranks may start sessions of their own, so not by session)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None and stat[0] != "Z":
            children.setdefault(int(stat[1]), []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rank_of(pid: int) -> Optional[int]:
    """The Horovod rank a process was started as, or None for launcher processes."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\x00") if b"=" in kv)
    except OSError:
        return None
    value = next((env[v] for v in _RANK_VARS if v in env), None)
    # mpirun's and horovodrun's helpers carry no rank; orted may, so require the rank's own program.
    return int(value) if value is not None and value.isdigit() and not _is_launcher(pid) else None


def _is_launcher(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\x00")
    except OSError:
        return True
    return (any(os.path.basename(a) in (b"mpirun", b"orterun", b"orted", b"horovodrun", b"prterun") for a in argv[:2])
            or argv[1:3] == [b"-m", b"hvdk8s.launch.horovodrun"])


def cpu_seconds(pid: int) -> Optional[float]:
    """User + system CPU time of a process so far."""
    stat = _stat(pid)
    return None if stat is None else (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")


def ranks(root: int) -> dict[int, int]:
    """{rank: pid} below `root`: for each rank its innermost process (a shell wrapper may carry the
    same rank as the program it runs)."""
    found: dict[int, int] = {}
    for pid in descendants(root):  # parents come before their children
        rank = rank_of(pid)
        if rank is not None:
            found[rank] = pid
    return found
