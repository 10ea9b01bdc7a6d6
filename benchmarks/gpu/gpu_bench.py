#!/usr/bin/env python3
"""The GPU benchmark's driver (scripts/gpu_bench.sh): what sharing a GPU through Salus costs.

Each row is a value measured through Salus against a reference measured in the same run, and
their ratio. The parts (one module each, benchmarks/gpu/part_*.py):

  A  alloc+free pairs of 4 KiB / 1 MiB / 64 MiB tensors: PyTorch's allocator, salus.torch
     in-process, and under `salus run`;
  B  a training step of ResNet-18 and GPT-2 small (random weights, AdamW): native against
     salus.torch in-process (target: at most 1.02x);
  C  the in-process switch: host latency of a hand-over between two jobs' iterations, and the GPU
     idle gap between them, against a condition-variable hand-over and two kernels back to back;
  D  turns between processes under `salus run`: host time per turn and the GPU gap at a turn,
     against a bare Unix socket round trip;
  E  spilling to the host and fetching back: GB/s from the runtime's bytes_moved / move_seconds
     against pinned copy_ peaks (target: at least 0.8x), and wall time per switch;
  F  three jobs sharing the GPU: one after another, three plain processes at once, and
     `salus run` x3 under fair and under pack, against the sum of the jobs' alone times.

Every arm is a fresh process with a timeout; a failed arm is recorded and the others go on. Each
part has a time budget and the whole run one (6 minutes on a GPU). Without a GPU (no nvidia-smi,
or --dry-run) the parts run at tiny sizes on the simulated backend, and what needs CUDA prints
``SKIP <part>: <reason>``.

Writes ``results.json`` (every row, skip and failure, and the environment) and ``results.md``
(the table, printed at the end too) to --out, and the arms' logs to --out/logs.
Exits 1 if any arm failed, else 0 (a machine without a GPU included).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Optional

import bench_common
import part_a_alloc
import part_b_steps
import part_c_switch
import part_d_turns
import part_e_spill
import part_f_sharing
import preflight
from bench_common import Context, fmt


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    module: ModuleType
    gpu_budget_s: float
    dry_budget_s: float


# The budgets add up to less than the run's: the slack pays for process starts the estimates
# missed and for writing the results.
PARTS = [
    Part("A", "alloc+free pairs", part_a_alloc, 45, 25),
    Part("B", "training steps", part_b_steps, 100, 50),
    Part("C", "in-process switch", part_c_switch, 25, 15),
    Part("D", "turns between processes", part_d_turns, 35, 25),
    Part("E", "spill and fetch", part_e_spill, 40, 15),
    Part("F", "three jobs sharing", part_f_sharing, 85, 45),
]
RUN_BUDGET_S = {"gpu": 355.0, "dry": 170.0}


def main(argv: list[str]) -> int:
    args = _parse(argv)
    started = time.monotonic()
    nvidia_smi = _nvidia_smi()
    dry = args.dry_run or os.environ.get("SALUS_BENCH_DRY_RUN") == "1" or nvidia_smi is None
    budget = args.budget or RUN_BUDGET_S["dry" if dry else "gpu"]
    out = _prepare_out(Path(args.out))
    ctx = Context(python=os.path.abspath(args.python), out=out, dry_run=dry,
                  deadline=started + budget, env=_arm_env(), nvidia_smi=nvidia_smi)
    mode = "dry run on the simulated backend" if dry else "GPU run on the CUDA backend"
    print(f"[gpu-bench] {mode}; budget {budget:.0f} s; results in {out}", flush=True)
    if nvidia_smi is None:
        print("[gpu-bench] no NVIDIA GPU found (nvidia-smi absent or lists none): dry run",
              flush=True)

    elapsed: list[dict[str, Any]] = []
    ctx.part, ctx.part_deadline = "preflight", time.monotonic() + preflight.LIMIT_S
    elapsed.append(_timed("preflight", preflight.LIMIT_S,
                          lambda: preflight.run(ctx, nvidia_smi)))
    wanted = set(args.parts.upper().split(",")) if args.parts else {p.name for p in PARTS}
    for part in PARTS:
        if part.name not in wanted:
            continue
        budget_s = part.dry_budget_s if dry else part.gpu_budget_s
        ctx.part, ctx.part_deadline = part.name, time.monotonic() + budget_s
        print(f"\n[gpu-bench] part {part.name}: {part.title} (budget {budget_s:.0f} s, "
              f"{ctx.deadline - time.monotonic():.0f} s left in the run)", flush=True)
        elapsed.append(_timed(part.name, budget_s, lambda: _run_part(ctx, part)))

    total = time.monotonic() - started
    report = _report(ctx, elapsed, total, budget)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(ctx, elapsed, total, budget)
    (out / "results.md").write_text(table)
    print("\n" + table, flush=True)
    print(f"[gpu-bench] {len(ctx.rows)} rows, {len(ctx.skips)} skipped, "
          f"{len(ctx.failures)} failed arms, {total:.1f} s; written to {out}/results.{{json,md}}",
          flush=True)
    return 1 if ctx.failures else 0


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true",
                        help="simulated backend, tiny sizes (automatic without nvidia-smi)")
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu-bench-out",
                        help="results folder (default: $OUT, else ./gpu-bench-out)")
    parser.add_argument("--parts", help="comma-separated subset of A,B,C,D,E,F (default: all)")
    parser.add_argument("--budget", type=float,
                        help="seconds for the whole run (default 355 on a GPU, 170 dry)")
    parser.add_argument("--python", default=sys.executable,
                        help="the Python the arms run with (must import torch and salus)")
    return parser.parse_args(argv)


def _nvidia_smi() -> Optional[str]:
    """nvidia-smi's path when it lists at least one GPU."""
    path = shutil.which("nvidia-smi")
    if path is None:
        return None
    try:
        listed = subprocess.run([path, "-L"], capture_output=True, text=True, timeout=10)
    except (subprocess.TimeoutExpired, OSError):
        return None
    return path if any(line.startswith("GPU ") for line in listed.stdout.splitlines()) else None


