"""Part B: one training step (forward, backward, AdamW) of ResNet-18 and GPT-2 small, native
against ``salus.torch`` in-process (each step one iteration of one job). Target: at most 1.02x.

On CUDA each step is timed with CUDA events on the thread's default stream, recorded before the
iteration begins and after it ends (salus.torch makes that stream wait for the job's), so a step's
time includes the hand-over's cost whenever the host, not the GPU, is what limits. The median of
the timed steps after a warm-up. The dry run times tiny configurations on the CPU (the simulated
backend) with the host clock, as benchmarks/python/step_cost.py does.

The driver alternates native and Salus arms, one model after the other, and repeats the round
while the part's budget allows: a slow machine phase then hits both sides alike.
"""
from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import models
from bench_common import (BenchError, Context, Row, arm_parser, emit, median, percentile,
                          prepare_torch, salus_runtime, torch_device)

MODELS = ("resnet18", "gpt2")
STEPS = {"cuda": (10, 40), "sim": (2, 5)}  # (warm-up, timed)
MAX_ROUNDS = {"cuda": 3, "sim": 1}
ARM_TIMEOUT_S = {"cuda": 120.0, "sim": 60.0}
TARGET = 1.02


# --- driver side ---------------------------------------------------------------------------------

def run(ctx: Context) -> None:
    script = ctx.script("part_b_steps")
    results: dict[str, dict[str, list[dict[str, Any]]]] = {
        m: {"native": [], "salus": []} for m in MODELS}
    round_s = 0.0
    for r in range(MAX_ROUNDS[ctx.backend]):
        if r > 0 and ctx.remaining() < 1.2 * round_s:
            print(f"[gpu-bench]   B: {r} round(s); another ({round_s:.0f} s) would not fit the "
                  "budget", flush=True)
            break
        started = time.monotonic()
        for model in MODELS:
            for mode in ("native", "salus"):
                got = ctx.run_arm(f"{model}-{mode}-r{r + 1}",
                                  [ctx.python, script, "--arm", mode, "--model", model,
                                   "--backend", ctx.backend], ARM_TIMEOUT_S[ctx.backend])
                if got is not None:
                    results[model][mode].append(got)
        round_s = time.monotonic() - started
    for model in MODELS:
        _row(ctx, model, results[model]["salus"], results[model]["native"])


def _row(ctx: Context, model: str, salus: list[dict[str, Any]],
         native: list[dict[str, Any]]) -> None:
    if not salus or not native:
        ctx.skip(f"{model}: no {'Salus' if not salus else 'native'} arm finished")
        return
    ratios = [s["median_ms"] / n["median_ms"] for s, n in zip(salus, native)]
    counts = ", ".join(f"{k} {v:.3g}" for k, v in salus[0]["per_step"].items())
    ref_counts = ", ".join(f"{k} {v:.3g}" for k, v in native[0]["per_step"].items()) or "n/a"
    ctx.add_row(Row(
        part="B", name=f"step {salus[0]['config']}, salus.torch in-process", unit="ms",
        value=median(s["median_ms"] for s in salus),
        reference=median(n["median_ms"] for n in native),
        reference_label="native PyTorch", target=TARGET,
        note=(f"{salus[0]['timer']}; median of {salus[0]['steps']} steps, {len(salus)} round(s), "
              f"per-round ratios {', '.join(f'{x:.3f}' for x in ratios)}; per step: {counts}; "
              f"native per step: {ref_counts}")))


# --- arm side ------------------------------------------------------------------------------------

class StepTimer:
    """Per-step times: CUDA events on the default stream, or the host clock on the CPU."""

    def __init__(self, torch: Any, cuda: bool, steps: int) -> None:
        self.torch, self.cuda = torch, cuda
        if cuda:
            self.events = [(torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        self.host: list[float] = []

    def timed(self, i: int, step: Callable[[], None]) -> None:
        if self.cuda:
            self.events[i][0].record()
            step()
            self.events[i][1].record()
        else:
            start = time.perf_counter()
            step()
            self.host.append((time.perf_counter() - start) * 1e3)

    def milliseconds(self) -> list[float]:
        if not self.cuda:
            return self.host
        self.torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in self.events]


def _counters(torch: Any, runtime: Any, cuda: bool) -> Callable[[], dict[str, float]]:
    if runtime is not None:
        import salus.torch as salus_torch

        return lambda: {"glue allocations": float(salus_torch.counters()["allocations"]),
                        "page maps": float(runtime.device_stats(0).page_maps)}
    if cuda:
        return lambda: {"cudaMalloc": float(torch.cuda.memory_stats(0).get("num_device_alloc", 0))}
    return lambda: {}


def train(model: str, mode: str, backend: str) -> dict[str, Any]:
    warmup, steps = STEPS[backend]
    runtime = salus_runtime(backend) if mode == "salus" else None
    torch = prepare_torch(backend)
    job = runtime.add_job(f"{model}-step") if runtime is not None else None
    with job if job is not None else nullcontext():  # weights and optimizer: persistent
        net, loss_of, config = models.build(model, "full" if backend == "cuda" else "tiny",
                                            torch_device(backend))
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)

    def iteration() -> ContextManager[Any]:
        return job.iteration() if job is not None else nullcontext()

    def step() -> None:
        with iteration():
            optimizer.zero_grad(set_to_none=True)
            loss_of().backward()
            optimizer.step()

    for _ in range(warmup):
        step()
    cuda = backend == "cuda"
    if cuda:
        torch.cuda.synchronize()
    counters = _counters(torch, runtime, cuda)
    timer = StepTimer(torch, cuda, steps)
    before, wall = counters(), time.perf_counter()
    for i in range(steps):
        timer.timed(i, step)
    times = timer.milliseconds()
    wall = (time.perf_counter() - wall) * 1e3 / steps
    after = counters()
    if job is not None:
        job.leave()
    return {"model": model, "mode": mode, "config": config, "steps": steps,
            "timer": "CUDA events" if cuda else "host clock (CPU, simulated backend)",
            "median_ms": median(times), "p90_ms": percentile(times, 0.9),
            "host_ms_per_step": wall, "times_ms": times,
            "per_step": {k: (after[k] - before[k]) / steps for k in after}}


def arm_main(argv: list[str]) -> int:
    parser = arm_parser(__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, required=True)
    args = parser.parse_args(argv)
    if args.arm not in ("native", "salus"):
        raise BenchError(f"unknown arm {args.arm!r} (native, salus)")
    emit({"arm": args.arm, **train(args.model, args.arm, args.backend)})
    return 0


if __name__ == "__main__":
    sys.exit(arm_main(sys.argv[1:]))
