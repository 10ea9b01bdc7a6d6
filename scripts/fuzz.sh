#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, build-fuzz/) and runs each for a bounded
# time from a copy of its checked-in seed corpus (tests/fuzz/corpus/<target>/; libFuzzer's new
# inputs go to the copy, never into the tree). Prints, per target, the executions, exec/s,
# coverage (cov/ft as libFuzzer prints them) and the corpus size, and whether it found anything:
# a crash input is copied to $SALUS_FUZZ_OUT/findings/ (the log names it). Exits non-zero on any
# finding or failed build. The last line per target is "[fuzz] RESULT <target> pass|fail" (test.sh
# counts them).
#
# Environment: SALUS_FUZZ_SECONDS (per C++ target, default 60), SALUS_FUZZ_PY_SECONDS (per Python
# target, default 30: the step must fit CI's budget), SALUS_FUZZ_TARGETS (default: all),
# SALUS_FUZZ_OUT (default build-fuzz/runs), SALUS_JOBS (build parallelism, default 2),
# SALUS_FUZZ_RSS_MB (libFuzzer's -rss_limit_mb, default 2048).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
JOBS=${SALUS_JOBS:-2}
SECONDS_PER_TARGET=${SALUS_FUZZ_SECONDS:-60}
RSS_MB=${SALUS_FUZZ_RSS_MB:-2048}
PY_SECONDS=${SALUS_FUZZ_PY_SECONDS:-30}
# C++ targets (libFuzzer) and Python ones (py_*: atheris, tests/fuzz/python/fuzz_bench_inputs.py).
# shellcheck disable=SC2206  # a space-separated list from the environment
TARGETS=(${SALUS_FUZZ_TARGETS:-fuzz_c_api fuzz_workloads_csv fuzz_runtime_options fuzz_salusd py_experiment py_workloads})
CXX_TARGETS=()
for t in "${TARGETS[@]}"; do [[ $t == py_* ]] || CXX_TARGETS+=("$t"); done
BUILD=$ROOT/build-fuzz
OUT=${SALUS_FUZZ_OUT:-$BUILD/runs}
log() { printf '[fuzz] %s\n' "$*"; }

CLANGXX=${SALUS_FUZZ_CXX:-clang++}
CLANG=${SALUS_FUZZ_CC:-clang}
command -v "$CLANGXX" >/dev/null 2>&1 || { log "clang++ not found (scripts/setup.sh installs it)"; exit 1; }
LAUNCHER=()
command -v ccache >/dev/null 2>&1 &&
  LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

# Only the library and the targets: no tests, benchmarks, examples or torch are built (the tests'
# folder is configured, since the targets live there, but only the targets are built).
# SALUS_FUZZ_BUILD: a tree configured already with the fuzzers on (scripts/test.sh's build-asan/,
# clang with -fsanitize=fuzzer-no-link,address,undefined), whose targets are used instead.
if [[ -n ${SALUS_FUZZ_BUILD:-} ]]; then
  BUILD=$SALUS_FUZZ_BUILD
  OUT=${SALUS_FUZZ_OUT:-$BUILD/fuzz-runs}
  log "using the targets of $BUILD"
fi
mkdir -p "$BUILD"
# -O1 and line tables only: the usual fuzzing build, and about half the compile time of -O2 -g
# (the step's time budget in CI is mostly this build).
FLAGS="-O1 -gline-tables-only -fsanitize=fuzzer-no-link"
if [[ -n ${SALUS_FUZZ_BUILD:-} ]]; then
  : # configured by its maker
elif log "configure and build $BUILD (clang, -fsanitize=fuzzer-no-link,address,undefined)" &&
   ! cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Fuzz \
     -DCMAKE_C_COMPILER="$CLANG" -DCMAKE_CXX_COMPILER="$CLANGXX" "${LAUNCHER[@]}" \
     "-DSALUS_SANITIZE=address;undefined" \
     -DCMAKE_CXX_FLAGS="$FLAGS" -DCMAKE_C_FLAGS="$FLAGS" \
     -DSALUS_BUILD_FUZZERS=ON -DSALUS_BUILD_BENCHMARKS=OFF -DSALUS_BUILD_EXAMPLES=OFF \
     -DSALUS_BUILD_TORCH=OFF -DSALUS_BUILD_PYTHON=OFF >"$BUILD/configure.log" 2>&1; then
  cat "$BUILD/configure.log"
  for t in "${TARGETS[@]}"; do log "RESULT $t fail (configure)"; done
  exit 1
