#!/usr/bin/env bash
# The counts of issue 21 ("one home for each idea"), for any checkout: every count is a grep or
# wc over src/, include/, python_bindings/ and tests/, so that it can be rerun at an old commit and
# compared. Prints one "name: value" line each.
#
#   scripts/architecture_counts.sh [DIR]   # DIR: a checkout (default: this one)
set -euo pipefail
cd "${1:-$(dirname "${BASH_SOURCE[0]}")/..}"

heap_files=$(ls src/memory/stream_heap*.hpp src/memory/stream_heap*.cpp)
echo "StreamHeap files: $(wc -w <<<"$heap_files")"
echo "StreamHeap lines: $(cat $heap_files | wc -l)"
# Declarations in the class header: a line ending in ';' with a parameter list.
echo "StreamHeap declared functions: $(grep -cE '^\s+[^/].*\(.*\).*;\s*$' src/memory/stream_heap.hpp)"
echo "StreamHeap mutexes: $(grep -cE 'std::mutex \w+;' src/memory/stream_heap.hpp)"
for f in job_ledger page_migrator page_table page_source quiet_epochs address_ranges heap_stream heap_arenas page_supply heap_tally; do
  [[ -f src/memory/$f.hpp ]] && echo "  split out: $f $(cat src/memory/$f.* | wc -l) lines"
done
echo "for_each_stream_heap loops: $(grep -rn 'for_each_stream_heap(' src | grep -vc 'void for_each_stream_heap')"
# Homes of "the thread's current job": files with thread_local job or attribution state in src/
# or the bindings (C++), and Python's thread-local state that names a job (a binding stack of job
# ids; after issue 21 Python keeps only the open C++ scopes, which hold no job id).
echo "thread-local current-job homes: $(grep -rlE 'thread_local.*([Jj]ob|ThreadJob|[Aa]ttribution)' src python_bindings/src | wc -l) C++ + $(grep -lE 'stack.append\(\(job_id' python_bindings/salus/*.py | wc -l) Python"
# Statistics written by hand: files that name a device statistic (allocation_waits) outside
# tests, docs and the statistics' own field list.
echo "files naming a device statistic: $(grep -rl 'allocation_waits' include src python_bindings/src python_bindings/salus | wc -l)"
# Fields of a device's statistics in C++, C and Python (by class counts once in C++, as
# persistent + ephemeral in C and Python).
python3 - <<'PY'
import re
def body(path, start, end="\n}"):
    text = open(path).read()
    i = text.find(start)
    return "" if i < 0 else text[i:text.index(end, i)]
listed = body("include/salus/stats_fields.h", "#define SALUS_DEVICE_STATS_FIELDS", "\n\n") \
    if __import__("os").path.exists("include/salus/stats_fields.h") else None
if listed is not None:
    n = len(re.findall(r"X\(", listed))
    cpp, c = n + 1, n + 2
else:
    strip = lambda t: re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", t, flags=re.S))
    cpp = len(re.findall(r"[\w\]]+\s*(?:=[^;]*)?;", strip(body("include/salus/memory.hpp", "struct DeviceMemoryStats {"))))
    c = len(re.findall(r"\w+\s*[,;]", strip(body("include/salus/c_api.h", "typedef struct salus_device_stats {")))) - 1
