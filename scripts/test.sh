#!/usr/bin/env bash
# The whole test suite: set up if needed, then pytest (extra arguments go to pytest).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
# The project's own bytecode too (setup.sh compiles what it installs): ranks import it at every start.
.venv/bin/python -m compileall -q hvdk8s mpijob data models bench >/dev/null || true
# Workers (pytest-xdist): tests that start Horovod ranks run one at a time on one of them, the real-node
# tests on another, the API-server tests on one, the rest beside them (tests/workgroups.py). One worker
# more than cores: the node and cluster tests spend much of their time waiting for pods, probes and
# controllers, which the others fill (on an idle 2-core machine 40% of the cores sat idle in a serial run).
# HVDK8S_TEST_WORKERS=0 runs everything in this one process.
cores=$(nproc)
workers=${HVDK8S_TEST_WORKERS:-$(( cores < 2 ? 3 : cores > 3 ? 4 : cores + 1 ))}
if [ "$workers" -gt 0 ]; then
  set -- -n "$workers" --dist loadgroup "$@"
fi
exec .venv/bin/python -m pytest "$@"
