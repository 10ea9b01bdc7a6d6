"""Part F: three training jobs sharing the GPU, each a process running a script that knows
nothing of Salus (a fixed number of optimizer steps; under ``salus run`` each step is a turn).

Arms (each job a fresh process; concurrent ones start their steps together, behind a barrier):

* one after another: the three scripts in sequence, each alone on the GPU;
* three plain processes at once (no Salus: the driver time-slices their contexts);
* ``salus run`` x3 under ``fair``, and under ``pack`` (a salusd of the benchmark's own each).

Reference: the sum of the jobs' alone times (each job's steps, measured in the first arm). Each
row's value is the makespan: from the first job's first step to the last job's end; for "one
after another", from the first process's start to the last one's end, start-ups included. On a
GPU, ``nvidia-smi`` samples the utilization during each arm (its mean over the makespan is in the
note). The dry run trains small CNNs on the CPU (simulated backend) and has no utilization.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

import models
from bench_common import (Barrier, BenchError, Context, Daemon, Row, arm_parser, emit,
                          prepare_torch, salus_run, torch_device, wait_for_go)


@dataclass(frozen=True)
class JobSpec:
    name: str
    model: str
    steps: int


JOBS = {
    "cuda": [JobSpec("resnet18", "resnet18", 60), JobSpec("mobilenet_v2", "mobilenet_v2", 60),
             JobSpec("resnet34", "resnet34", 40)],
    "sim": [JobSpec(f"cnn{i}", "cnn", 100) for i in range(3)],
}
DAEMON_MEMORY = {"cuda": "60GiB", "sim": "2GiB"}
ARM_TIMEOUT_S = {"cuda": 60.0, "sim": 45.0}


# --- driver side ---------------------------------------------------------------------------------

def run(ctx: Context) -> None:
    jobs = JOBS[ctx.backend]
    sampler = UtilSampler(ctx.nvidia_smi)
    started = time.monotonic()
    alone = [ctx.run_arm(f"alone-{j.name}", _job_argv(ctx, j), ARM_TIMEOUT_S[ctx.backend])
             for j in jobs]
    sequential_s = time.monotonic() - started
    if any(a is None for a in alone):
        ctx.skip("no rows: a job failed alone, so there is no reference")
        return
    spans = [(a["end_ns"] - a["start_ns"]) / 1e9 for a in alone if a is not None]
    reference = sum(spans)
    detail = ", ".join(f"{j.name} {s:.2f} s" for j, s in zip(jobs, spans))
    ctx.add_row(Row(part="F", name="3 jobs one after another (process start-ups included)",
                    unit="s", value=sequential_s, reference=reference,
                    reference_label="sum of the jobs' alone times",
                    note=f"alone: {detail}"))
    for label, policy in (("3 plain processes at once", None), ("salus run x3, fair", "fair"),
                          ("salus run x3, pack", "pack")):
        if ctx.remaining() < 10:
            ctx.skip(f"{label}: the part's time budget is spent")
            continue
        _together(ctx, jobs, label, policy, spans, sampler)


def _job_argv(ctx: Context, job: JobSpec) -> list[str]:
    return [ctx.python, ctx.script("part_f_sharing"), "--arm", "job", "--backend", ctx.backend,
            "--model", job.model, "--steps", str(job.steps)]


def _together(ctx: Context, jobs: list[JobSpec], label: str, policy: Optional[str],
              alone: list[float], sampler: "UtilSampler") -> None:
    """The three jobs at once, plain or under `salus run`; one row."""
    slug = label.replace(" ", "-").replace(",", "")
    barrier = Barrier(ctx.out / "barriers" / f"F-{slug}")
    daemon = Daemon(ctx, policy, ctx.backend, DAEMON_MEMORY[ctx.backend], policy) \
        if policy else None
    try:
        arms = []
        for job in jobs:
            name = f"{slug}-{job.name}"
            argv = _job_argv(ctx, job) + barrier.args(name)
            if daemon is not None:
                argv = salus_run(ctx, daemon, job.name, argv)
            arms.append((name, argv))
        sampler.start()
        outcomes = ctx.run_together(arms, ARM_TIMEOUT_S[ctx.backend], barrier=barrier)
        samples = sampler.stop()
    finally:
        if daemon is not None:
            daemon.stop()
    results = [o.result for o in outcomes]
    if any(r is None for r in results):
        ctx.skip(f"{label}: an arm failed (see the failures)")
        return
    starts = [r["start_ns"] for r in results if r is not None]
    ends = [r["end_ns"] for r in results if r is not None]
    makespan = (max(ends) - min(starts)) / 1e9
    slowdowns = ", ".join(f"{j.name} {(e - s) / 1e9 / a:.2f}x"
                          for j, s, e, a in zip(jobs, starts, ends, alone))
    util = sampler.mean(samples, min(starts), max(ends))
    ctx.add_row(Row(part="F", name=f"3 jobs, {label}", unit="s", value=makespan,
                    reference=sum(alone), reference_label="sum of the jobs' alone times",
                    note=f"each job's span against alone: {slowdowns}; GPU utilization {util}"))


class UtilSampler:
    """GPU 0's utilization from ``nvidia-smi -lms`` while an arm runs (none without one)."""

    def __init__(self, nvidia_smi: Optional[str]) -> None:
        self.nvidia_smi = nvidia_smi
        self.proc: Optional[subprocess.Popen[str]] = None
        self.samples: list[tuple[int, float]] = []
        self.reader: Optional[threading.Thread] = None

    def start(self) -> None:
        if self.nvidia_smi is None:
            return
        self.samples = []
        self.proc = subprocess.Popen(
            [self.nvidia_smi, "-i", "0", "--query-gpu=utilization.gpu",
             "--format=csv,noheader,nounits", "-lms", "200"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic_ns(), float(line.strip())))
            except ValueError:
                continue  # "[N/A]" or a header

    def stop(self) -> list[tuple[int, float]]:
        if self.proc is None:
            return []
        self.proc.terminate()
        self.proc.wait(timeout=5)
        if self.reader is not None:
            self.reader.join(timeout=5)
        self.proc = None
        return list(self.samples)

    def mean(self, samples: list[tuple[int, float]], start_ns: int, end_ns: int) -> str:
        if self.nvidia_smi is None:
            return "n/a (no nvidia-smi)"
        inside = [u for t, u in samples if start_ns <= t <= end_ns]
        if not inside:
            return "no sample inside the makespan"
        return f"mean {sum(inside) / len(inside):.0f}% ({len(inside)} samples of nvidia-smi)"


# --- arm side ------------------------------------------------------------------------------------

def job(backend: str, model: str, steps: int, ready: Optional[str],
        go: Optional[str]) -> dict[str, Any]:
    """A training script as a user writes it: nothing of Salus in it."""
    torch = prepare_torch(backend)
    net, loss_of, config = models.build(model, "full" if backend == "cuda" else "tiny",
                                        torch_device(backend))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    wait_for_go(ready, go)
    start = time.monotonic_ns()
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss_of().backward()
        optimizer.step()
    if backend == "cuda":
        torch.cuda.synchronize()
    end = time.monotonic_ns()
    return {"config": config, "steps": steps, "start_ns": start, "end_ns": end,
            "step_ms": (end - start) / 1e6 / steps}


def arm_main(argv: list[str]) -> int:
    parser = arm_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args(argv)
    if args.arm != "job":
        raise BenchError(f"unknown arm {args.arm!r} (job)")
    emit({"arm": args.arm, **job(args.backend, args.model, args.steps, args.ready, args.go)})
    return 0


if __name__ == "__main__":
    sys.exit(arm_main(sys.argv[1:]))
