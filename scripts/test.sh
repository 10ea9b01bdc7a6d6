#!/usr/bin/env bash
# Runs every test: the suite in a normal build, again under AddressSanitizer + UBSan, the
# concurrency tests under ThreadSanitizer, the "no libcuda" link check, an install consumer
# (CMake package and pkg-config), and the Python package's pytest suite (real PyTorch). Ends with one summary line; exits non-zero if anything failed.
#
# Environment: SALUS_JOBS (build parallelism, default 2), SALUS_SKIP_SANITIZERS=1 to skip the
# ASan/UBSan and TSan builds (for a quick local run; CI runs everything), SALUS_SKIP_FUZZ=1 to skip
# the fuzzing step (scripts/fuzz.sh; SALUS_FUZZ_SECONDS per C++ target and SALUS_FUZZ_PY_SECONDS
# per Python one, default 15 each here so that CI stays within its budget, 60 and 30 when fuzz.sh
# runs alone).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
JOBS=${SALUS_JOBS:-2}
START=$SECONDS

./scripts/setup.sh </dev/null

passed=0
failed=0
failures=()
# Each step says when it began (minutes:seconds since the start, set-up included): where a
# run's time goes, for the CI budget.
log() { printf '\n[test %dm%02ds] %s\n' $(((SECONDS - START) / 60)) $(((SECONDS - START) % 60)) "$*"; }
pass() { passed=$((passed + ${2:-1})); }
fail() { failed=$((failed + ${2:-1})); failures+=("$1"); printf '[test] FAILED: %s\n' "$1" >&2; }

# configure_and_build DIR [cmake args...]
configure_and_build() {
  local dir=$1; shift
  mkdir -p "$dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >"$dir/configure.log" 2>&1 ||
    { cat "$dir/configure.log"; return 1; }
  cmake --build "$dir" -j "$JOBS"
}

# run_ctest LABEL DIR [ctest args...]: counts the tests ctest ran, from its summary line.
run_ctest() {
  local label=$1 dir=$2; shift 2
  local out status=0
  out=$(mktemp)
  (cd "$dir" && "${CTEST_WRAPPER[@]}" ctest --output-on-failure --timeout 900 "$@") 2>&1 | tee "$out" ||
    status=$?
  local summary total bad names
  summary=$(grep -E 'tests passed, [0-9]+ tests? failed out of [0-9]+' "$out" | tail -n1 || true)
  # The names of the failed tests, so that the last lines of the log (all CI shows) say which.
  names=$(sed -n '/The following tests FAILED:/,$p' "$out" | grep -E '^[[:space:]]+[0-9]+ - ' |
    sed -E 's/^[[:space:]]+[0-9]+ - //' | paste -sd';' - || true)
  rm -f "$out"
  slowest "$dir" || true
  if [[ -z $summary ]]; then fail "$label: ctest did not finish"; return; fi
  bad=$(sed -E 's/.* ([0-9]+) tests? failed out of.*/\1/' <<<"$summary")
  total=$(sed -E 's/.*out of ([0-9]+).*/\1/' <<<"$summary")
  ((total > 0)) || { fail "$label: no tests ran"; return; }
  pass "$label" $((total - bad))
  if ((bad > 0 || status != 0)); then
    fail "$label: ${names:-ctest exited with status $status}" "$((bad > 0 ? bad : 1))"
    ctest_details "$dir" "$names"
  fi
}
CTEST_WRAPPER=()

# slowest DIR: the eight longest tests of the ctest run just ended, for the CI budget.
slowest() {
  local log=$1/Testing/Temporary/LastTest.log
  [[ -f $log ]] || return 0
  echo "[test] slowest in $1:"
  awk '/^[0-9]+\/[0-9]+ Testing: /{name=$3} /^Test time = /{printf "  %7.2f s  %s\n", $4, name}' "$log" |
    sort -rn | awk 'NR <= 8'  # (awk reads to the end: head would end sort with SIGPIPE)
}

