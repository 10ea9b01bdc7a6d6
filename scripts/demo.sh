#!/usr/bin/env bash
# Sets up, builds and runs the sharing demo: four jobs on one simulated GPU (a real one with
# --cuda). Arguments go to the demo: ./scripts/demo.sh --policy priority --iterations 50
# Then, where the project's .venv has salus and torch, real PyTorch jobs share a GPU the same way
# (examples/pytorch_sharing.py, under the same --policy).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

./scripts/setup.sh </dev/null
mkdir -p build
# The flags scripts/test.sh builds build/ with (line tables only), so that the tests after the
# demo rebuild nothing the demo built.
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" >build/configure.log 2>&1 ||
  { cat build/configure.log; exit 1; }
cmake --build build -j "${SALUS_JOBS:-2}" --target sharing_demo
./build/examples/sharing_demo "$@"

if [[ -x .venv/bin/python ]] && .venv/bin/python -c 'import salus.torch, torch' 2>/dev/null; then
  policy=()
  args=("$@")
  for ((i = 0; i < ${#args[@]}; ++i)); do
    case ${args[i]} in
      --policy) policy=(--policy "${args[i + 1]:-fair}") ;;
      --policy=*) policy=(--policy "${args[i]#--policy=}") ;;
    esac
  done
  echo
  echo "=== The same with real PyTorch jobs (examples/pytorch_sharing.py) ==="
  .venv/bin/python examples/pytorch_sharing.py --iterations 10 "${policy[@]}"
fi
