#!/usr/bin/env bash
# What sharing costs: one table of ratios, each against a baseline measured in the same run
# (benchmarks/cost_table.py says which). Real-model training steps (plain PyTorch, Salus
# in-process, Salus connected to a salusd), alloc+free against glibc and PyTorch's allocator, the
# switch against a bare hand-over, turns between processes against in-process, trace replays,
# decisions per boundary, and the system calls, driver calls and thread hand-overs of a steady
# iteration, counted. About ten minutes on two cores.
#
#   scripts/bench.sh [--base REF] [--quick] [--out FILE] [cost_table.py options...]
#
# --base REF  also builds REF (a git worktree in build-compare/base-src, with this tree's
#             benchmark sources copied in) and measures it in the same run, beside this tree:
#             the before/after of a change. Its Python package goes to build-compare/base-site.
# --quick     one round of steps and one repetition of the microbenchmarks (a smoke test).
# --out FILE  also writes the table to FILE (default build-bench/cost_table.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
JOBS=${SALUS_JOBS:-2}
BASE=""
OUT=$ROOT/build-bench/cost_table.md
EXTRA=()
while (($#)); do
  case $1 in
    --base) BASE=$2; shift 2 ;;
    --quick) EXTRA+=(--rounds 1 --repetitions 1 --steps 10); shift ;;
    --out) OUT=$2; shift 2 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done

./scripts/setup.sh </dev/null

# The system-call counts per step read kernel tracepoints (benchmarks/python/step_cost.py), which
# need tracefs: mounted here when it is not and this is root; else those columns read n/a.
if [[ ! -d /sys/kernel/tracing/events/raw_syscalls ]] && ((EUID == 0)); then
  mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null &&
    echo "[bench] mounted tracefs at /sys/kernel/tracing (for the system-call counts)" ||
    echo "[bench] tracefs could not be mounted: the system-call columns will read n/a"
fi

TARGETS=(salus_microbench salus_torch_microbench salus_steady_counts)
build() {  # build SRC DIR
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DSALUS_BUILD_TESTS=OFF \
    -DSALUS_BUILD_EXAMPLES=OFF -DSALUS_PYTHON="$ROOT/.venv/bin/python" >"$2.configure.log" 2>&1 ||
    { cat "$2.configure.log"; exit 1; }
  local t
  for t in "${TARGETS[@]}"; do
    cmake --build "$2" -j "$JOBS" --target "$t" >"$2.build.log" 2>&1 ||
      { tail -n 40 "$2.build.log"; exit 1; }
  done
}
echo "[bench] building this tree (Release, build-bench/)"
build "$ROOT" "$ROOT/build-bench"

ARGS=(--build "$ROOT/build-bench" --python "$ROOT/.venv/bin/python" --label "$(git rev-parse --short HEAD)")
if [[ -n $BASE ]]; then
  CMP=$ROOT/build-compare
  mkdir -p "$CMP"
  if [[ -d $CMP/base-src ]]; then
    git -C "$CMP/base-src" checkout -q --force --detach "$BASE"
    git -C "$CMP/base-src" clean -qfdx -e build
  else
    git worktree add -q --detach "$CMP/base-src" "$BASE"
  fi
  # The base measures what this tree measures: its benchmark sources (the new programs build
  # against the older API where they can: see benchmarks/steady/steady_counts.cpp).
  cp benchmarks/alloc_trace.hpp "$CMP/base-src/benchmarks/"
  rm -rf "$CMP/base-src/benchmarks/torch" "$CMP/base-src/benchmarks/steady"
  cp -r benchmarks/torch benchmarks/steady "$CMP/base-src/benchmarks/"
  if ! grep -q salus_steady_counts "$CMP/base-src/benchmarks/CMakeLists.txt"; then
    sed -n '/^# salus_torch_microbench/,$p' benchmarks/CMakeLists.txt >>"$CMP/base-src/benchmarks/CMakeLists.txt"
  fi
  echo "[bench] building $BASE (Release, build-compare/base)"
  build "$CMP/base-src" "$CMP/base"
  echo "[bench] installing $BASE's Python package into build-compare/base-site"
  rm -rf "$CMP/base-site"
  .venv/bin/python -m pip install -q --no-build-isolation --no-deps --target "$CMP/base-site" \
    "$CMP/base-src" >"$CMP/base-site.log" 2>&1 || { tail -n 40 "$CMP/base-site.log"; exit 1; }
  ARGS+=(--base-build "$CMP/base" --base-pythonpath "$CMP/base-site"
         --base-salusd "$CMP/base-site/bin/salusd" --base-label "$BASE")
fi

echo "[bench] measuring"
.venv/bin/python benchmarks/cost_table.py "${ARGS[@]}" --out "$OUT" "${EXTRA[@]}"
echo "[bench] table written to $OUT"
