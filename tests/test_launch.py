"""`hvdk8s launch --local -np 2`: the real CLI starting real ranks on the digits job."""
import re

import pytest

import orphans
from conftest import cli, events_of, session_members

pytestmark = pytest.mark.ranks


def test_failing_ranks_make_launch_fail(job_file, tmp_path):
    # A shard dataset path that does not exist: the ranks fail, and so must the launch.
    job = job_file({"dataset": {"path": str(tmp_path / "missing"), "name": None}})
    proc = cli("launch", "--local", "-np", "2", job)
    assert proc.returncode != 0
    assert "no shard index" in proc.stdout + proc.stderr


def test_an_unwritable_checkpoint_dir_stops_the_launch_before_any_rank(tmp_path, job_file):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = cli("launch", "--local", "-np", "2", "--log-format", "json",
              job_file({"training": {"checkpoint": {"dir": str(blocker / "ckpt")}}}))
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert "training.checkpoint.dir:" in run.stderr and "cannot write checkpoints" in run.stderr
    assert events_of(run.stdout, "start", "epoch") == [], run.stdout  # no rank trained


def _kill_and_outlive_check(launcher, rank_argv: list[bytes]) -> None:
    """kill -9 of the launcher's whole process group (its own session): the two ranks, whose argv starts
    (after the interpreter) with `rank_argv`, die with it (SIGKILL from their parent's death, not an exit
    of their own later), and nothing else of the session is left."""
    import os
    import signal

    argvs = {p: open(f"/proc/{p}/cmdline", "rb").read().split(b"\x00") for p in session_members(launcher.pid)}
    ranks = [p for p, a in argvs.items() if a[1:1 + len(rank_argv)] == rank_argv]  # not horovodrun's or mpirun's
    assert len(ranks) == 2, argvs
    with orphans.adopting():
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        ended = orphans.ends(ranks)
    assert set(ended.values()) == {"SIGKILL"}, ended
    survivors = orphans.gone(session_members, launcher.pid)
    for pid in survivors:  # so that a failure here leaves nothing running
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert survivors == [], "processes outlived the launcher"


