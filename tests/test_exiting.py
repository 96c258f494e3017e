"""hvdk8s's own processes (the `hvdk8s` command, a rank of hvdk8s's trainer) end through
hvdk8s.core.exiting.exit_at_once: sys.exit's status and messages, the exit handlers and whole output, and
no interpreter teardown."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import ROOT

PROGRAM = """
import atexit, sys
from hvdk8s.core.exiting import exit_at_once

class Torn:
    def __del__(self):
        sys.stdout.write("torn down\\n")

kept = Torn()  # a module global: the interpreter's teardown would delete it, and __del__ would write
atexit.register(lambda: sys.stdout.write("handler ran\\n"))
sys.stdout.write("no newline yet")  # still in the buffer (stdout is a pipe)
exit_at_once({code})
"""


@pytest.mark.parametrize("code, status, stderr",
                         [("None", 0, ""), ("0", 0, ""), ("3", 3, ""), ("'a message'", 1, "a message\n")])
def test_it_exits_as_sys_exit_would_after_the_handlers_and_a_flush_but_without_teardown(code, status, stderr):
    # (no PYTHONUNBUFFERED from the test's environment: the write must wait in stdout's buffer)
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(code=code)], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert (proc.returncode, proc.stderr) == (status, stderr)
    assert proc.stdout == "no newline yethandler ran\n"  # sys.exit's teardown adds "torn down" (checked)


def test_the_command_ends_so_with_its_verbs_status(tmp_path):
    """`hvdk8s` exits with the verb's status (2: a user error, named), its output whole through a pipe."""
    ok = subprocess.run([sys.executable, "-m", "hvdk8s", "validate", "examples/digits.yaml"], capture_output=True,
                        text=True, timeout=60, cwd=ROOT)
    assert ok.returncode == 0 and ok.stdout.startswith("examples/digits.yaml: valid"), ok.stderr
    bad = subprocess.run([sys.executable, "-m", "hvdk8s", "validate", str(tmp_path / "absent.yaml")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "absent.yaml" in bad.stderr and "Traceback" not in bad.stderr