fi
build_start=$SECONDS
if ((${#CXX_TARGETS[@]})) && ! cmake --build "$BUILD" -j "$JOBS" --target "${CXX_TARGETS[@]}"; then
  for t in "${TARGETS[@]}"; do log "RESULT $t fail (build)"; done
  exit 1
fi
log "build: $((SECONDS - build_start)) s"

# ASan reports leaks at exit; UBSan stops at the first report (so libFuzzer sees a crash).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
mkdir -p "$OUT/findings"
found=0
for t in "${TARGETS[@]}"; do
  corpus=$OUT/corpus/$t
  rm -rf "$corpus" "$OUT/artifacts/$t"
  mkdir -p "$corpus" "$OUT/artifacts/$t"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  # Known crash inputs are seeds too: a fix that regressed shows at once.
  find tests/fuzz/regressions/"$t" -type f ! -name .gitkeep -exec cp {} "$corpus"/ \;
  logfile=$OUT/$t.log
  if [[ $t == py_* ]]; then
    if [[ ! -x .venv/bin/python ]]; then
      log "$t: not run: .venv is missing (scripts/setup.sh makes it)"
      log "RESULT $t fail"
      found=1
      continue
    fi
    runner=(.venv/bin/python tests/fuzz/python/fuzz_bench_inputs.py "${t#py_}")
    budget=$PY_SECONDS
  else
    runner=("$BUILD/tests/fuzz/$t")
    budget=$SECONDS_PER_TARGET
  fi
  log "$t: ${budget}s from $(ls "$corpus" | wc -l) seeds (log: $logfile)"
  status=0
  "${runner[@]}" "$corpus" -max_total_time="$budget" -rss_limit_mb="$RSS_MB" \
    -timeout=25 -max_len=4096 -print_final_stats=1 -artifact_prefix="$OUT/artifacts/$t/" \
    >"$logfile" 2>&1 || status=$?
  [[ $t != py_* ]] || grep -m1 '^engine:' "$logfile" | sed "s/^/[fuzz] $t: /" || true
  # The last status line: "#N DONE cov: C ft: F corp: K/S exec/s: E ..." (or the last pulse).
  last=$(grep -E '^#[0-9]+' "$logfile" | tail -n1 || true)
  execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$logfile" | grep -oE '[0-9]+$' || echo "?")
  rate=$(grep -oE '^stat::average_exec_per_sec: *[0-9]+' "$logfile" | grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' <<<"$last" || echo "cov: ? ft: ?")
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' <<<"$last" || echo "corp: ?")
  log "$t: $execs executions, $rate exec/s, $cov, $corp"
  # crash-, leak-, timeout- and oom- files are findings; slow-unit- files (an input that took over
  # 10 s) are only named.
  for slow in $(find "$OUT/artifacts/$t" -type f -name 'slow-unit-*' | sort); do
    log "$t: slow input (not a failure): $slow"
  done
  crashes=$(find "$OUT/artifacts/$t" -type f ! -name 'slow-unit-*' | sort)
  if ((status != 0)) || [[ -n $crashes ]]; then
    found=1
    grep -E 'ERROR: |fuzz check failed|runtime error|SUMMARY' "$logfile" | head -n 5 | sed 's/^/[fuzz]   /' || true
    for c in $crashes; do
      cp "$c" "$OUT/findings/$t-$(basename "$c")"
      log "$t: FOUND $(basename "$c") -> $OUT/findings/$t-$(basename "$c")"
    done
    [[ -n $crashes ]] || log "$t: libFuzzer exited with status $status (see $logfile)"
    log "RESULT $t fail"
  else
    log "$t: nothing found"
    log "RESULT $t pass"
  fi
done
exit "$found"