# Why each failure failed: its output's last lines, printed just above the summary at the end,
# since CI shows only the end of the log.
DETAILS=$(mktemp)
# detail TITLE: stdin's last 30 lines under TITLE, for the end of the log.
detail() { { printf -- '--- %s (last lines)\n' "$1"; tail -n 30; } >>"$DETAILS"; }
# ctest_details DIR NAMES: each failed test's output, from ctest's log of the run just ended.
ctest_details() {
  local log=$1/Testing/Temporary/LastTest.log name
  [[ -f $log ]] || return 0
  while IFS= read -r name; do
    [[ -n $name ]] || continue
    name=${name% (*}    # "Soak.x (Failed)" -> "Soak.x"
    name=${name%%  #*}  # "Suite/T.x/fair  # GetParam() = ..." -> "Suite/T.x/fair"
    awk -v n="Testing: $name" 'index($0, n) && length($0) == index($0, n) + length(n) - 1 {on = 1}
      on {print} on && /^<end of output>/ {exit}' "$log" | detail "$name"
  done < <(tr ';' '\n' <<<"$2")
}

# run_suite LABEL DIR [ctest args...]: the tests two at a time, then those labelled soak
# (tests/soak) two at a time. The tests assert what Salus guarantees, not timings of an idle
# machine, so a neighbour on the other core changes nothing they check (they pass beside two busy
# loops too); the soaks run for a fixed time whatever their speed, so they go apart from the
# others, whose work they would only slow.
run_suite() {
  local label=$1 dir=$2; shift 2
  run_ctest "$label" "$dir" "$@" -LE soak -j 2
  run_ctest "$label, soak" "$dir" "$@" -L soak -j 2
}

# --- 1. normal build: every test, the link check, the demo's build -------------------------------
log "build/: configure, build, test"
mkdir -p build
# Line tables only (-g1), as the sanitizer builds: a test's object compiles about a quarter faster
# than with full debug information (11.2 s -> 8.1 s for tests/test_runtime.cpp), with file:line
# still in every backtrace.
if configure_and_build build "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
     "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"; then
  if ldd build/src/libsalus.so | grep -q libcuda; then
    ldd build/src/libsalus.so
    fail "libsalus.so links libcuda"
  else
    log "ldd build/src/libsalus.so: no libcuda"
    pass "libsalus.so does not link libcuda"
  fi
  export SALUS_LIBSALUS_PATH=$ROOT/build/src/libsalus.so  # read by CudaLinkage.* too
  # The soaks run in the sanitizer trees (steps 4 and 5), where a race or a leak they provoke is
  # caught: here they would add 70 s of the same runs without those checks. They run here only
  # when the sanitizer trees do not.
  if [[ ${SALUS_SKIP_SANITIZERS:-0} == 1 ]]; then
    run_suite "tests (build/)" build
  else
    run_ctest "tests (build/)" build -LE soak -j 2
  fi
else
  fail "build/ did not build"
fi

# --- 2. install, then use it from a separate project ---------------------------------------------
log "install into a temporary prefix and build a consumer against it"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
if [[ -f build/src/libsalus.so ]] && cmake --install build --prefix "$TMP/prefix" >/dev/null; then
  if cmake -S tests/install_consumer -B "$TMP/consumer" -DCMAKE_PREFIX_PATH="$TMP/prefix" \
       -DCMAKE_BUILD_TYPE=Release >/dev/null &&
     cmake --build "$TMP/consumer" -j "$JOBS" && "$TMP/consumer/salus_install_consumer"; then
    pass "install consumer (find_package)"
  else
    fail "install consumer (find_package)"
  fi
  pc_dir=$(dirname "$(find "$TMP/prefix" -name salus.pc | head -n1)")
  libdir=$(PKG_CONFIG_PATH=$pc_dir pkg-config --variable=libdir salus)
  # shellcheck disable=SC2046  # pkg-config's flags are meant to split into words
  if g++ tests/install_consumer/main.cpp -o "$TMP/consumer_pc" \
       $(PKG_CONFIG_PATH=$pc_dir pkg-config --cflags --libs salus) &&
     LD_LIBRARY_PATH=$libdir "$TMP/consumer_pc"; then
    pass "install consumer (pkg-config)"
  else
    fail "install consumer (pkg-config)"
  fi
  # The C ABI from C: compiled as C11 against the installed header only.
  # shellcheck disable=SC2046
  # (salus.pc's Cflags carry -std=c++20 for the C++ headers; C takes only the include path.)
  if gcc -std=c11 -Wall -Wextra -Wpedantic -Werror tests/c_program/two_jobs.c -o "$TMP/c_program" \
       -I"$(PKG_CONFIG_PATH=$pc_dir pkg-config --variable=includedir salus)" \
       $(PKG_CONFIG_PATH=$pc_dir pkg-config --libs salus) -pthread &&
     LD_LIBRARY_PATH=$libdir "$TMP/c_program"; then
    pass "C program against the installed header (pkg-config)"
  else
    fail "C program against the installed header (pkg-config)"
  fi
else
  fail "cmake --install"
fi

# --- 3. Python: the salus package and PyTorch through it (pytest) ----------------------------------
# setup.sh installed the package into .venv from this tree. pytest's summary line is counted.
log "python: pytest (the salus package, PyTorch on the simulated backend)"
run_pytest() {
  local out status=0
  out=$(mktemp)
  # -rfE: pytest's short summary names each failure and error (a teardown's too).
  .venv/bin/python -m pytest -q -rfE --durations=12 -p no:cacheprovider python_bindings/tests 2>&1 | tee "$out" ||
    status=$?
  local summary ok bad names
  summary=$(grep -E '[0-9]+ (passed|failed|errors?)' "$out" | tail -n1 || true)
  names=$(grep -E '^(FAILED|ERROR) ' "$out" | cut -c1-240 | paste -sd';' - || true)
  # Each failure's section of pytest's report ("____ test_x ____" up to the next one).
  if [[ -n $names ]]; then
    awk '/^_{3,} .* _{3,}$/ {on = 1} /^=+ short test summary/ {on = 0} on {print}' "$out" |
      tail -n 60 | detail "pytest failures"
  fi
  rm -f "$out"
  ok=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+' || echo 0)
  bad=0
  for n in $(grep -oE '[0-9]+ (failed|errors?)' <<<"$summary" | grep -oE '^[0-9]+' || true); do
    bad=$((bad + n))
  done
  ((ok > 0)) || { fail "pytest: no tests ran"; return; }
  pass "pytest" "$ok"
  if ((bad > 0 || status != 0)); then
    fail "pytest (status $status; $summary): ${names:-no test named}" "$((bad > 0 ? bad : 1))"
  fi
}
if [[ -x .venv/bin/python ]]; then
  run_pytest
else
  fail "pytest: .venv is missing (setup.sh makes it)"
fi
if [[ -x build/examples/libtorch_two_jobs ]]; then
  if build/examples/libtorch_two_jobs >/dev/null; then
    pass "libtorch program (two jobs through salus_torch)"
  else
    fail "libtorch program (two jobs through salus_torch)"
  fi
fi

# --- 3b. fuzzing: each libFuzzer target for a bounded time from its seed corpus --------------------
# scripts/fuzz.sh prints "[fuzz] RESULT <target> pass|fail" per target; each counts once. run_fuzz
# [TREE]: the targets of TREE (build-asan/, built with them), or of fuzz.sh's own build-fuzz/.
run_fuzz() {
  log "fuzzing: scripts/fuzz.sh (${SALUS_FUZZ_SECONDS:-15}s per C++ target${1:+, the targets of $1})"
  local fuzz_out
  fuzz_out=$(mktemp)
  SALUS_FUZZ_BUILD=${1:-} SALUS_FUZZ_SECONDS=${SALUS_FUZZ_SECONDS:-15} \
    SALUS_FUZZ_PY_SECONDS=${SALUS_FUZZ_PY_SECONDS:-15} ./scripts/fuzz.sh 2>&1 | tee "$fuzz_out" || true
  while read -r _ _ target result _; do
    if [[ $result == pass ]]; then pass "fuzz $target"; else fail "fuzz $target"; fi
  done < <(grep -E '^\[fuzz\] RESULT ' "$fuzz_out" || true)
  grep -qE '^\[fuzz\] RESULT ' "$fuzz_out" || fail "fuzz: scripts/fuzz.sh ran no target"
  rm -f "$fuzz_out"
}
FUZZ=1
[[ ${SALUS_SKIP_FUZZ:-0} != 1 ]] || { FUZZ=0; log "fuzzing skipped (SALUS_SKIP_FUZZ=1)"; }

# --- 4. AddressSanitizer + UndefinedBehaviorSanitizer ---------------------------------------------
# -O1 and line tables only (the usual sanitizer build): about half the compile time of -O2 -g
# under ASan+UBSan (27.7 s -> 13.7 s for tests/test_runtime.cpp), with file:line in every report.
SANITIZER_ARGS=(-DSALUS_BUILD_BENCHMARKS=OFF -DSALUS_BUILD_EXAMPLES=OFF -DSALUS_BUILD_TORCH=OFF
                "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
                "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
# The sanitizer trees are clang's where it is installed (setup.sh installs it, for the fuzzers): it
# compiles a test under ASan+UBSan in half GCC's time (9.5 s against 19.7 s for
# tests/test_runtime.cpp; build-asan/ in 6m25 against about 10m50), and its UBSan checks more (a
# load of a value outside an enum's range). build/ stays GCC's, so both compilers build every file.
SANITIZER_CXX=g++
if command -v clang++ >/dev/null 2>&1 && command -v clang >/dev/null 2>&1; then
  SANITIZER_CXX=clang++
  SANITIZER_ARGS+=(-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++)
fi
# With clang, build-asan/ carries libFuzzer's coverage hooks in the library's code
# (SALUS_FUZZ_COVERAGE) and builds the fuzz targets too, so that the fuzzing step needs no build of
# its own (build-fuzz/ took 223 s of CI's time): the tests run as before, the hooks only count
# edges for a fuzzer that is not there.
ASAN_ARGS=("${SANITIZER_ARGS[@]}" "-DSALUS_SANITIZE=address;undefined")
FUZZ_TREE=
if ((FUZZ)) && [[ $SANITIZER_CXX == clang++ ]]; then
  FUZZ_TREE=$ROOT/build-asan
  ASAN_ARGS+=(-DSALUS_BUILD_FUZZERS=ON -DSALUS_FUZZ_COVERAGE=ON)
fi
if [[ ${SALUS_SKIP_SANITIZERS:-0} != 1 ]]; then
  log "build-asan/: AddressSanitizer + UndefinedBehaviorSanitizer ($SANITIZER_CXX)"
  mkdir -p build-asan
  if configure_and_build build-asan "${ASAN_ARGS[@]}"; then
    export SALUS_LIBSALUS_PATH=$ROOT/build-asan/src/libsalus.so
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0} \
      UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
      run_suite "tests (ASan+UBSan)" build-asan
    if ((FUZZ)); then run_fuzz "$FUZZ_TREE"; fi
  else
    fail "build-asan/ did not build"
  fi

  # --- 5. ThreadSanitizer, on the tests whose point is concurrency ---------------------------------
  # Kernels with 32 bits of mmap randomization break TSan's memory layout ("unexpected memory
  # mapping"); turning off randomization for the test processes (setarch -R) avoids it.
  log "build-tsan/: ThreadSanitizer (concurrency tests)"
  probe=$TMP/tsan_probe
  printf '#include <thread>\nint main() { int x = 0; std::thread t([&] { x = 1; }); t.join(); return x - 1; }\n' \
    >"$probe.cpp"
  tsan_ok=1
  if ! "$SANITIZER_CXX" -fsanitize=thread -pthread "$probe.cpp" -o "$probe" 2>/dev/null; then
    tsan_ok=0
  elif ! "$probe" >/dev/null 2>&1; then
    if setarch "$(uname -m)" -R "$probe" >/dev/null 2>&1; then
      log "TSan needs address randomization off on this kernel: running its tests under setarch -R"
      CTEST_WRAPPER=(setarch "$(uname -m)" -R)
    else
      tsan_ok=0
    fi
  fi
  if ((tsan_ok)); then
    mkdir -p build-tsan
    if configure_and_build build-tsan "${SANITIZER_ARGS[@]}" -DSALUS_SANITIZE=thread; then
      TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
        run_suite "tests (TSan)" build-tsan -R "$(head -n1 tests/thread_tests.regex)"
    else
      fail "build-tsan/ did not build"
    fi
    CTEST_WRAPPER=()
  else
    fail "ThreadSanitizer does not work on this machine (a probe program fails even under setarch -R)"
  fi
else
  log "sanitizer builds skipped (SALUS_SKIP_SANITIZERS=1)"
  if ((FUZZ)); then run_fuzz; fi
fi

elapsed=$((SECONDS - START))
log "done in $((elapsed / 60))m$((elapsed % 60))s"
[[ -s $DETAILS ]] && cat "$DETAILS"
rm -f "$DETAILS"
for f in "${failures[@]}"; do printf '[test] failed: %s\n' "$f"; done
printf '%d passed, %d failed\n' "$passed" "$failed"
((failed == 0))
