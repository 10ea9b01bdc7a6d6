#!/usr/bin/env bash
# build-gpu/ for scripts/gpu_check.sh and scripts/gpu_bench.sh: sets up and builds it, or, with
# SALUS_GPU_PREBUILT=1, checks that a tree built elsewhere is there (a GPU machine with no
# network). SALUS_JOBS: build parallelism (default 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=build-gpu
if [[ ${SALUS_GPU_PREBUILT:-0} == 1 ]]; then
  [[ -x $BUILD/tests/salus_tests && -x $BUILD/src/salusd ]] ||
    { echo "[gpu-build] SALUS_GPU_PREBUILT=1 but no built $BUILD/"; exit 1; }
  echo "[gpu-build] using the prebuilt $BUILD/ (no set-up, no build)"
  exit 0
fi
./scripts/setup.sh </dev/null
echo "[gpu-build] configure and build $BUILD/"
mkdir -p "$BUILD"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSALUS_BUILD_BENCHMARKS=OFF \
  >"$BUILD/configure.log" 2>&1 || { cat "$BUILD/configure.log"; exit 1; }
cmake --build "$BUILD" -j "${SALUS_JOBS:-2}"
