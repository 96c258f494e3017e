#!/usr/bin/env bash
# Idempotent set-up of everything hvdk8s needs on a Debian machine: OpenMPI, cmake and a C++
# compiler from apt; a .venv with the pinned frameworks; Horovod built once from its sdist and cached
# outside the repository, so a second set-up (even in a fresh clone) takes seconds.
#
# Environment: PYTHON (interpreter for the venv, default python3: see below), HVDK8S_VENV (default ./.venv),
# HVDK8S_BUILD_CACHE (default ~/.cache/hvdk8s), HVDK8S_REBUILD_HOROVOD=1 to ignore the cached wheel.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVDK8S_VENV:-$ROOT/.venv}
CACHE=${HVDK8S_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hvdk8s}
# The interpreter: PYTHON, else python3 on PATH, but the distribution's build of the same version where
# that is another build (e.g. pyenv's): Debian's is built with PGO and LTO, and a pyenv build without
# them took 6-20 % more CPU for the same work (docs/contributing.md, "How long the suite takes").
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x /usr/bin/python3 ] && command -v python3 >/dev/null 2>&1; then
  same_version='import sys; print("%d.%d" % sys.version_info[:2])'
  if [ "$(python3 -c "$same_version")" = "$(/usr/bin/python3 -c "$same_version")" ]; then
    PY=/usr/bin/python3
  fi
fi
CONSTRAINTS=$ROOT/constraints.txt

say() { printf '\033[1m[setup]\033[0m %s\n' "$*" >&2; }
die() { printf '\033[1;31m[setup] error:\033[0m %s\n' "$*" >&2; exit 1; }
pin() { sed -n "s/^$1==//p" "$CONSTRAINTS"; }

# --- 1. system packages -------------------------------------------------------------------------
has_python_headers() {
  "$PY" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' 2>/dev/null
}
apt_needed=()
command -v mpirun >/dev/null 2>&1 || apt_needed+=(openmpi-bin)
command -v mpicxx >/dev/null 2>&1 || apt_needed+=(libopenmpi-dev)
command -v cmake >/dev/null 2>&1 || apt_needed+=(cmake)
command -v g++ >/dev/null 2>&1 || apt_needed+=(g++)
command -v make >/dev/null 2>&1 || apt_needed+=(make)
command -v "$PY" >/dev/null 2>&1 || apt_needed+=(python3)
"$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || apt_needed+=(python3-venv)
command -v kubectl >/dev/null 2>&1 || apt_needed+=(kubernetes-client)  # tests: `kubectl kustomize`
command -v prometheus >/dev/null 2>&1 || apt_needed+=(prometheus)  # tests: a real Prometheus scrapes the ranks
has_python_headers || apt_needed+=(python3-dev)
bash "$ROOT/scripts/apt-install.sh" setup "${apt_needed[@]}"

# --- 2. virtual environment ---------------------------------------------------------------------
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PY" -m venv "$VENV"; }
VPY=$VENV/bin/python
# --no-compile here; everything installed is compiled once at the end (see there).
pip_install() { "$VPY" -m pip install -q --no-compile --disable-pip-version-check -c "$CONSTRAINTS" "$@"; }

# Everything below is skipped when nothing it depends on changed since the last set-up.
stamp_key=$(cat "$CONSTRAINTS" "$ROOT/setup.py" "$ROOT/scripts/setup.sh" "$ROOT/scripts/cxx17" | sha256sum | cut -c1-16)
stamp=$VENV/.hvdk8s-setup
# (The stamp is written only after the full check at the end, so finding it is enough here.)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_key" ] && "$VPY" -c 'import hvdk8s' >/dev/null 2>&1; then
  say "up to date ($VENV)"
  exit 0
fi

