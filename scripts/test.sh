#!/usr/bin/env bash
# The whole test suite: set up if needed, then pytest (extra arguments go to pytest).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
# The project's own bytecode too (setup.sh compiles what it installs): ranks import it at every start.
.venv/bin/python -m compileall -q hvdk8s mpijob data models bench >/dev/null || true
# Two or more workers (pytest-xdist): tests that start Horovod ranks run one at a time on one of them, the
# rest beside them (tests/workgroups.py); on an idle 2-core machine 40% of the cores sat idle in a
# serial run. HVDK8S_TEST_WORKERS=0 runs everything in this one process.
cores=$(nproc)
workers=${HVDK8S_TEST_WORKERS:-$(( cores < 2 ? 2 : cores > 4 ? 4 : cores ))}
if [ "$workers" -gt 0 ]; then
  set -- -n "$workers" --dist loadgroup "$@"
fi
exec .venv/bin/python -m pytest "$@"