def _launch(job, *options: str, stderr=None, **popen) -> "subprocess.Popen":
    """The launch, its stdout read through a pipe (stderr too unless given); `popen`: more of Popen's arguments."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "hvdk8s", "launch", "--local", "-np", "2", *options, str(job)],
                            stdout=subprocess.PIPE, stderr=stderr or subprocess.STDOUT, text=True,
                            start_new_session=True, **popen)


def _sleeper_job(tmp_path):
    """A script job whose ranks print `ready`, then sleep (300 s: until the test ends them)."""
    (tmp_path / "sleeper.py").write_text("import time\nprint('ready', flush=True)\ntime.sleep(300)\n")
    (tmp_path / "job.yaml").write_text("name: sleeper\nframework: pytorch\nentrypoint: {script: sleeper.py}\n"
                                      "training: {epochs: 1, batch_size: 8, learning_rate: 0.1}\n")
    return tmp_path / "job.yaml"


def _until_both_ready(launcher) -> None:
    ready = 0
    for line in launcher.stdout:
        ready += line.rstrip().endswith("ready")
        if ready == 2:
            return


def test_no_rank_outlives_a_killed_launcher(job_file, tmp_path):
    """The ranks (mpirun gives them groups of their own) die with their parent at once instead of training
    on for seconds."""
    with open(tmp_path / "launch.stderr", "w") as stderr:  # stdout: records only
        launcher = _launch(job_file({"training": {"epochs": 200}}), "--log-format", "json", stderr=stderr)
    for line in launcher.stdout:  # wait until the ranks train
        if any(e["epoch"] == 2 for e in events_of(line, "epoch")):
            break
    _kill_and_outlive_check(launcher, [b"-m", b"hvdk8s", b"train"])


def test_no_rank_of_a_users_script_outlives_a_killed_launcher(tmp_path):
    """A script that never calls hvdk8s.torch.init() (where ranks used to start dying with their parent) dies
    with its launcher too: hvdk8s.rankmain arranges it before the script runs."""
    launcher = _launch(_sleeper_job(tmp_path))
    _until_both_ready(launcher)
    _kill_and_outlive_check(launcher, [b"-m", b"hvdk8s.rankmain"])


@pytest.mark.parametrize("signum, controller", [(15, "mpi"), (1, "gloo")], ids=["SIGTERM-mpi", "SIGHUP-gloo"])
def test_a_launch_told_to_stop_stops_its_ranks_and_leaves_no_file(tmp_path, signum, controller):
    """`kill` (SIGTERM) or a closed terminal (SIGHUP) sent to the launch alone, not to its process group: it
    stops mpirun or horovodrun and their ranks as Ctrl-C does, removes the job file it gave them, and exits
    128 + the signal's number (it used to die at once, leaving mpirun and both ranks running)."""
    import os
    import signal
    import subprocess

    (tmp_path / "tmp").mkdir()  # where the launch puts the ranks' job file
    launcher = _launch(_sleeper_job(tmp_path), f"--{controller}", env={**os.environ, "TMPDIR": str(tmp_path / "tmp")},
                       # a closed terminal's SIGHUP as a terminal sends it: the suite may run under nohup (a
                       # background run here did), whose ignored SIGHUP the launch keeps
                       preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    _until_both_ready(launcher)
    assert list((tmp_path / "tmp").glob("hvdk8s-job-*/job.yaml")), "the ranks' job file should exist meanwhile"
    os.kill(launcher.pid, signum)
    try:
        code = launcher.wait(timeout=60)  # a watchdog only (it stops within a second or two): not 300 s of sleep
    except subprocess.TimeoutExpired:
        code = None
    left = orphans.gone(session_members, launcher.pid)
    for pid in left:  # so that a failure here leaves nothing running
        os.kill(pid, signal.SIGKILL)
    rest = launcher.stdout.read()
    assert code == 128 + signum and "Traceback" not in rest, (code, rest)
    assert left == [], "processes outlived the stopped launch"
    assert list((tmp_path / "tmp").iterdir()) == [], "the ranks' job file is left behind"


def test_event_lines_without_the_launchers_token_are_plain_output(tmp_path):
    """A rank's own output shaped like an event (no token, or a kind that is not a string) is shown as it is:
    it neither poses as rank 0's progress nor crashes the view, even with the launcher's token (which the
    ranks' environment holds)."""
    forged = ['@hvdk8s {"event": "done"}', '@hvdk8s {"event": [1]}',
              '@hvdk8s {"event": "done", "test_accuracy": 1.0, "epochs": 1, "seconds": 1.0, "digest": "forged"}']
    (tmp_path / "forger.py").write_text(
        "import os\n" + "".join(f"print({line!r})\n" for line in forged)
        + "print(f'@hvdk8s:{os.environ[\"HVDK8S_EVENTS_TOKEN\"]} ' + '{\"event\": [1]}')\n")
    (tmp_path / "job.yaml").write_text("name: forger\nframework: pytorch\nentrypoint: {script: forger.py}\n"
                                      "training: {epochs: 1, batch_size: 8, learning_rate: 0.1}\n")
    run = cli("launch", "--local", "-np", "2", tmp_path / "job.yaml", timeout=120)
    assert run.returncode == 0 and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    for line in forged:
        assert run.stdout.count(line) == 2, run.stdout  # once per rank, verbatim
    assert run.stdout.count(' {"event": [1]}') == 4, run.stdout  # the tokened one too
    assert "done: test accuracy" not in run.stdout


def _rank_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of the `hvdk8s train` ranks below a launcher process (their environment names
    the rank: OMPI_COMM_WORLD_RANK under MPI, HOROVOD_RANK under Gloo)."""
    from hvdk8s.launch.procs import ranks

    return ranks(launcher)


@pytest.mark.parametrize("controller,how", [("mpi", "hang"), ("gloo", "die")])
def test_a_hung_or_dead_rank_ends_the_job_within_its_bound(job_file, controller, how):
    """A rank that hangs (SIGSTOP) or dies (SIGKILL) fails the job, with the rank named and no launcher
    traceback: a hang by the job's stall bound, a death at once. The job never ends on
    its own (how fast the machine trains does not matter) and the test decides on how it ended, not on how
    long that took: a bound that did not work leaves the job running into communicate()'s watchdog."""
    import os
    import signal
    import subprocess
    import sys

    job = job_file({"training": {"epochs": 100_000, "stall_timeout_seconds": 6}})
    proc = subprocess.Popen([sys.executable, "-m", "hvdk8s", "launch", "--local", "-np", "2", f"--{controller}", str(job)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    out = []
    for line in proc.stdout:
        out.append(line)
        if line.startswith("epoch 1/"):
            break
    from hvdk8s.launch.procs import descendants

    everything = descendants(proc.pid)  # Gloo's helpers leave the session: kill by tree when done
    try:
        pids = _rank_pids(proc.pid)
        assert sorted(pids) == [0, 1], "".join(out)
        os.kill(pids[1], signal.SIGSTOP if how == "hang" else signal.SIGKILL)
        rest, _ = proc.communicate(timeout=300)  # a watchdog: the job ends long before
    finally:
        for pid in [proc.pid, *everything]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    text = "".join(out) + rest
    assert proc.returncode != 0, text
    if how == "hang":  # ended by the stall bound: hvdk8s's watchdog or Horovod's stall shutdown
        assert ("no progress from the ranks for 6s" in text or "Horovod has been shut down" in text
                or "stall" in text.lower()), text
    assert "horovod/runner/" not in text, text  # the launcher's frames; a rank's own traceback may pass
    assert re.search(r"\b1\b", text.split("epoch 1/", 1)[1]), text  # the rank is named


@pytest.mark.one_rank
def test_a_launch_from_a_process_that_initialised_mpi_starts_its_own_job(tmp_path):
    """A process that ran Horovod's init alone (an MPI singleton: a notebook that called hvd.init()) leaves
    PMIx's and its job's variables in the environment of everything it starts; a launch from it must not
    hand them to its mpirun, which then ended at once with status 1 and no word (found in the suite: a
    test's in-process init broke a later test's launch on the same worker)."""
    import subprocess
    import sys

    from conftest import DIGITS_JOB

    parent = ("import subprocess, sys\nimport horovod.torch as hvd\nhvd.init()\n"
              "sys.exit(subprocess.run([sys.executable, '-m', 'hvdk8s', 'launch', '--local', '-np', '1', "
              f"{str(DIGITS_JOB)!r}, '--set', 'training.epochs=1', '--log-format', 'json']).returncode)\n")
    proc = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [done] = events_of(proc.stdout, "done")
    assert done["epochs"] == 1, done
