#!/usr/bin/env bash
# Sets up, builds and runs the two-jobs demo (simulated GPUs unless --cuda is passed). Arguments
# go to the demo: ./scripts/demo.sh --iterations 5
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh </dev/null
mkdir -p build
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build/configure.log 2>&1 ||
  { cat build/configure.log; exit 1; }
cmake --build build -j "${SALUS_JOBS:-2}" --target two_jobs_demo
exec ./build/examples/two_jobs_demo "$@"