def _prepare_out(out: Path) -> Path:
    out = out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    # The folder ignores itself: a run inside the checkout leaves git status clean.
    (out / ".gitignore").write_text("*\n")
    return out


def _arm_env() -> dict[str, str]:
    env = dict(os.environ)
    # No network on the GPU machine: models are built from configs with random weights, and
    # nothing may try to reach a hub.
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
                "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error"})
    return env


def _timed(name: str, budget_s: float, body: Callable[[], None]) -> dict[str, Any]:
    start = time.monotonic()
    body()
    seconds = time.monotonic() - start
    print(f"[gpu-bench] {name} took {seconds:.1f} s (budget {budget_s:.0f} s)", flush=True)
    return {"part": name, "seconds": round(seconds, 2), "budget_s": budget_s}


def _run_part(ctx: Context, part: Part) -> None:
    """A part's failure outside its arms (a daemon that would not start, a bug) is recorded as
    the part's, and the run goes on with the next part."""
    if ctx.deadline - time.monotonic() < 5.0:
        ctx.skip("the run's time budget is spent")
        return
    try:
        part.module.run(ctx)
    except Exception as e:  # noqa: BLE001: one part must not stop the others
        ctx.fail("driver", f"{type(e).__name__}: {e}")


# --- results -------------------------------------------------------------------------------------

def _commit() -> str:
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=5, cwd=bench_common.ROOT)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5, cwd=bench_common.ROOT)
    except (subprocess.TimeoutExpired, OSError):
        return "unknown"
    if done.returncode != 0:
        return "unknown"
    return done.stdout.strip() + (" (modified)" if dirty.stdout.strip() else "")


def _environment(ctx: Context) -> dict[str, Any]:
    facts = {k: v for k, v in ctx.facts.items() if k != "nvidia_smi"}
    return {
        "mode": "dry run (simulated backend)" if ctx.dry_run else "GPU (CUDA backend)",
        "commit": _commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "python": ctx.python,
        "torch": facts.pop("torch", "not reported"),
        "torch_cuda": facts.pop("torch_cuda", None),
        "gpu_name": facts.pop("gpu_name", "none" if ctx.dry_run else "not reported"),
        "driver": facts.pop("driver", "none" if ctx.dry_run else "not reported"),
        **facts,
    }


def _report(ctx: Context, elapsed: list[dict[str, Any]], total: float,
            budget: float) -> dict[str, Any]:
    return {
        "environment": _environment(ctx),
        "nvidia_smi": ctx.facts.get("nvidia_smi"),
        "rows": [r.to_json(ctx.dry_run) for r in ctx.rows],
        "skips": [asdict(s) for s in ctx.skips],
        "failures": [asdict(f) for f in ctx.failures],
        "elapsed": elapsed,
        "total_seconds": round(total, 2),
        "budget_seconds": budget,
    }


def markdown(ctx: Context, elapsed: list[dict[str, Any]], total: float, budget: float) -> str:
    env = _environment(ctx)
    lines = [
        "# Salus GPU benchmark",
        "",
        f"{env['mode']}; commit {env['commit']}; {env['date']}; GPU {env['gpu_name']}, driver "
        f"{env['driver']}; torch {env['torch']} (CUDA {env['torch_cuda']}); "
        f"{total:.0f} s of a {budget:.0f} s budget.",
        "",
        "| Part | Measure | Value | Reference | Ratio | Target | Met | Note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in ctx.rows:
        ratio = r.ratio
        target = "-" if r.target is None else ("<= " if r.better == "lower" else ">= ") + \
            f"{r.target:g}"
        lines.append(
            f"| {r.part} | {r.name} | {fmt(r.value)} {r.unit} | {fmt(r.reference)} {r.unit} "
            f"({r.reference_label}) | {'-' if ratio is None else f'{ratio:.3f}'} | {target} | "
            f"{r.verdict(ctx.dry_run)} | {r.note.replace('|', '/')} |")
    if ctx.skips:
        lines += ["", "Skipped:", ""] + [f"- SKIP {s.part}: {s.reason}" for s in ctx.skips]
    if ctx.failures:
        lines += ["", "Failed arms:", ""] + [
            f"- {f.part}/{f.arm}: {f.error}" + (f" (log {f.log})" if f.log else "")
            for f in ctx.failures]
    lines += ["", "| Part | Seconds | Budget |", "|---|---|---|"]
    lines += [f"| {e['part']} | {e['seconds']:.1f} | {e['budget_s']:.0f} |" for e in elapsed]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
