#!/usr/bin/env python3
"""What sharing costs, side by side in one run: the table scripts/bench.sh prints.

Every row is a ratio of Salus against a baseline measured in the same run, the two alternating
(each repetition runs both, so load on the machine hits both alike); the figure is the median of
the repetitions' ratios. With ``--base-*`` an older build of Salus (scripts/bench.sh --base REF)
is measured in the same run too, against the same baselines, and its ratios stand beside.

Rows:
  * real-model steps (benchmarks/python/step_cost.py): plain PyTorch against Salus in-process and
    connected to a salusd, each arm in an interpreter of its own;
  * alloc+free pairs against glibc (the DL size mix) and against PyTorch's own allocator (a GPT-2
    and a ResNet-18 trace through c10's allocator interface);
  * the switch against a bare condition-variable hand-over, and a round of turns between two
    processes against the same round in-process;
  * trace replays through the runtime against glibc, and the synthetic ones (no baseline: the
    --base column says whether they moved);
  * the decision core's cost per iteration boundary at 1,000 jobs;
  * counts, not times: system calls, futex calls, voluntary context switches and page faults per
    step, and the driver calls, stream-thread tasks and page maps of a steady iteration
    (salus_steady_counts).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
STEP = ROOT / "benchmarks" / "python" / "step_cost.py"
MODELS = ("resnet18", "gpt2", "vit")


@dataclass
class Side:
    """One build of Salus: its benchmark binaries and the Python that imports its package."""

    label: str
    microbench: Path
    torch_microbench: Optional[Path]
    steady_counts: Optional[Path]
    python: str
    pythonpath: Optional[str] = None  # put first on PYTHONPATH (a base build's package)
    salusd: Optional[str] = None

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.pythonpath:
            env["PYTHONPATH"] = self.pythonpath + os.pathsep + env.get("PYTHONPATH", "")
        if self.salusd:
            env["SALUSD"] = self.salusd
        return env


@dataclass
class Row:
    name: str
    unit: str
    baseline_label: str
    baseline: list[float] = field(default_factory=list)
    now: dict[str, list[float]] = field(default_factory=dict)  # side label -> values
    ratios: dict[str, list[float]] = field(default_factory=dict)

    def add(self, side: str, value: float, baseline: float) -> None:
        self.now.setdefault(side, []).append(value)
        self.baseline.append(baseline)
        self.ratios.setdefault(side, []).append(value / baseline if baseline else float("nan"))


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- real-model steps ------------------------------------------------------------------------

def step(side: Side, model: str, arm: str, steps: int, socket: Optional[str]) -> dict:
    command = [side.python, str(STEP), "--model", model, "--arm", arm, "--steps", str(steps)]
    if socket:
        command += ["--socket", socket]
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=side.env(),
                         timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def daemon(side: Side, directory: str) -> str:
    socket = os.path.join(directory, f"salusd-{side.label}.sock")
    code = ("from salus.cli import ensure_daemon; import sys; ensure_daemon(sys.argv[1], "
            "['--backend', 'sim', '--memory', '4GiB', '--policy', 'fair', '--log-level', 'warn'])")
    subprocess.run([side.python, "-c", code, socket], check=True, env=side.env(), timeout=60)
    return socket


def stop(side: Side, socket: str) -> None:
    code = "from salus.cli import stop_daemon; import sys; stop_daemon(sys.argv[1])"
    subprocess.run([side.python, "-c", code, socket], check=False, env=side.env(), timeout=60)


def model_steps(sides: list[Side], rounds: int, steps: int) -> tuple[list[Row], list[dict]]:
    rows = {(m, arm): Row(f"step {m}, {arm}", "ms", "plain PyTorch")
            for m in MODELS for arm in ("in-process", "connected")}
    counts: list[dict] = []
    directory = tempfile.mkdtemp(prefix="salus-bench-")
    sockets = {side.label: daemon(side, directory) for side in sides}
    try:
        for r in range(rounds):
            for model in MODELS:
                log(f"steps: round {r + 1}/{rounds}, {model}")
                plain = step(sides[0], model, "plain", steps, None)
                if r == 0:
                    counts.append({"side": "PyTorch", **plain})
                for side in sides:
                    for arm, key in (("inprocess", "in-process"), ("connected", "connected")):
                        got = step(side, model, arm, steps, sockets[side.label] if arm == "connected" else None)
                        rows[(model, key)].add(side.label, got["median_ms"], plain["median_ms"])
                        if r == 0:
                            counts.append({"side": side.label, **got})
    finally:
        for side in sides:
            stop(side, sockets[side.label])
        shutil.rmtree(directory, ignore_errors=True)
    return list(rows.values()), counts


# --- microbenchmarks -------------------------------------------------------------------------

def run_bench(binary: Path, pattern: str, min_time: float) -> dict[str, dict]:
    out = subprocess.run([str(binary), f"--benchmark_filter={pattern}",
                          f"--benchmark_min_time={min_time}", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True, timeout=900)
    return {b["name"]: b for b in json.loads(out.stdout)["benchmarks"]}


def real(b: dict) -> float:
    """Nanoseconds of one iteration (real or manual time)."""
    scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[b.get("time_unit", "ns")]
    return b["real_time"] * scale


PAIRS = [
    # (row, unit, salus benchmark, baseline benchmark, baseline label, binary)
    ("alloc+free pair, DL size mix", "ns", "BM_HotPair/runtime/dl/real_time",
     "BM_HotPair/glibc/dl/real_time/threads:1", "glibc", "micro"),
    ("alloc+free, GPT-2 trace through c10", "us/replay", "BM_TorchAllocator/salus/gpt2",
     "BM_TorchAllocator/pytorch/gpt2", "PyTorch's CPU allocator", "torch"),
    ("alloc+free, ResNet-18 trace through c10", "us/replay", "BM_TorchAllocator/salus/resnet18",
     "BM_TorchAllocator/pytorch/resnet18", "PyTorch's CPU allocator", "torch"),
    ("switch (one hand-over)", "ns", "BM_SwitchLatency/salus/manual_time",
     "BM_SwitchLatency/condvar/manual_time", "mutex + condvar", "micro"),
    ("round of turns, two processes", "ns", "BM_TurnPair_processes/real_time",
     "BM_TurnPair_inprocess/real_time", "the same round in-process", "micro"),
    ("replay GPT-2 trace via runtime", "us", "BM_PyTorchTraceReplay/gpt2/runtime",
     "BM_PyTorchTraceReplay/gpt2/malloc", "glibc", "micro"),
    ("replay ResNet-18 trace via runtime", "us", "BM_PyTorchTraceReplay/resnet18/runtime",
     "BM_PyTorchTraceReplay/resnet18/malloc", "glibc", "micro"),
]
ALONE = [
    # (row, unit, benchmark, divide by this counter): no baseline in the run
    ("replay synthetic ResNet-50-like", "ms", "BM_TraceReplay/synthetic_training", None),
    ("replay synthetic VGG16-like", "ms", "BM_TraceReplay/synthetic_training_vgg16", None),
    ("decision per boundary, fair, 1000 jobs", "ns", "BM_SchedulerDecision/1000",
     "starts_per_decide"),
    ("decision per boundary, memory_aware, 1000 jobs", "ns",
     "BM_SchedulerDecisionMemoryAware/1000", "starts_per_decide"),
]


def micro_rows(sides: list[Side], repetitions: int, min_time: float) -> tuple[list[Row], list[Row]]:
    micro_pattern = "|".join(
        [p[2].split("/real_time")[0].split("/manual_time")[0] for p in PAIRS if p[5] == "micro"]
        + [p[3].split("/real_time")[0].split("/manual_time")[0] for p in PAIRS if p[5] == "micro"]
        + [a[2] for a in ALONE])
    micro_pattern = "^(" + micro_pattern.replace("(", r"\(").replace(")", r"\)") + ")"
    rows = [Row(r, u, base) for r, u, _, _, base, _ in PAIRS]
    alone = [Row(r, u, "") for r, u, _, _ in ALONE]
    for rep in range(repetitions):
        for side in sides:
            log(f"microbenchmarks: repetition {rep + 1}/{repetitions}, {side.label}")
            got = run_bench(side.microbench, micro_pattern, min_time)
            if side.torch_microbench:
                got.update(run_bench(side.torch_microbench, "BM_TorchAllocator", min_time))
            for row, (_, _, ours, theirs, _, _) in zip(rows, PAIRS):
                if ours in got and theirs in got:
                    scale = 1e3 if row.unit.startswith("us") else 1.0
                    row.add(side.label, real(got[ours]) / scale, real(got[theirs]) / scale)
            for row, (_, unit, name, per) in zip(alone, ALONE):
                if name not in got:
                    continue
                value = real(got[name]) / (1e6 if unit == "ms" else 1.0)
                if per:
                    value /= got[name][per]
                row.now.setdefault(side.label, []).append(value)
    return rows, alone


def steady_counts(sides: list[Side]) -> list[dict]:
    out = []
    for side in sides:
        if side.steady_counts is None:
            continue
        run = subprocess.run([str(side.steady_counts)], check=True, capture_output=True,
                             text=True, timeout=600)
        for line in run.stdout.splitlines():
            out.append({"side": side.label, **json.loads(line)})
    return out


# --- the table -------------------------------------------------------------------------------

def fmt(value: float) -> str:
    if value != value:
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}" if value >= 1 else f"{value:.3f}"


def table(sides: list[Side], rows: list[Row], alone: list[Row], counts: list[dict],
          steady: list[dict]) -> str:
    head, rest = sides[0].label, [s.label for s in sides[1:]]
    lines = []
    extra = "".join(f" {r} | ratio, {r} |" for r in rest)
    lines.append(f"| row | baseline (measured in the run) | baseline | {head} | **ratio** |{extra}")
    lines.append("|---|---|---:|---:|---:|" + "---:|---:|" * len(rest))
    for row in rows:
        if head not in row.now:
            continue
        cells = [row.name + f" ({row.unit})", row.baseline_label, fmt(statistics.median(row.baseline)),
                 fmt(statistics.median(row.now[head])),
                 f"**{statistics.median(row.ratios[head]):.3f}x**"]
        for r in rest:
            if r in row.now:
                cells += [fmt(statistics.median(row.now[r])), f"{statistics.median(row.ratios[r]):.3f}x"]
            else:
                cells += ["n/a", "n/a"]
        lines.append("| " + " | ".join(cells) + " |")
    for row in alone:
        if head not in row.now:
            continue
        cells = [row.name + f" ({row.unit})", "(none)", "", fmt(statistics.median(row.now[head])), ""]
        for r in rest:
            if r in row.now:
                ratio = statistics.median(row.now[head]) / statistics.median(row.now[r])
                cells += [fmt(statistics.median(row.now[r])), f"{head}/{r} {ratio:.3f}x"]
            else:
                cells += ["n/a", ""]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Per step of the real models (first round), counted by the kernel: system calls, "
                 "futex calls, voluntary context switches (sleeps), minor page faults, Salus blocks.")
    lines.append("")
    lines.append("| model | arm | build | ms | syscalls | futex | sleeps | page faults | blocks |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for c in counts:
        n = lambda k: "n/a" if c.get(k) is None else f"{c[k]:.1f}"  # noqa: E731
        lines.append(f"| {c['model']} | {c['arm']} | {c['side']} | {c['median_ms']:.1f} | "
                     f"{n('syscalls')} | {n('futex')} | {n('voluntary_switches')} | "
                     f"{n('minor_faults')} | {n('allocations')} |")
    if steady:
        lines.append("")
        lines.append("A steady iteration (a trace replayed twice, its second pass's iterations "
                     "after the first two), counted: CUDA driver calls on the fake driver inside "
                     "the iteration and at its begin and end, stream-thread tasks on the "
                     "simulated GPU (host compute), page maps.")
        lines.append("")
        lines.append("| trace | build | blocks/iteration | driver calls inside | at the boundaries | "
                     "stream tasks | page maps |")
        lines.append("|---|---|---:|---:|---|---:|---:|")
        for s in steady:
            boundary = ", ".join(f"{k} {v:g}" for k, v in s["cuda_boundary_per_iteration"].items())
            inside = f"{s['cuda_calls_inside_per_iteration']:g}"
            if s["cuda_inside"]:
                inside += " (" + ", ".join(f"{k} {v:g}" for k, v in s["cuda_inside"].items()) + ")"
            tasks = s["sim_stream_tasks_per_iteration"]
            lines.append(f"| {s['trace']} | {s['side']} | {s['allocations_per_iteration']:.0f} | "
                         f"{inside} | {boundary} | {'n/a' if tasks is None else f'{tasks:g}'} | "
                         f"{s['cuda_page_maps']} + {s['sim_page_maps']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", type=Path, default=ROOT / "build-bench")
    parser.add_argument("--python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--label", default="now")
    parser.add_argument("--base-build", type=Path, help="an older tree's build (bench.sh --base)")
    parser.add_argument("--base-pythonpath", help="where that tree's salus package is installed")
    parser.add_argument("--base-salusd", help="that tree's salusd")
    parser.add_argument("--base-label", default="base")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the real-model steps")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per arm")
    parser.add_argument("--repetitions", type=int, default=3, help="of the microbenchmarks")
    parser.add_argument("--min-time", type=float, default=0.5)
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()

    def side(label: str, build: Path, pythonpath: Optional[str], salusd: Optional[str]) -> Side:
        torch_bench = build / "benchmarks" / "salus_torch_microbench"
        steady = build / "benchmarks" / "salus_steady_counts"
        return Side(label, build / "benchmarks" / "salus_microbench",
                    torch_bench if torch_bench.exists() else None,
                    steady if steady.exists() else None, args.python, pythonpath, salusd)

    sides = [side(args.label, args.build, None, None)]
    if args.base_build:
        sides.append(side(args.base_label, args.base_build, args.base_pythonpath, args.base_salusd))
    started = time.monotonic()
    rows, counts = ([], []) if args.skip_steps else model_steps(sides, args.rounds, args.steps)
    micro, alone = micro_rows(sides, args.repetitions, args.min_time)
    log("steady-iteration counts")
    steady = steady_counts(sides)
    text = table(sides, rows + micro, alone, counts, steady)
    text += f"\n\n({time.monotonic() - started:.0f} s; {time.strftime('%Y-%m-%d %H:%M')})\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
