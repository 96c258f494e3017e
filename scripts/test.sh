#!/usr/bin/env bash
# The whole test suite: set up if needed, then pytest (extra arguments go to pytest).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec .venv/bin/python -m pytest "$@"
