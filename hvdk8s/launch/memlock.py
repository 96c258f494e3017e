"""A rank's RDMA precondition, checked before it starts: `python -m hvdk8s.launch.memlock -- COMMAND...`.

NCCL's InfiniBand/RoCE transport registers (pins) its buffers, which counts against RLIMIT_MEMLOCK. The
ranks run as the image's non-root user, for whom CAP_IPC_LOCK in a container's capability set never
becomes effective (Kubernetes sets no ambient capabilities), so the limit itself must be unlimited. A
process may raise its soft limit up to its hard limit without privileges; the hard limit is the one the
node's container runtime gives every container. So this raises the soft limit to the hard one (the
command inherits it across exec), and if that is still not unlimited it stops the rank with a one-line
cause, instead of NCCL failing on its first registration (or, without NCCL_NET=IB, quietly using TCP).
"""
from __future__ import annotations

import os
import resource
import socket
import sys
from typing import Optional, Sequence

EXIT_CODE = 78  # EX_CONFIG: the node is set up wrongly, not the job
RUNTIME_FIX = ("the node's container runtime must start containers with memlock unlimited (containerd: "
               "LimitMEMLOCK=infinity in its systemd unit; CRI-O: default_ulimits = [\"memlock=-1:-1\"]; "
               "Docker: --default-ulimit memlock=-1:-1)")


def _size(limit: int) -> str:
    if limit == resource.RLIM_INFINITY:
        return "unlimited"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if limit >= scale and limit % scale == 0:
            return f"{limit // scale} {unit}"
    return f"{limit} bytes"


def raise_soft_limit() -> tuple[int, int]:
    """Raise RLIMIT_MEMLOCK's soft limit to the hard one; (soft, hard) afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_MEMLOCK)


def problem() -> Optional[str]:
    """Why RDMA cannot register memory here, in one line; None when the limit is unlimited."""
    soft, hard = raise_soft_limit()
    if soft == resource.RLIM_INFINITY:
        return None
    return (f"hvdk8s: on {socket.gethostname()}: RDMA needs an unlimited locked-memory limit, but this "
            f"container's is {_size(soft)} (hard limit {_size(hard)}, which a non-root rank cannot raise): "
            f"{RUNTIME_FIX}")


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        sys.exit("usage: python -m hvdk8s.launch.memlock -- COMMAND [ARG...]")
    cause = problem()
    if cause:
        # Every rank stops; one line per node (its first rank) is enough to say why.
        if os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0") == "0":
            print(cause, file=sys.stderr, flush=True)
        sys.exit(EXIT_CODE)
    os.execvp(args[0], args)


if __name__ == "__main__":
    main()
