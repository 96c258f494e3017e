#!/usr/bin/env bash
# The main job: set up if needed, then train the digits classifier on 2 local Horovod ranks.
# Extra arguments go to `hvdk8s launch` (e.g. --gloo, --set training.epochs=5).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/setup.sh"
cd "$ROOT"
exec .venv/bin/hvdk8s launch --local -np 2 examples/digits.yaml "$@"
