#!/usr/bin/env python3
"""A round of turns between two processes against the same round in-process, run after run.

One run of salus_microbench measures both rounds side by side (BM_TurnPair_inprocess and
BM_TurnPair_processes); this repeats it, on every CPU and with every process pinned to one CPU,
and prints each run's times and ratio, then the medians. Two regimes, because on a VM a wake-up
across CPUs can cost 20 us or more and then decides the figure: pinned, every hand-over is a
context switch on one CPU and what is left is the switch path's own work.

    python3 benchmarks/turn_pairs.py build/benchmarks/salus_microbench --runs 8
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess


def one_run(binary: str, pin: bool, min_time: float) -> tuple[float, float]:
    """Nanoseconds per round (in-process, processes) from one run of the benchmark."""
    command = [binary, "--benchmark_filter=BM_TurnPair_(inprocess|processes)",
               f"--benchmark_min_time={min_time}", "--benchmark_format=json"]
    if pin:
        command = ["taskset", "-c", "0", *command]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    times = {b["name"].split("/")[0]: b["real_time"] for b in json.loads(out)["benchmarks"]}
    return times["BM_TurnPair_inprocess"], times["BM_TurnPair_processes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary", help="path to salus_microbench")
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--min-time", type=float, default=0.3)
    args = parser.parse_args()
    for pin in (True, False):
        label = "one CPU (taskset -c 0)" if pin else "every CPU"
        rows = [one_run(args.binary, pin, args.min_time) for _ in range(args.runs)]
        print(f"{label}: in-process us, processes us, ratio")
        for inproc, procs in rows:
            print(f"  {inproc / 1e3:7.1f} {procs / 1e3:7.1f} {procs / inproc:5.2f}x")
        inproc_median = statistics.median(r[0] for r in rows)
        procs_median = statistics.median(r[1] for r in rows)
        ratio_median = statistics.median(r[1] / r[0] for r in rows)
        print(f"  medians: {inproc_median / 1e3:.1f} us, {procs_median / 1e3:.1f} us; "
              f"ratio of medians {procs_median / inproc_median:.2f}x, "
              f"median ratio {ratio_median:.2f}x")


if __name__ == "__main__":
    main()
