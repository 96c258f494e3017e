"""The launcher's wait for its workers, before mpirun:
`python -m hvdk8s.launch.workers [--hostfile F] [--port 2222] [--timeout S] -- mpirun ...`.

mpi-operator v0.8.2 creates the launcher once every worker pod is Ready (launcherCreationPolicy
WaitForWorkersReady), but a job queued by Kueue (`runPolicy.suspend`) has no workers while suspended, so
"all ready" is 0 of 0 and the launcher Job exists at once; on admission it starts in the same sync that
first creates the workers. Their names resolve only once each pod is Ready (the job's headless Service
does not publish not-ready addresses), so mpirun's ssh would fail, and every failure would use up one of
the launcher Job's retries while the workers are still pulling the image. Gang scheduling starts the
launcher early too (hvdk8s renders AtStartup there). So the launcher waits here, whatever the operator
did: until every host of the operator's hostfile resolves and its sshd answers with an SSH banner, for
at most --timeout seconds; then it execs the command, or exits 1 with one line per host saying what is
still missing. It adds nothing to the command or its environment: the ranks' tuning (hvdk8s.tuning) is
written into the MPIJob's env, where a reader sees it.
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

DEFAULT_HOSTFILE = "/etc/mpi/hostfile"  # the operator's ConfigMap, mounted on the launcher
HOSTFILE_ENV = "OMPI_MCA_orte_default_hostfile"  # what the operator points OpenMPI at
EXIT_CODE = 1
_BANNER = b"SSH-"  # RFC 4253: an SSH server speaks first, with "SSH-protoversion-..."


def hosts_from_hostfile(text: str) -> list[str]:
    """Host names of an MPI hostfile: OpenMPI's `host slots=N` lines or Intel MPI / MPICH's `host:N`."""
    hosts = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            hosts.append(words[0].rsplit(":", 1)[0] if ":" in words[0] else words[0])
    return hosts


def others(hosts: Sequence[str], me: Optional[str] = None) -> list[str]:
    """HOSTS without this pod (the launcher is in the hostfile when it runs ranks itself, runLauncherAsWorker:
    mpirun starts those locally, no sshd is involved)."""
    me = (me or socket.gethostname()).split(".", 1)[0]
    return [h for h in hosts if h.split(".", 1)[0] != me]


def _in_thread(work: Callable[[], object], timeout: float) -> tuple[bool, object]:
    """(finished, result or the exception raised) of WORK run for at most TIMEOUT seconds. A name lookup
    cannot be interrupted, so it runs in a daemon thread that is abandoned if it hangs."""
    box: list = []

    def run() -> None:
        try:
            box.append(work())
        except BaseException as e:  # handed to the caller, which words it
            box.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    return (bool(box), box[0] if box else None)


def probe(host: str, port: int, timeout: float) -> Optional[str]:
    """None when HOST resolves and an SSH server answers on PORT within TIMEOUT seconds, else why not."""
    deadline = time.monotonic() + timeout
    done, found = _in_thread(lambda: socket.getaddrinfo(host, port, type=socket.SOCK_STREAM), timeout)
    if not done:
        return f"{host}: name lookup took over {timeout:g}s"
    if isinstance(found, BaseException):
        why = getattr(found, "strerror", None) or str(found)
        return (f"{host}: does not resolve ({why}); the job's Service publishes a worker's name once its pod "
                "is Ready (image pulled, sshd listening)")
    last = f"{host}: no address to connect to"
    for family, kind, proto, _, address in found:
        left = deadline - time.monotonic()
        if left <= 0:
            return f"{host}: no answer on port {port} within {timeout:g}s"
        last = _ssh_answers(host, port, family, kind, proto, address, left)
        if last is None:
            return None
    return last


def _ssh_answers(host: str, port: int, family, kind, proto, address, timeout: float) -> Optional[str]:
    try:
        with socket.socket(family, kind, proto) as conn:
            conn.settimeout(timeout)
            conn.connect(address)
            banner = conn.recv(len(_BANNER))
    except ConnectionRefusedError:
        return f"{host}: port {port} refused the connection (sshd not listening yet)"
    except socket.timeout:
        return f"{host}: port {port} did not answer within {timeout:.3g}s"
    except OSError as e:
        return f"{host}: port {port}: {e.strerror or e}"
    if banner.startswith(_BANNER):
        return None
    if not banner:
        return f"{host}: port {port} accepted and closed without an SSH banner"
    return f"{host}: port {port} answered {banner!r}, not an SSH server"


def wait_for(hosts: Sequence[str], port: int, timeout: float, *, probe_timeout: float = 5.0,
             interval: float = 1.0, max_interval: float = 5.0,
             log: Callable[[str], None] = lambda line: None) -> dict[str, str]:
    """Probe HOSTS until each has answered once or TIMEOUT seconds pass; {host: why not} for those that never
    did (empty: all answered). Hosts are probed in parallel, each round waiting longer, up to MAX_INTERVAL."""
    deadline = time.monotonic() + timeout
    pending = {h: "not probed yet" for h in dict.fromkeys(hosts)}
    while pending:
        left = deadline - time.monotonic()
        results: dict[str, Optional[str]] = {}
        each = max(0.05, min(probe_timeout, left))
        threads = [threading.Thread(target=lambda h=h: results.__setitem__(h, probe(h, port, each)), daemon=True)
                   for h in pending]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(each + 1.0)  # probe() bounds itself; the extra second only guards against surprises
        for host in list(pending):
            if host in results and results[host] is None:
                del pending[host]
                log(f"hvdk8s: {host} answers ssh on port {port}")
            else:
                pending[host] = results.get(host) or f"{host}: probe did not finish"
        left = deadline - time.monotonic()
        if not pending or left <= 0:
            break
        time.sleep(min(interval, left))
        interval = min(interval * 1.5, max_interval)
    return pending


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m hvdk8s.launch.workers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hostfile", default=os.environ.get(HOSTFILE_ENV) or DEFAULT_HOSTFILE)
    parser.add_argument("--port", type=int, default=2222)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds to wait at most")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to exec, e.g. mpirun ...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        hosts = others(hosts_from_hostfile(Path(args.hostfile).read_text(encoding="utf-8")))
    except OSError as e:
        sys.exit(f"hvdk8s: cannot read the hostfile {args.hostfile}: {e.strerror or e}")
    started = time.monotonic()
    print(f"hvdk8s: waiting up to {args.timeout:g}s for {len(hosts)} worker(s) to answer ssh on port {args.port}",
          file=sys.stderr, flush=True)
    missing = wait_for(hosts, args.port, args.timeout, log=lambda line: print(line, file=sys.stderr, flush=True))
    if missing:
        print(f"hvdk8s: {len(missing)} of {len(hosts)} worker(s) did not answer within {args.timeout:g}s:",
              file=sys.stderr)
        for reason in missing.values():
            print(f"  {reason}", file=sys.stderr)
        sys.exit(EXIT_CODE)
    print(f"hvdk8s: all {len(hosts)} worker(s) answer ssh after {time.monotonic() - started:.1f}s",
          file=sys.stderr, flush=True)
    if command:
        os.execvp(command[0], command)


if __name__ == "__main__":
    main()
