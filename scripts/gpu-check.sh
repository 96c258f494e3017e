#!/usr/bin/env bash
# The GPU check of the tuning profiles (bench/gpu_check.py) on a machine with an NVIDIA GPU, CUDA's nvcc
# and a CUDA build of torch, offline: builds Horovod with NCCL from its source archive into a private
# folder (the build fixes of scripts/setup.sh and Dockerfile.gpu, plus scripts/nvcc17), installs hvdk8s
# beside it, and runs the check. Nothing is installed into the machine's own environment.
#
#   bash scripts/gpu-check.sh WHEELS OUT [gpu_check arguments]
#
# WHEELS holds horovod-<version>.tar.gz (or a Horovod wheel built on this machine before) and wheels of
# what the machine lacks: hvdk8s's requirements (pydantic and its own) and Horovod's build requirement
# cffi (with pycparser); OUT receives the report and build log.
# PYTHON (default python3) is the interpreter that holds torch. Without MPI on the machine, Horovod is
# built with Gloo only and the check starts its ranks with horovodrun --gloo.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: bash scripts/gpu-check.sh WHEELS OUT [gpu_check arguments]" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WHEELS=$(cd "$1" && pwd)
mkdir -p "$2" && OUT=$(cd "$2" && pwd)
shift 2
PY=${PYTHON:-python3}
WORK=${HVDK8S_GPU_WORK:-/tmp/hvdk8s-gpu}
SITE=$WORK/site
mkdir -p "$SITE"
now() { date +%s; }
t0=$(now)

# --- the toolkit: nvcc, its CUDA root, the GPU's compute capability, NCCL as torch loads it ------------
NVCC=$(command -v nvcc || true)
[ -n "$NVCC" ] || NVCC=/usr/local/cuda/bin/nvcc
[ -x "$NVCC" ] || { echo "gpu-check: nvcc not found (PATH, /usr/local/cuda/bin)" >&2; exit 2; }
NVCC=$(readlink -f "$NVCC")
CUDA_ROOT=$(dirname "$(dirname "$NVCC")")
SM=${HVDK8S_GPU_CC:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n1 | tr -d '. ')}
read -r NCCL_INCLUDE NCCL_LIB < <("$PY" - <<'EOF'
import glob, os
try:
    import nvidia.nccl as n  # torch's own NCCL (the nvidia-nccl wheel): Horovod must use the same library
    base = list(n.__path__)[0]
    print(os.path.join(base, "include"), os.path.join(base, "lib"))
except ImportError:
    lib = (glob.glob("/usr/lib/x86_64-linux-gnu/libnccl.so*") + [""])[0]
    print("/usr/include", os.path.dirname(lib) or "/usr/lib")
EOF
)
# CMake's find_library wants the unversioned names a pip-installed toolkit or NCCL does not ship.
LINKS=$WORK/links
mkdir -p "$LINKS"
for lib in "$NCCL_LIB"/libnccl.so.* "$CUDA_ROOT"/lib64/libcudart.so.* "$CUDA_ROOT"/lib/libcudart.so.*; do
  [ -e "$lib" ] && ln -sf "$lib" "$LINKS/$(basename "$lib" | sed 's/\.so\..*/.so/')"
done
echo "gpu-check: nvcc $NVCC ($("$NVCC" --version | tail -n1)), sm_$SM, NCCL $NCCL_INCLUDE $NCCL_LIB"
"$PY" -c "import torch; print('gpu-check: torch', torch.__version__, 'CUDA', torch.version.cuda,
                        torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no GPU visible')"

# --- hvdk8s and the requirements the machine lacks -------------------------------------------------
shopt -s nullglob
reqs=("$WHEELS"/*.whl)
hvd_wheels=("$WHEELS"/horovod-*.whl)
others=()
for w in "${reqs[@]}"; do [[ $(basename "$w") == horovod-* ]] || others+=("$w"); done
[ ${#others[@]} -eq 0 ] || "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "${others[@]}"
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target "$SITE" "$ROOT"
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH
export LD_LIBRARY_PATH=$NCCL_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "gpu-check: hvdk8s installed in $(( $(now) - t0 )) s"

# --- Horovod with NCCL ---------------------------------------------------------------------------
if [ ${#hvd_wheels[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "${hvd_wheels[0]}"
else
  sdist=$(ls "$WHEELS"/horovod-*.tar.gz | head -n1)
  if command -v mpicxx >/dev/null; then mpi=(HOROVOD_WITH_MPI=1); else mpi=(HOROVOD_WITHOUT_MPI=1); fi
  t1=$(now)
  # CUDACXX (not HOROVOD_CUDA_HOME, which would name nvcc itself) is the C++17 shim; CUDAToolkit_ROOT
  # tells CMake where the toolkit is, since the shim lives elsewhere. sm_$SM only: CUDA 13 refuses
  # Horovod's default list (sm_35 ...). (SM, not CC: the C compiler's variable, set there.)
  if ! env "${mpi[@]}" CUDACXX="$ROOT/scripts/nvcc17" HVDK8S_REAL_NVCC="$NVCC" CUDAToolkit_ROOT="$CUDA_ROOT" \
      CUDA_HOME="$CUDA_ROOT" PATH="$CUDA_ROOT/bin:$PATH" CMAKE_LIBRARY_PATH="$LINKS" \
      HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_INCLUDE="$NCCL_INCLUDE" HOROVOD_NCCL_LIB="$LINKS" \
      HOROVOD_NCCL_LINK=SHARED HOROVOD_BUILD_CUDA_CC_LIST="$SM" HOROVOD_WITHOUT_NVTX=1 \
      HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 \
      CXX="$ROOT/scripts/cxx17" CMAKE_POLICY_VERSION_MINIMUM=3.5 MAKEFLAGS="-j$(nproc)" \
      "$PY" -m pip wheel -v --no-index --no-deps --no-build-isolation -w "$WORK/wheel" "$sdist" \
      >"$OUT/horovod-build.log" 2>&1; then
    tail -n 40 "$OUT/horovod-build.log" >&2
    echo "gpu-check: Horovod's build failed (whole log: $OUT/horovod-build.log)" >&2
    exit 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --upgrade --target "$SITE" "$WORK"/wheel/horovod-*.whl
  echo "gpu-check: Horovod built with NCCL in $(( $(now) - t1 )) s (${mpi[0]})"
fi
"$PY" -c "import horovod.torch as h; print('gpu-check: horovod', __import__('horovod').__version__, 'nccl', h.nccl_built(), 'mpi', h.mpi_built(), 'gloo', h.gloo_built())"

# --- the check -----------------------------------------------------------------------------------
# Outside the clone: its hvdk8s/ folder would shadow the installed package (the layout maps bench/,
# models/, ... into hvdk8s only when installed).
cd "$WORK"
"$PY" -m hvdk8s.bench.gpu_check -d "$OUT" "$@"
echo "gpu-check: done in $(( $(now) - t0 )) s"