py = len(re.findall(r"^    \w+: ", body("python_bindings/salus/_runtime.py", "class DeviceStats:", "\n\n\n"), re.M))
print(f"device statistics fields: C++ {cpp}, C {c}, Python {py}")
PY
# Invariants written once per backend by hand (a file per backend) or once for all (tests/contract).
echo "fake-CUDA test files: $(ls tests/test_*_cuda_fake.cpp | wc -l) ($(cat tests/test_*_cuda_fake.cpp | wc -l) lines); their simulated twins: $(for f in tests/test_*_cuda_fake.cpp; do t=${f/_cuda_fake/}; [[ -f $t ]] && echo "$t"; done | wc -l)"
contract_suites=$(ls tests/contract/test_*.cpp 2>/dev/null)
echo "contract test files: $(echo "$contract_suites" | wc -l) ($(cat $contract_suites | wc -l) lines, each test run on every backend)"
# The backends of contract_backends(): a line '{"Name",' each.
echo "contract suites instantiated on backends: $(sed -n '/contract_backends() {/,/^}/p' tests/contract/backend_fixture.hpp | grep -oE '\{"[A-Za-z]+",' | tr -d '{",' | paste -sd ' ')"
echo "src files over 600 lines: $(find src -name '*.cpp' -o -name '*.hpp' | xargs wc -l | awk '$2 != "total" && $1 > 600 {printf "%s(%d) ", $2, $1}')"
# Functions over 50 lines: a brace scan (a block opened on a line ending ") {" at namespace or class
# level), not a parser, so read it as approximate.
python3 - <<'PY'
import re, sys, pathlib
def scan(root):
    out = []
    for f in sorted(pathlib.Path(root, "src").rglob("*.[ch]pp")):
        depth = 0; stack = []
        for n, line in enumerate(open(f), 1):
            code = re.sub(r'"(\\.|[^"\\])*"|\'(\\.|[^\'\\])*\'', '""', line.split("//")[0])
            for ch in code:
                if ch == "{":
                    kind = "ns" if re.match(r"\s*(namespace|extern \"C\")", code) else "blk"
                    stack.append((kind, n))
                elif ch == "}" and stack:
                    kind, start = stack.pop()
                    # a function body: a block whose enclosing blocks are namespaces or a class
                    if kind == "blk" and re.search(r"\)\s*(const\s*)?(noexcept\s*)?(override\s*)?(->.*)?\{\s*$", open(f).readlines()[start-1].split("//")[0]) and n - start + 1 > 50:
                        enclosing = [k for k, _ in stack]
                        if all(k == "ns" for k in enclosing) or len([k for k in enclosing if k == "blk"]) == 1:
                            out.append((n - start + 1, f"{f.relative_to(root)}:{start}"))
    return out
