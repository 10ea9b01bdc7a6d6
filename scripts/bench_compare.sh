#!/usr/bin/env bash
# Runs salus_microbench of the working tree and of an earlier commit side by side, in one run:
# each repetition runs the current build, then the base build, so load on the machine hits both
# alike. Prints a table of means and the ratio current/base.
#
#   scripts/bench_compare.sh [BASE_REF] [--filter REGEX] [--reps N]
#
# BASE_REF defaults to the commit before issue 8's fix (076faa8). The base is checked out into
# build-compare/base-src (a git worktree) with this tree's benchmarks/pressure_bench.cpp copied in,
# so the new benchmark measures the old code too. Release builds: build-compare/{head,base}.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BASE=076faa8
FILTER='BM_AllocFreePair|BM_RandomAllocations|BM_TraceReplay|BM_ReuseUnderPressure'
REPS=3
while (($#)); do
  case $1 in
    --filter) FILTER=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    *) BASE=$1; shift ;;
  esac
done
JOBS=${SALUS_JOBS:-2}
OUT=$ROOT/build-compare
mkdir -p "$OUT"

./scripts/setup.sh </dev/null
if [[ -d $OUT/base-src ]]; then
  git -C "$OUT/base-src" checkout -q --detach "$BASE"
else
  git worktree add -q --detach "$OUT/base-src" "$BASE"
fi
cp benchmarks/pressure_bench.cpp "$OUT/base-src/benchmarks/"

build() {  # build SRC DIR
  cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DSALUS_BUILD_TESTS=OFF \
    -DSALUS_BUILD_EXAMPLES=OFF >"$2.configure.log" 2>&1 || { cat "$2.configure.log"; exit 1; }
  cmake --build "$2" -j "$JOBS" --target salus_microbench >"$2.build.log" 2>&1 ||
    { tail -n 40 "$2.build.log"; exit 1; }
}
build "$ROOT" "$OUT/head"
build "$OUT/base-src" "$OUT/base"

for ((rep = 1; rep <= REPS; ++rep)); do
  for side in head base; do
    printf '[compare] repetition %d/%d: %s\n' "$rep" "$REPS" "$side"
    "$OUT/$side/benchmarks/salus_microbench" --benchmark_filter="$FILTER" \
      --benchmark_format=json --benchmark_out="$OUT/$side.$rep.json" >/dev/null
  done
done

python3 - "$OUT" "$REPS" "$BASE" <<'PY'
import json, sys, statistics
out, reps, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def load(side):
    runs = {}
    for rep in range(1, reps + 1):
        with open(f"{out}/{side}.{rep}.json") as f:
            for b in json.load(f)["benchmarks"]:
                runs.setdefault(b["name"], []).append(b)
    return runs
head, old = load("head"), load("base")
print(f"\nmeans of {reps} repetitions, real time; base = {base}\n")
print("| Benchmark | unit | current | base | current / base | current counters |")
print("|---|---|---:|---:|---:|---|")
for name, runs in head.items():
    unit = runs[0]["time_unit"]
    now = statistics.mean(r["real_time"] for r in runs)
    then = statistics.mean(r["real_time"] for r in old[name]) if name in old else float("nan")
    keys = ("deferred_unmaps", "allocation_waits", "cross_stream_pages", "reserved_over_live")
    counters = ", ".join(f"{k} {runs[-1][k]:.3g}" for k in keys if k in runs[-1])
    print(f"| {name} | {unit} | {now:.4g} | {then:.4g} | **{now / then:.2f}** | {counters} |")
PY
