"""Part A: alloc+free pairs of PyTorch tensors (``torch.empty`` on the device, then ``del``).

Three arms, each a fresh process, each timing pairs of 4 KiB, 1 MiB and 64 MiB:

* ``native``: PyTorch's own allocator (CUDA: its caching allocator; dry run: its CPU allocator);
* ``inprocess``: ``salus.torch`` over an in-process runtime, the pairs inside one iteration of a
  job (where a training step's activations are made and freed);
* ``salus_run``: the same script under ``salus run`` (its memory from a salusd of the benchmark's
  own; the script marks no iteration, so the pairs are the job's, outside turns).

Besides the time per pair, each arm reports per pair what it can count: PyTorch's device
allocations (``num_device_alloc``: its cudaMalloc calls) for the native arm, and Salus's page maps,
chunk creations and glue allocations for the Salus arms. Salus counts driver calls only against
its fake driver (benchmarks/steady), so driver calls per pair are n/a here.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

from bench_common import (BenchError, Context, Daemon, Row, arm_parser, emit, median,
                          prepare_torch, salus_run, salus_runtime, shared_runtime, timed_loop,
                          torch_device)

SIZES = {"4 KiB": 4 << 10, "1 MiB": 1 << 20, "64 MiB": 64 << 20}
# Pairs per timed round and rounds per size: enough for a stable median, a second or so per arm.
PAIRS_GPU = {"4 KiB": 5000, "1 MiB": 5000, "64 MiB": 1000}
PAIRS_DRY = {"4 KiB": 2000, "1 MiB": 2000, "64 MiB": 300}
ROUNDS = 5
ARM_TIMEOUT_S = 60.0


# --- driver side ---------------------------------------------------------------------------------

def run(ctx: Context) -> None:
    script = ctx.script("part_a_alloc")
    common = ["--backend", ctx.backend]
    native = ctx.run_arm("native", [ctx.python, script, "--arm", "native", *common],
                         ARM_TIMEOUT_S)
    inprocess = ctx.run_arm("inprocess", [ctx.python, script, "--arm", "inprocess", *common],
                            ARM_TIMEOUT_S)
    shared = _under_salus_run(ctx, script, common)
    if native is None:
        ctx.skip("no rows: the reference arm (native) failed")
        return
    for label, result in (("in-process salus.torch", inprocess), ("under salus run", shared)):
        if result is not None:
            _rows(ctx, label, result, native)


def _under_salus_run(ctx: Context, script: str, common: list[str]) -> Optional[dict[str, Any]]:
    memory = "1GiB" if ctx.dry_run else "8GiB"
    with Daemon(ctx, "alloc", ctx.backend, memory, "fair") as daemon:
        command = [ctx.python, script, "--arm", "salus_run", *common]
        return ctx.run_arm("salus_run", salus_run(ctx, daemon, "alloc-pairs", command),
                           ARM_TIMEOUT_S)


def _rows(ctx: Context, label: str, result: dict[str, Any], native: dict[str, Any]) -> None:
    reference = "PyTorch CPU allocator" if ctx.dry_run else "PyTorch caching allocator"
    for size in SIZES:
        ours, theirs = result["sizes"][size], native["sizes"][size]
        counts = ", ".join(f"{k} {v:.3g}" for k, v in ours["per_pair"].items())
        ref_counts = ", ".join(f"{k} {v:.3g}" for k, v in theirs["per_pair"].items()) or "n/a"
        ctx.add_row(Row(
            part="A", name=f"alloc+free {size}, {label}", unit="us/pair",
            value=ours["us_per_pair"], reference=theirs["us_per_pair"],
            reference_label=reference,
            note=(f"per pair: {counts}; driver calls n/a (counted only on the fake driver); "
                  f"reference per pair: {ref_counts}")))


# --- arm side ------------------------------------------------------------------------------------

def _pairs(torch: Any, device: str, nbytes: int) -> Callable[[], None]:
    def pair() -> None:
        x = torch.empty(nbytes, dtype=torch.uint8, device=device)
        del x
    return pair


def measure(torch: Any, device: str, counters: Callable[[], dict[str, float]],
            pairs: dict[str, int]) -> dict[str, Any]:
    """Per size: the median over rounds of microseconds per pair, and what ``counters`` counted
    over all the timed pairs, per pair."""
    out: dict[str, Any] = {}
    for size, nbytes in SIZES.items():
        pair = _pairs(torch, device, nbytes)
        for _ in range(50):  # warm: the first pairs map what the later ones reuse
            pair()
        if device == "cuda":
            torch.cuda.synchronize()
        before = counters()
        rounds = [timed_loop(pair, pairs[size]) for _ in range(ROUNDS)]
        after = counters()
        total = pairs[size] * ROUNDS
        out[size] = {"us_per_pair": median(r * 1e6 for r in rounds),
                     "rounds_us": [r * 1e6 for r in rounds],
                     "per_pair": {k: (after[k] - before[k]) / total for k in after}}
    return out


def _native_counters(torch: Any, device: str) -> Callable[[], dict[str, float]]:
    if device != "cuda":
        return lambda: {}  # PyTorch's CPU allocator counts nothing

    def counts() -> dict[str, float]:
        stats = torch.cuda.memory_stats(0)
        return {"cudaMalloc": float(stats.get("num_device_alloc", 0)),
                "cudaFree": float(stats.get("num_device_free", 0))}
    return counts


def _salus_counters(runtime: Any) -> Callable[[], dict[str, float]]:
    import salus.torch as salus_torch

    def counts() -> dict[str, float]:
        s = runtime.device_stats(0)
        glue = salus_torch.counters()
        return {"page maps": float(s.page_maps), "chunk creates": float(s.chunk_creates),
                "glue allocations": float(glue["allocations"])}
    return counts


def arm_main(argv: list[str]) -> int:
    args = arm_parser(__doc__.splitlines()[0]).parse_args(argv)
    pairs = PAIRS_GPU if args.backend == "cuda" else PAIRS_DRY
    device = torch_device(args.backend)
    if args.arm == "native":
        torch = prepare_torch(args.backend)
        sizes = measure(torch, device, _native_counters(torch, device), pairs)
    elif args.arm == "inprocess":
        runtime = salus_runtime(args.backend)
        torch = prepare_torch(args.backend)
        job = runtime.add_job("alloc-pairs")
        with job.iteration():
            sizes = measure(torch, device, _salus_counters(runtime), pairs)
        job.leave()
    elif args.arm == "salus_run":
        runtime, _ = shared_runtime()
        torch = prepare_torch(args.backend)
        sizes = measure(torch, device, _salus_counters(runtime), pairs)
    else:
        raise BenchError(f"unknown arm {args.arm!r} (native, inprocess, salus_run)")
    emit({"arm": args.arm, "sizes": sizes})
    return 0


if __name__ == "__main__":
    sys.exit(arm_main(sys.argv[1:]))