# --- 3. Horovod, built once per (horovod, torch, tensorflow, python) and cached -----------------
hvd_version=$(pin horovod)
py_tag=$("$VPY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
build_key=$(printf '%s\n' "horovod=$hvd_version" "torch=$(pin torch)" "tf=$(pin tensorflow-cpu)" \
  "py=$py_tag" "arch=$(uname -m)" "$(cat "$ROOT/scripts/cxx17")" | sha256sum | cut -c1-12)
wheel_dir=$CACHE/wheels/horovod-$hvd_version-$build_key
wheel=$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -n1 || true)
frameworks=("torch==$(pin torch)" "tensorflow-cpu==$(pin tensorflow-cpu)")
if [ -z "$wheel" ] || [ "${HVDK8S_REBUILD_HOROVOD:-0}" = 1 ]; then
  # Horovod builds against the installed frameworks (--no-build-isolation), so they come first.
  say "installing ${frameworks[*]}"
  pip_install "${frameworks[@]}" setuptools wheel
  say "building Horovod $hvd_version with PyTorch, TensorFlow, MPI and Gloo (5-10 minutes, once per machine)"
  mkdir -p "$CACHE/wheels"
  tmp=$(mktemp -d "$CACHE/wheels/.build-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cmake_major=$(cmake --version | sed -n 's/^cmake version \([0-9]*\).*/\1/p')
  policy=()
  [ "${cmake_major:-3}" -ge 4 ] && policy=(CMAKE_POLICY_VERSION_MINIMUM=3.5)
  if ! env "${policy[@]}" \
      HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
      CXX="$ROOT/scripts/cxx17" MAKEFLAGS="-j$(nproc)" \
      "$VPY" -m pip wheel -v --no-deps --no-build-isolation --no-cache-dir \
        -w "$tmp" "horovod==$hvd_version" >"$tmp/build.log" 2>&1; then
    cp "$tmp/build.log" "$CACHE/wheels/build.log"
    tail -n 40 "$tmp/build.log" >&2
    die "Horovod build failed; the full log is $CACHE/wheels/build.log"
  fi
  cp "$tmp/build.log" "$CACHE/wheels/build.log"
  rm -rf "$wheel_dir"
  mkdir -p "$tmp/out" && mv "$tmp"/horovod-*.whl "$tmp/out/" && mv "$tmp/out" "$wheel_dir"
  wheel=$(ls "$wheel_dir"/horovod-*.whl | head -n1)
  "$VPY" -m pip uninstall -q -y horovod >/dev/null 2>&1 || true  # same version, new build: replace it
else
  say "using cached Horovod wheel $wheel"
fi
# Everything hvdk8s needs, pinned by what the last online install resolved, is kept as wheels so
# that set-ups in other clones on this machine install offline (pip's own cache is often disabled).
wheelhouse=$CACHE/wheelhouse-$(cat "$CONSTRAINTS" "$ROOT/setup.py" | sha256sum | cut -c1-12)
extras="$ROOT[torch,tensorflow,train,remote,validate,cluster,observe,bench,test]"
if [ -f "$wheelhouse/requirements.txt" ]; then
  say "installing from the local wheelhouse $wheelhouse"
  pip_install --no-index --find-links "$wheelhouse" -r "$wheelhouse/requirements.txt" "$wheel"
  pip_install --no-index --no-deps --no-build-isolation -e "$ROOT"
else
  # One resolver pass for everything: frameworks, the Horovod wheel (with its runtime needs), hvdk8s.
  say "installing ${frameworks[*]}, Horovod $hvd_version and hvdk8s (editable, with test tools)"
  # The newest earlier wheelhouse's versions, as constraints: without them pip's resolver can backtrack
  # for tens of minutes (boto3/botocore against s3fs's aiobotocore); with them it takes seconds. If they
  # no longer fit (a dependency changed its needs), resolve from scratch.
  previous=$(ls -t "$CACHE"/wheelhouse-*/requirements.txt 2>/dev/null | head -n 1 || true)
  # A fresh machine has none: the versions resolved when this file was last regenerated, committed.
  [ -n "$previous" ] || previous=$ROOT/scripts/resolved-versions.txt
  # constraints.txt wins: its pins are dropped from the earlier versions (a changed pin would conflict).
  earlier=$(mktemp)
  awk -F'==' 'function norm(s) { s = tolower(s); gsub(/[._]/, "-", s); return s }
              NR == FNR { if (NF == 2 && $1 !~ /^#/) pinned[norm($1)]; next }
              !(norm($1) in pinned)' "$CONSTRAINTS" "$previous" >"$earlier"
  if ! pip_install -c "$earlier" "${frameworks[@]}" "$wheel" -e "$extras"; then
    pip_install "${frameworks[@]}" "$wheel" -e "$extras"
  fi
  rm -f "$earlier"
  say "keeping the installed wheels in $wheelhouse for the next set-up"
  rm -rf "$wheelhouse.tmp" && mkdir -p "$wheelhouse.tmp"
  "$VPY" -m pip freeze --all --exclude-editable | grep -vE '^(horovod|pip)[ =@]' >"$wheelhouse.tmp/requirements.txt"
  if "$VPY" -m pip download -q --no-deps -d "$wheelhouse.tmp" -r "$wheelhouse.tmp/requirements.txt" >/dev/null 2>&1; then
    rm -rf "$wheelhouse" && mv "$wheelhouse.tmp" "$wheelhouse"
  else
    rm -rf "$wheelhouse.tmp"  # not fatal: the next set-up installs online again
  fi
fi

check_build='
import horovod, horovod.tensorflow as hf, horovod.torch as ht, tensorflow as tf, torch
missing = [n for n, ok in [("torch MPI", ht.mpi_built()), ("torch Gloo", ht.gloo_built()),
                           ("tensorflow MPI", hf.mpi_built()), ("tensorflow Gloo", hf.gloo_built())] if not ok]
if missing:
    raise SystemExit("Horovod built without: " + ", ".join(missing))
print(f"horovod {horovod.__version__}, torch {torch.__version__}, tensorflow {tf.__version__}")
'
# Bytecode for everything installed, once: Python would write it on first import, but not where
# PYTHONDONTWRITEBYTECODE is set (as on some CI machines), and then every rank compiled torch again at
# each start (import torch 6.2 s instead of 2.6 s; a 2-rank digits launch 18.8 s instead of 9.0 s).
# Measured here: 55 s on 2 cores, once per set-up.
say "compiling the installed packages' bytecode"
"$VPY" -m compileall -q -j 0 "$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true
versions=$(TF_CPP_MIN_LOG_LEVEL=3 "$VPY" -c "$check_build") || die "Horovod is installed but lacks a required part (see above)"
echo "$stamp_key" >"$stamp"
say "ready in ${SECONDS}s: $VENV ($versions)"
