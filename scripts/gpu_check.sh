#!/usr/bin/env bash
# Checks Salus on a real NVIDIA GPU, in one command: sets up, builds (build-gpu/), runs the CUDA
# backend's C++ tests, the C++ demos on the GPU (--cuda), the PyTorch checks that print one summary
# line each (scripts/gpu_checks.py: kernels over Salus memory with the data checked, two jobs
# spilling to the host, OutOfMemory, record_stream, CUDA graphs, memory_stats, two GPUs), and the
# PyTorch tests and example on the GPU (python_bindings/tests/test_gpu.py,
# examples/pytorch_sharing.py) through .venv. Ends with the summary lines again.
# Without a GPU it says so and exits 0. Exits non-zero if any step failed.
#
# Environment: SALUS_JOBS (build parallelism, default 2). SALUS_GPU_PREBUILT=1 skips set-up and
# the build and uses the build-gpu/ that is there (a GPU machine with no network, given a tree
# built elsewhere); SALUS_GPU_PYTHON names the Python to use (default .venv/bin/python), which
# must import salus and a CUDA build of torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
JOBS=${SALUS_JOBS:-2}
BUILD=build-gpu
PY=${SALUS_GPU_PYTHON:-.venv/bin/python}
PREBUILT=${SALUS_GPU_PREBUILT:-0}

log() { printf '\n[gpu-check] %s\n' "$*"; }

if ! command -v nvidia-smi >/dev/null 2>&1 || ! gpus=$(nvidia-smi -L 2>/dev/null) ||
   ! grep -q '^GPU ' <<<"$gpus"; then
  echo "[gpu-check] no NVIDIA GPU found: skipping"
  exit 0
fi
log "GPUs:"
printf '%s\n' "$gpus"

failures=()
# step NAME COMMAND...: runs it, records a failure without stopping.
step() {
  local name=$1; shift
  log "$name"
  if "$@"; then
    log "ok: $name"
  else
    printf '[gpu-check] FAILED: %s\n' "$name" >&2
    failures+=("$name")
  fi
}

if [[ $PREBUILT == 1 ]]; then
  [[ -x $BUILD/tests/salus_tests ]] || { echo "[gpu-check] SALUS_GPU_PREBUILT=1 but no $BUILD/"; exit 1; }
  log "using the prebuilt $BUILD/ (no set-up, no build)"
else
  ./scripts/setup.sh </dev/null
  log "configure and build $BUILD/"
  mkdir -p "$BUILD"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSALUS_BUILD_BENCHMARKS=OFF \
    >"$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
  cmake --build "$BUILD" -j "$JOBS"
fi
rm -f "$BUILD/gpu_checks.txt"

# The CUDA backend's tests run against a fake driver (tests/support/fake_driver), so they check the
# backend's logic, not the GPU; on a machine with a driver, the "no driver here" test skips itself
# and the loader and linkage tests see the real libcuda.
export SALUS_LIBSALUS_PATH=$PWD/$BUILD/src/libsalus.so
export SALUSD=${SALUSD:-$PWD/$BUILD/src/salusd}  # the two_processes check and example use it
step "C++ CUDA backend tests" ctest --test-dir "$BUILD" --output-on-failure --timeout 900 -R 'Cuda'

# The C++ demos on the real GPU.
step "sharing_demo --cuda" "./$BUILD/examples/sharing_demo" --cuda --iterations 30 \
  --trace "$BUILD/salus_trace_gpu.json"
step "two_jobs_demo --cuda" "./$BUILD/examples/two_jobs_demo" --cuda --iterations 3

# Processes through salusd on the GPU: two C programs (C ABI) take turns, their pages CUDA
# allocations exported as POSIX file descriptors and imported in each process.
step "salusd: C programs take turns on the GPU" env SALUS_TEST_DAEMON_BACKEND=cuda \
  "./$BUILD/tests/salus_daemon_tests" --gtest_filter='Salusd.CProgramsTakeTurnsThroughTheCAbi'
# The rest of the cross-process suite on the GPU: turns under fair and priority, activation pages
# handed between processes, spilling to the host, clients killed at chosen moments, limits.
step "salusd: the cross-process tests on the GPU" env SALUS_TEST_DAEMON_BACKEND=cuda \
  "./$BUILD/tests/salus_daemon_tests" --gtest_filter='Salusd.*-Salusd.CProgramsTakeTurnsThroughTheCAbi'

# PyTorch on the GPU through Salus: needs the project's venv with a CUDA build of torch.
if [[ ! -x $PY ]] || ! "$PY" -c 'import salus.torch, torch' 2>/dev/null; then
  printf '[gpu-check] FAILED: %s has no salus and torch: make the venv and pip install . first\n' \
    "$PY" >&2
  failures+=("python environment")
elif ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  printf '[gpu-check] FAILED: the torch in %s does not see the GPU (a CPU-only wheel?)\n' \
    "$PY" >&2
  failures+=("torch.cuda.is_available()")
else
  step "PyTorch checks (scripts/gpu_checks.py)" \
    bash -c "set -o pipefail; '$PY' scripts/gpu_checks.py | tee '$BUILD/gpu_checks.txt'"
  step "pytest python_bindings/tests/test_gpu.py" \
    "$PY" -m pytest python_bindings/tests/test_gpu.py -v
  step "examples/pytorch_sharing.py on the GPU" "$PY" examples/pytorch_sharing.py \
    --iterations 20 --trace "$BUILD/salus_pytorch_trace_gpu.json"
  # Two PyTorch scripts in two processes, CUDA tensors in pages salusd exported to them.
  step "examples/two_processes on the GPU" env PYTHON="$PY" examples/two_processes/run.sh
  # A script that knows nothing of Salus, under `salus run` with a CUDA salusd of its own: its
  # weights must equal the same script's in plain PyTorch.
  step "an unmodified script under salus run on the GPU" bash -c '
    set -e; dir=$(mktemp -d); script=python_bindings/tests/unmodified_train.py
    "$0" "$script" --device cuda --steps 20 --out "$dir/alone.json"
    "$0" -m salus.cli run --socket "$dir/s.sock" --backend cuda --memory 2GiB --stats "$dir/stats.json" \
      -- "$0" "$script" --device cuda --steps 20 --out "$dir/shared.json"
    kill "$(cat "$dir/s.sock.lock")"
    cat "$dir/stats.json"; echo
    "$0" -c "import json, sys; a, b = (json.load(open(p))[\"weights\"] for p in sys.argv[1:]); \
      print(\"weights equal:\", a == b); sys.exit(a != b)" "$dir/alone.json" "$dir/shared.json"
  ' "$PY"
fi

echo
[[ -f $BUILD/gpu_checks.txt ]] && cat "$BUILD/gpu_checks.txt"
if ((${#failures[@]})); then
  printf '[gpu-check] %d step(s) failed: %s\n' "${#failures[@]}" "$(IFS=','; echo "${failures[*]}")"
  exit 1
fi
echo "[gpu-check] all GPU checks passed"