res = scan(".")
print(f"functions over 50 lines (approximate): {len(res)}" + "".join(f" {w}({l})" for l, w in sorted(res, reverse=True)))
PY
# Layering: libraries the build makes of src/ (one globbed object library before issue 21).
layers=$(grep -oE '^set\(SALUS_LAYERS [a-z ]+' src/CMakeLists.txt | cut -d' ' -f2- || true)
echo "libraries of src/: ${layers:-salus_objects (one, every layer)}"
# --- issue 35's counts ---------------------------------------------------------------------------
# Every file that defines a member of DeviceScheduler counts, with its header (before stop 47 this
# counted device_scheduler.{hpp,cpp} alone: 972 lines, where the class had 1,610 over 6 files).
ds_files=$(echo src/iteration_sched/device_scheduler.hpp; grep -l 'DeviceScheduler::' src/iteration_sched/*.cpp)
echo "DeviceScheduler lines: $(cat $ds_files | wc -l) over $(wc -w <<<"$ds_files") files"
# The parts split out of it, each owning its fields under a lock of its own. Since stop 49 the
# turn queue is LocalTurns (local_turns*), the scheduler a facade in front of it; since the queue
# was split, what the device learns of its jobs is JobProfiles', which the facade owns.
for f in stream_bindings iteration_clock memory_waits lane_streams job_profiles; do
  [[ -f src/iteration_sched/$f.hpp ]] && echo "  part with its own lock: $f $(cat src/iteration_sched/$f.* | wc -l) lines"
done
if [[ -f src/iteration_sched/local_turns.hpp ]]; then
  # The files that define its members (a definition starts a line; a comment naming one does not).
  lt_files=$(echo src/iteration_sched/local_turns.hpp; grep -lE '^[^/ ].*\bLocalTurns::' src/iteration_sched/*.cpp)
  echo "  part with its own lock: LocalTurns (the turn queue) $(cat $lt_files | wc -l) lines over $(wc -w <<<"$lt_files") files"
  echo "  LocalTurns fields under its mutex: $(sed -n '/mutable std::mutex mu_;/,/^};/p' src/iteration_sched/local_turns.hpp | grep -E '^\s+[A-Za-z0-9_:<>, ]+[ *&]\w+(\{[^}]*\}| = [^;]+)?;' | grep -cvE 'static |std::mutex ')"
  echo "  LocalTurns explicit lock()/unlock() calls: $(cat $lt_files | grep -cE '\.(un)?lock\(\)')"
  [[ -f src/iteration_sched/job_profile.hpp ]] && echo "  a value with no lock: job_profile $(cat src/iteration_sched/job_profile.* | wc -l) lines"
  # Its own parts: values its mutex guards, and the memory side of a turn (no lock, no state).
  for f in turn_jobs turn_decisions turn_waits; do
    [[ -f src/iteration_sched/$f.hpp ]] && echo "  part under LocalTurns' mutex: $f $(cat src/iteration_sched/$f.* | wc -l) lines"
  done
  [[ -f src/iteration_sched/turn_memory.hpp ]] && echo "  part with no lock and no state: turn_memory $(cat src/iteration_sched/turn_memory.* | wc -l) lines"
fi
# Fields guarded by the scheduler's one mutex: the members declared after it in the header (none
# once it is a facade with no mutex).
echo "DeviceScheduler fields under its mutex: $(sed -n '/mutable std::mutex mu_;/,/^};/p' src/iteration_sched/device_scheduler.hpp | grep -E '^\s+[A-Za-z0-9_:<>, ]+[ *&]\w+(\{[^}]*\}| = [^;]+)?;' | grep -cvE 'static |std::mutex ')"
[[ -f src/iteration_sched/turn_source.hpp ]] && echo "  turn sources (the interface and GatedTurns; no lock): $(cat src/iteration_sched/turn_source.* | wc -l) lines"
# Job asking which kind of turns it has (a connected runtime's gate) instead of its turn source.
echo "Job branches on the gate (runtime.cpp): $(grep -c 'gate()' src/iteration_sched/runtime.cpp)"
# Host compute as a flag read where it matters (on_host(), an atomic<bool> host_compute), against
# a strategy (ComputeSite) that each such place asks for the consequence it needs.
echo "host compute read as a flag in src/: $(grep -rnE '(^|[^_a-z])on_host\(\)|atomic<bool>> host_compute' src | wc -l)"
[[ -f src/iteration_sched/compute_site.hpp ]] &&
  echo "  compute sites (strategies): $(grep -cE '^class \w+ final : public ComputeSite' src/iteration_sched/compute_site.cpp)"
echo "DeviceScheduler explicit lock()/unlock() calls: $(cat $ds_files | grep -cE '\.(un)?lock\(\)')"
echo "files naming a job statistic (max_wait_seconds): $(grep -rl 'max_wait_seconds' include src python_bindings/src python_bindings/salus | wc -l)"
# A copy of a JobStats field written out by hand (`x.max_wait_seconds = y.max_wait_seconds`, or a
# binding's `py::arg("max_wait_seconds") = ...`): the lists of salus/stats_fields.h make the rest.
echo "JobStats copies written by hand (of max_wait_seconds): $(grep -rhE '\.max_wait_seconds = [A-Za-z_]+\.max_wait_seconds|"max_wait_seconds"\) = ' include src python_bindings/src | wc -l)"
echo "DeviceHeap& in PageTable/PageMigrator: $(cat src/memory/page_table.* src/memory/page_migrator.* 2>/dev/null | grep -c 'DeviceHeap&')"
echo "string comparisons that detect out of memory: $(grep -rnE '(==|!=) *"CUDA_ERROR_OUT_OF_MEMORY"' src | wc -l)"
# The Python core: every module of the package outside the glue (torch.py), bench/ and ray/.
core=$(ls python_bindings/salus/*.py | grep -vE '/(torch|__init__)\.py$')
echo "Python core modules importing the glue, bench or ray at module level: $(grep -lE '^(from \. import torch|from \.torch |import salus\.torch|from \.(bench|ray)|from salus\.(bench|ray|torch))' $core | wc -l)"
echo "benchmarks/RESULTS.md lines: $(wc -l <benchmarks/RESULTS.md)"
# Classes over 600 lines across their files: a class's files are the header that declares it and
# the .cpp files under src/ whose member definitions (`Name::f(`, at the start of a line) are mostly
# its own. Nested and helper types count with their header. A scan, not a parser: approximate.
python3 - <<'PY'
import collections, pathlib, re
src = pathlib.Path("src")
lines = {p: sum(1 for _ in open(p)) for p in src.rglob("*.[ch]pp")}
classes = {}
for h in src.rglob("*.hpp"):
    for m in re.finditer(r"^(?:class|struct) (\w+)(?: final)?\s*(?::(?!:)[^{;]*)?\{", open(h).read(), re.M):
        classes.setdefault(m.group(1), h)
files = collections.defaultdict(set)
for name, h in classes.items():
    files[name].add(h)
for p in lines:
    if p.suffix != ".cpp":
        continue
    defs = collections.Counter(m.group(1) for m in re.finditer(
        r"^[\w:<>,*& ]*?\b(\w+)::~?\w+\(", open(p).read(), re.M) if m.group(1) in classes)
    if defs:
        files[defs.most_common(1)[0][0]].add(p)
big = sorted(((sum(lines[f] for f in fs), name, len(fs)) for name, fs in files.items()), reverse=True)
print("classes over 600 lines (header + the .cpp files that define mostly its members): " +
      (", ".join(f"{name} {n} over {k} files" for n, name, k in big if n > 600) or "none"))
print("  the next largest: " + ", ".join([f"{name} {n}" for n, name, k in big if n <= 600][:12]))
PY
