#!/usr/bin/env bash
# Sets up, builds and runs the sharing demo: four jobs on one simulated GPU (a real one with
# --cuda). Arguments go to the demo: ./scripts/demo.sh --policy priority --iterations 50
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh </dev/null
mkdir -p build
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >build/configure.log 2>&1 ||
  { cat build/configure.log; exit 1; }
cmake --build build -j "${SALUS_JOBS:-2}" --target sharing_demo
exec ./build/examples/sharing_demo "$@"
