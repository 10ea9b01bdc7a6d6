#!/usr/bin/env bash
# Checks Salus on a real NVIDIA GPU, in one command: sets up, builds (build-gpu/), runs the CUDA
# backend's C++ tests, the C++ demos on the GPU (--cuda), the PyTorch checks that print one summary
# line each (scripts/gpu_checks.py: kernels over Salus memory with the data checked, two jobs
# spilling to the host, OutOfMemory, record_stream, CUDA graphs, memory_stats, two GPUs), and the
# PyTorch tests and example on the GPU (python_bindings/tests/test_gpu.py,
# examples/pytorch_sharing.py) through .venv. Ends with the summary lines again.
# Without a GPU it says so and exits 0; with --dry-run it runs what needs no GPU (the CUDA
# backend's tests on the fake driver, the cross-process suite on the simulated backend) and says
# SKIP for the rest. Exits non-zero if any step failed.
#
# Environment: SALUS_JOBS (build parallelism, default 2). SALUS_GPU_PREBUILT=1 skips set-up and
# the build and uses the build-gpu/ that is there (a GPU machine with no network, given a tree
# built elsewhere); SALUS_GPU_PYTHON names the Python to use (default .venv/bin/python), which
# must import salus and a CUDA build of torch.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=build-gpu
PY=${SALUS_GPU_PYTHON:-.venv/bin/python}

log() { printf '\n[gpu-check] %s\n' "$*"; }

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

if ! command -v nvidia-smi >/dev/null 2>&1 || ! gpus=$(nvidia-smi -L 2>/dev/null) ||
   ! grep -q '^GPU ' <<<"$gpus"; then
  if [[ ${1:-} != --dry-run ]]; then
    echo "[gpu-check] no NVIDIA GPU found: skipping (--dry-run runs what needs none)"
    exit 0
  fi
  # What runs without a GPU, from the development build (build/): the CUDA backend's tests on
  # the fake driver and the cross-process suite on the simulated backend. The rest says SKIP.
  DRY=${SALUS_DRY_BUILD:-build}
  [[ -x $DRY/tests/salus_daemon_tests ]] || { echo "[gpu-check] no $DRY/: build it first"; exit 1; }
  log "no NVIDIA GPU: dry run of what needs none ($DRY/)"
  step "C++ CUDA backend tests (fake driver)" \
    ctest --test-dir "$DRY" --output-on-failure --timeout 900 -R 'Cuda|FencePool|DeviceIdentity|SalusdCapacity'
  step "salusd: the cross-process tests (simulated backend)" "./$DRY/tests/salus_daemon_tests"
  for skipped in "sharing_demo --cuda" "two_jobs_demo --cuda" "PyTorch checks (gpu_checks.py)" \
      "test_gpu.py" "pytorch_sharing.py on the GPU" "two_processes on the GPU" \
      "an unmodified script under salus run on the GPU" \
      "torchvision resnet18 with cudnn.benchmark under salus run" \
      "Ray trials as processes of a CUDA salusd"; do
    echo "SKIP $skipped: needs a GPU"
  done
  if ((${#failures[@]})); then
    printf '[gpu-check] %d step(s) failed: %s\n' "${#failures[@]}" "$(IFS=','; echo "${failures[*]}")"
    exit 1
  fi
  echo "[gpu-check] dry run passed"
  exit 0
fi
log "GPUs:"
printf '%s\n' "$gpus"

./scripts/gpu_build.sh
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
  # cuDNN's benchmark mode asks the allocator how large a workspace it could get (cacheInfo),
  # as torchvision's reference scripts and timm do: a torchvision model under salus run.
  step "torchvision resnet18 with cudnn.benchmark under salus run" bash -c '
    set -e; dir=$(mktemp -d)
    printf "%s\n" "import torch, torchvision" \
      "torch.backends.cudnn.benchmark = True" \
      "model = torchvision.models.resnet18(num_classes=10).cuda()" \
      "opt = torch.optim.SGD(model.parameters(), lr=0.01)" \
      "x = torch.randn(32, 3, 224, 224, device=\"cuda\")" \
      "y = torch.randint(0, 10, (32,), device=\"cuda\")" \
      "for _ in range(3):" \
      "    loss = torch.nn.functional.cross_entropy(model(x), y)" \
      "    opt.zero_grad(); loss.backward(); opt.step()" \
      "torch.cuda.synchronize()" \
      "print(\"cudnn.benchmark steps done, loss\", float(loss))" >"$dir/bench_mode.py"
    "$0" -m salus.cli run --socket "$dir/s.sock" --backend cuda --memory 4GiB -- "$0" "$dir/bench_mode.py"
    kill "$(cat "$dir/s.sock.lock")" 2>/dev/null || true
  ' "$PY"
  # Ray Tune's way on a GPU node: trials as processes of a CUDA salusd the cluster starts.
  step "Ray trials as processes of a CUDA salusd" "$PY" scripts/gpu_ray_trials.py
fi

echo
[[ -f $BUILD/gpu_checks.txt ]] && cat "$BUILD/gpu_checks.txt"
if ((${#failures[@]})); then
  printf '[gpu-check] %d step(s) failed: %s\n' "${#failures[@]}" "$(IFS=','; echo "${failures[*]}")"
  exit 1
fi
echo "[gpu-check] all GPU checks passed"
