#!/usr/bin/env bash
# The whole test suite: set up if needed, then pytest (extra arguments go to pytest).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
# The project's own bytecode too (setup.sh compiles what it installs): ranks import it at every start.
.venv/bin/python -m compileall -q hvdk8s mpijob data models bench >/dev/null || true
exec .venv/bin/python -m pytest "$@"
