#!/usr/bin/env python3
"""Runs two salus_microbench binaries side by side and prints medians as a Markdown table.

Issue 12's hot-path numbers come from this: the repetitions of the two binaries alternate
(after, before, after, before, ...), so load on a shared machine falls on both alike, and the
glibc rows, which measure nothing Salus changed, are measured in the same runs as a control.

    benchmarks/hotpath_compare.py AFTER_BINARY BEFORE_BINARY [--reps N] [--filter REGEX]
        [--min-time SECONDS] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

DEFAULT_FILTER = "BM_HotPair|BM_SchedulerDecisionMemoryAware/1000$"


def run_once(binary: Path, bench_filter: str, min_time: float, out: Path) -> None:
    subprocess.run(
        [str(binary), f"--benchmark_filter={bench_filter}",
         f"--benchmark_min_time={min_time}", "--benchmark_format=json",
         f"--benchmark_out={out}"],
        check=True, stdout=subprocess.DEVNULL)


def load(paths: list[Path]) -> dict[str, dict[str, list[float]]]:
    """Per benchmark name: its real and CPU times (ns) over the repetitions."""
    times: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        report = json.loads(path.read_text())
        for bench in report["benchmarks"]:
            scale = {"ns": 1.0, "us": 1e3, "ms": 1e6}[bench["time_unit"]]
            entry = times.setdefault(bench["name"], {"real": [], "cpu": []})
            entry["real"].append(bench["real_time"] * scale)
            entry["cpu"].append(bench["cpu_time"] * scale)
    return times


def load_average() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("after", type=Path)
    parser.add_argument("before", type=Path)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--filter", default=DEFAULT_FILTER)
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=Path("/tmp/salus-hotpath"))
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Path]] = {"after": [], "before": []}
    loads: list[str] = []
    for rep in range(1, args.reps + 1):
        for side in ("after", "before"):
            out = args.out / f"{side}.{rep}.json"
            loads.append(load_average())
            print(f"[hotpath] repetition {rep}/{args.reps}: {side}", file=sys.stderr)
            run_once(getattr(args, side), args.filter, args.min_time, out)
            runs[side].append(out)

    after, before = load(runs["after"]), load(runs["before"])
    print(f"load average (1 min) at the start of each run: {' '.join(loads)}\n")
    print("| benchmark | after real | after CPU | before real | before CPU "
          "| after/before (CPU) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, now in after.items():
        was = before.get(name)
        a_real, a_cpu = statistics.median(now["real"]), statistics.median(now["cpu"])
        if was is None:
            print(f"| {name} | {a_real:.1f} | {a_cpu:.1f} | - | - | - |")
            continue
        b_real, b_cpu = statistics.median(was["real"]), statistics.median(was["cpu"])
        print(f"| {name} | {a_real:.1f} | {a_cpu:.1f} | {b_real:.1f} | {b_cpu:.1f} "
              f"| {a_cpu / b_cpu:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
