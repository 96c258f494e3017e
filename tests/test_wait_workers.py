"""The launcher's wait for its workers (hvdk8s.launch.workers), run for real on loopback: names that do not
resolve, ports that refuse or never answer, a listener that is no SSH server, one that comes up late, and
the command it execs once every worker answers."""
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from hvdk8s.launch import workers

from conftest import sleepy_negotiation_library

BANNER = b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n"


class Listener:
    """A TCP server on 127.0.0.1 that answers each connection with REPLY (None: says nothing), optionally
    starting to listen only after DELAY seconds (until then its port refuses connections)."""

    def __init__(self, reply=BANNER, delay=0.0):
        self.reply = reply
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.held = []
        self.stopped = threading.Event()
        threading.Timer(delay, self._serve).start() if delay else self._serve()

    def _serve(self):
        self.sock.listen(16)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except (socket.timeout, OSError):
                continue
            if self.reply is not None:
                conn.sendall(self.reply)
                conn.close()
            else:
                self.held.append(conn)  # accepted, but never a word

    def close(self):
        self.stopped.set()
        for conn in self.held:
            conn.close()
        self.sock.close()


@pytest.fixture
def listener():
    made = []

    def make(**kw):
        made.append(Listener(**kw))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture
def closed_port():
    """A loopback port with nothing listening: bound, then closed, so connections are refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_hostfile_formats_and_the_launcher_itself():
    text = ("job-worker-0.job.ns.svc slots=8\n# comment\n\njob-worker-1.job.ns.svc slots=8  # trailing\n"
            "mpich-worker-0.job.ns.svc:4\n")
    hosts = workers.hosts_from_hostfile(text)
    assert hosts == ["job-worker-0.job.ns.svc", "job-worker-1.job.ns.svc", "mpich-worker-0.job.ns.svc"]
    with_launcher = ["job-launcher.job.ns.svc", *hosts[:2]]  # runLauncherAsWorker lists the launcher first
    assert workers.others(with_launcher, me="job-launcher") == hosts[:2]


def test_an_ssh_server_answers(listener):
    server = listener()
    assert workers.probe("127.0.0.1", server.port, timeout=2) is None
    assert workers.probe("localhost", server.port, timeout=2) is None  # a name that resolves (v4 or v6 first)


def test_a_name_that_does_not_resolve():
    reason = workers.probe("nope.invalid", 2222, timeout=5)
    assert reason.startswith("nope.invalid: ")
    assert "does not resolve" in reason or "name lookup took over" in reason


def test_a_port_that_refuses(closed_port):
    reason = workers.probe("127.0.0.1", closed_port, timeout=2)
    assert "refused" in reason and str(closed_port) in reason


def test_a_listener_that_accepts_but_never_speaks(listener):
    server = listener(reply=None)
    started = time.monotonic()
    reason = workers.probe("127.0.0.1", server.port, timeout=1)
    assert "did not answer" in reason and time.monotonic() - started > 0.9  # it waited out its timeout


@pytest.mark.parametrize("reply, words", [(b"HTTP/1.1 400 Bad Request\r\n", "not an SSH server"),
                                          (b"", "without an SSH banner")])
def test_a_listener_that_is_no_ssh_server(listener, reply, words):
    server = listener(reply=reply)
    assert words in workers.probe("127.0.0.1", server.port, timeout=2)


def test_the_wait_ends_when_a_late_worker_comes_up(listener):
    late = listener(delay=1.5)
    ready = listener()
    started = time.monotonic()
    missing = workers.wait_for(["127.0.0.1"], late.port, timeout=20, interval=0.2)
    # It ended on the late worker's answer (a wait that ran out at 20 s would name it), not before it listened.
    assert missing == {} and time.monotonic() - started >= 1.4
    assert workers.wait_for(["127.0.0.1", "localhost"], ready.port, timeout=5) == {}


def test_the_wait_is_bounded_and_says_why_for_each_worker(closed_port):
    started = time.monotonic()
    lines = []
    missing = workers.wait_for(["127.0.0.1", "nope.invalid"], closed_port, timeout=2, interval=0.2,
                               log=lines.append)
    elapsed = time.monotonic() - started
    assert elapsed > 1.9, elapsed  # the bound, no less: it ran out (both named below) rather than ending early
    assert set(missing) == {"127.0.0.1", "nope.invalid"} and lines == []
    assert "refused" in missing["127.0.0.1"] and missing["nope.invalid"].startswith("nope.invalid: ")


def run_module(hostfile, *args, timeout=60, env=None):
    return subprocess.run([sys.executable, "-m", "hvdk8s.launch.workers", "--hostfile", str(hostfile), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def test_the_launcher_command_execs_mpirun_once_every_worker_answers(listener, tmp_path):
    server = listener()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=2\nlocalhost slots=2\n")
    proc = run_module(hostfile, "--port", str(server.port), "--timeout", "10", "--",
                      sys.executable, "-c", "print('mpirun would start here')")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "mpirun would start here\n"
    assert "all 2 worker(s) answer ssh" in proc.stderr


def test_the_wait_adds_nothing_to_what_the_ranks_get(listener, tmp_path):
    """A real mpirun (one local rank) started by the launcher's wait: the rank's LD_PRELOAD is the launcher's
    as the MPIJob sets it (the tuning profile is rendered into its env, hvdk8s/tuning.py), nothing added."""
    library = str(sleepy_negotiation_library())
    server = listener()
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1\n")
    rank = [sys.executable, "-c", "import os; print(os.environ.get('LD_PRELOAD'))"]
    base = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    base.pop("LD_PRELOAD", None)
    for job_env, expected in (({}, "None"), ({"LD_PRELOAD": f"{library} libc.so.6"}, f"{library} libc.so.6")):
        proc = run_module(hostfile, "--port", str(server.port), "--timeout", "10", "--",
                          "mpirun", "-np", "1", "-x", "LD_PRELOAD", *rank, env={**base, **job_env})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == expected, (job_env, proc.stdout)


def test_the_launcher_command_gives_up_with_a_line_per_worker(closed_port, tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("nope.invalid slots=8\n127.0.0.1 slots=8\n")
    proc = run_module(hostfile, "--port", str(closed_port), "--timeout", "2", "--",
                      sys.executable, "-c", "print('must not run')")
    assert proc.returncode == workers.EXIT_CODE and proc.stdout == ""
    assert "2 of 2 worker(s) did not answer within 2s" in proc.stderr
    assert "  nope.invalid: " in proc.stderr and f"  127.0.0.1: port {closed_port} refused" in proc.stderr


def test_a_missing_hostfile_is_one_line(tmp_path):
    proc = run_module(tmp_path / "absent", "--timeout", "1")
    assert proc.returncode != 0 and "cannot read the hostfile" in proc.stderr and "Traceback" not in proc.stderr
