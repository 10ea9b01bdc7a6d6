"""Part E: spilling to the host and fetching back. Two jobs of one runtime (spill="host_only")
whose persistent memory does not fit the device's limit together take turns; each iteration
allocates a workspace, so the waiting job's pages go down to the host and come home at its next
turn (README, "Memory harvesting").

* Throughput: the runtime's own ``bytes_moved / move_seconds`` (``DeviceStats``; the copies and
  the remapping included). Reference: the peak of pinned ``copy_`` host to device and device to
  host (CUDA events, best of five), their mean; target at least 0.8x.
* Wall time per switch: from one job's iteration body being done to the other's
  ``begin_iteration`` returning (the fetch of its pages happens at its admission). Reference: the
  same two jobs with a limit that holds both (nothing moves).

On CUDA the jobs are PyTorch tensors through salus.torch, and each iteration adds to every element
of its job's tensor (so the data must be intact; it is checked at the end). On the simulated
backend PyTorch computes on the host, and Salus never moves a live host-computing job's pages
(README, "Its gaps"), so the dry run uses the runtime alone: raw allocations and simulated
kernels; its reference is a host memcpy.
"""
from __future__ import annotations

import ctypes
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from bench_common import (BenchError, Context, Row, arm_parser, emit, median, prepare_torch,
                          salus_runtime)

GiB, MiB = 1 << 30, 1 << 20


@dataclass(frozen=True)
class Sizes:
    limit: int  # the device's limit when spilling
    fit_limit: int  # a limit that holds both jobs
    persistent: int  # per job
    workspace: int  # per iteration
    iterations: int  # per job
    copy_bytes: int  # the reference copy


SIZES = {
    "cuda": Sizes(limit=6 * GiB, fit_limit=12 * GiB, persistent=4 * GiB, workspace=1 * GiB,
                  iterations=5, copy_bytes=1 * GiB),
    "sim": Sizes(limit=160 * MiB, fit_limit=256 * MiB, persistent=64 * MiB, workspace=40 * MiB,
                 iterations=10, copy_bytes=64 * MiB),
}
TARGET = 0.8
ARM_TIMEOUT_S = {"cuda": 60.0, "sim": 30.0}


# --- driver side ---------------------------------------------------------------------------------

def run(ctx: Context) -> None:
    script = ctx.script("part_e_spill")
    timeout = ARM_TIMEOUT_S[ctx.backend]

    def arm(name: str) -> Optional[dict[str, Any]]:
        return ctx.run_arm(name, [ctx.python, script, "--arm", name, "--backend", ctx.backend],
                           timeout)

    spill, fit, copy = arm("spill"), arm("fit"), arm("copy")
    if spill is None:
        ctx.skip("no rows: the spilling arm failed")
        return
    if spill["bytes_moved"] == 0:
        ctx.skip(f"no pages moved (limit {spill['limit'] // MiB} MiB): nothing to measure")
        return
    if copy is not None:
        ctx.add_row(Row(
            part="E", name="spill+fetch throughput (bytes_moved / move_seconds)", unit="GB/s",
            value=spill["gb_per_s"], reference=copy["gb_per_s"],
            reference_label=copy["label"], better="higher", target=TARGET,
            note=f"{spill['bytes_moved'] / MiB:.0f} MiB in {spill['pages_moved']} pages over "
                 f"{spill['move_seconds']:.3f} s; {copy['detail']}; {spill['how']}"))
    if fit is not None and spill["switch_ms"] is not None and fit["switch_ms"] is not None:
        per_switch = spill["bytes_moved"] / max(1, spill["switches"]) / MiB
        ctx.add_row(Row(
            part="E", name="wall time per switch, two jobs that do not fit together", unit="ms",
            value=spill["switch_ms"], reference=fit["switch_ms"],
            reference_label="the same jobs under a limit that holds both",
            note=f"median of {spill['switches'] - 1} switches (the first places the jobs); "
                 f"{per_switch:.0f} MiB moved per switch on average"))
    elif fit is not None:
        ctx.skip("wall time per switch: the jobs did not alternate")


# --- arm side ------------------------------------------------------------------------------------

@dataclass
class Span:
    job: int
    begun_ns: int
    done_ns: int


def take_turns(jobs: list[Any], prepare: Callable[[int], None], body: Callable[[int], None],
               iterations: int) -> list[Span]:
    """Each job in a thread of its own: ``prepare`` (its persistent memory), then ``iterations``
    iterations of ``body``; the spans of their bodies, in the order they ran."""
    spans: list[Span] = []
    start = threading.Barrier(len(jobs))
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            prepare(i)
            start.wait()
            for _ in range(iterations):
                with jobs[i].iteration():
                    begun = time.perf_counter_ns()
                    body(i)
                    spans.append(Span(i, begun, time.perf_counter_ns()))
        except BaseException as e:  # noqa: BLE001: re-raised in the main thread
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sorted(spans, key=lambda s: s.begun_ns)


def switch_ms(spans: list[Span]) -> tuple[Optional[float], int]:
    """Median wall time of a switch (the first left out: it places the jobs) and the count."""
    gaps = [(b.begun_ns - a.done_ns) / 1e6 for a, b in zip(spans, spans[1:]) if a.job != b.job]
    return median(gaps[1:]), len(gaps)


def torch_jobs(sizes: Sizes, limit: int) -> tuple[Any, list[Span], Callable[[], None], str]:
    """CUDA: two jobs' PyTorch tensors through salus.torch."""
    runtime = salus_runtime("cuda", spill="host_only", lend_reserve=0, device_limits=[limit])
    torch = prepare_torch("cuda")
    jobs = [runtime.add_job(f"spill-{i}") for i in range(2)]
    tensors: list[Any] = [None, None]

    def prepare(i: int) -> None:
        with jobs[i]:
            tensors[i] = torch.full((sizes.persistent // 4,), float(i + 1), device="cuda")

    def body(i: int) -> None:
        workspace = torch.empty(sizes.workspace, dtype=torch.uint8, device="cuda")
        workspace.fill_(1)
        tensors[i].add_(1.0)  # every page of the job's tensor, wherever it is now
        torch.cuda.current_stream().synchronize()
        del workspace

    spans = take_turns(jobs, prepare, body, sizes.iterations)

    def check() -> None:
        # Reductions (no tensor of the tensors' size): there is no room for one under the limit.
        for i, t in enumerate(tensors):
            want = float(i + 1 + sizes.iterations)
            low, high = (float(v) for v in torch.aminmax(t))
            if low != want or high != want:
                raise BenchError(f"job {i}'s tensor lost its data across the spills: values in "
                                 f"[{low}, {high}], want {want}")

    return runtime, spans, check, "PyTorch tensors through salus.torch; data checked"


def raw_jobs(sizes: Sizes, limit: int) -> tuple[Any, list[Span], Callable[[], None], str]:
    """Simulated backend: raw allocations and simulated kernels (no host compute)."""
    runtime = salus_runtime("sim", enable_torch=False, memory=sizes.fit_limit,
                            spill="host_only", lend_reserve=0, device_limits=[limit])
    jobs = [runtime.add_job(f"spill-{i}") for i in range(2)]
    blocks = 4

    def prepare(i: int) -> None:
        for _ in range(blocks):
            jobs[i].allocate(sizes.persistent // blocks)

    def body(i: int) -> None:
        workspace = jobs[i].allocate(sizes.workspace)
        jobs[i].sim_kernel(0.001)
        jobs[i].synchronize()
        jobs[i].deallocate(workspace)

    return runtime, take_turns(jobs, prepare, body, sizes.iterations), lambda: None, \
        "runtime alone on the simulated backend: raw allocations, simulated kernels"


def spill_arm(backend: str, fit: bool) -> dict[str, Any]:
    sizes = SIZES[backend]
    limit = sizes.fit_limit if fit else sizes.limit
    runtime, spans, check, how = (torch_jobs if backend == "cuda" else raw_jobs)(sizes, limit)
    stats = runtime.device_stats(0)  # before the check, whose reads may move pages too
    check()
    per_switch, switches = switch_ms(spans)
    seconds = stats.move_seconds
    return {"limit": limit, "bytes_moved": stats.bytes_moved, "pages_moved": stats.pages_moved,
            "move_seconds": seconds, "switch_ms": per_switch, "switches": switches, "how": how,
            "gb_per_s": stats.bytes_moved / seconds / 1e9 if seconds > 0 else None}


def pinned_copy(sizes: Sizes) -> dict[str, Any]:
    """Peak GB/s of pinned host <-> device copy_ (best of five, CUDA events), each direction."""
    torch = prepare_torch("cuda")
    host = torch.empty(sizes.copy_bytes, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(sizes.copy_bytes, dtype=torch.uint8, device="cuda")
    rates = {}
    for name, dst, src in (("H2D", device, host), ("D2H", host, device)):
        best = float("inf")
        for _ in range(6):  # the first warms the path
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1e3)
        rates[name] = sizes.copy_bytes / best / 1e9
    return {"gb_per_s": (rates["H2D"] + rates["D2H"]) / 2, "label": "pinned copy_ peak, mean",
            "detail": f"pinned H2D {rates['H2D']:.1f} GB/s, D2H {rates['D2H']:.1f} GB/s"}


def host_memcpy(sizes: Sizes) -> dict[str, Any]:
    """Peak GB/s of a host memcpy (the simulated GPU's memory is host memory)."""
    src = ctypes.create_string_buffer(sizes.copy_bytes)
    dst = ctypes.create_string_buffer(sizes.copy_bytes)
    best = float("inf")
    for _ in range(6):
        start = time.perf_counter()
        ctypes.memmove(dst, src, sizes.copy_bytes)
        best = min(best, time.perf_counter() - start)
    rate = sizes.copy_bytes / best / 1e9
    return {"gb_per_s": rate, "label": "host memcpy peak",
            "detail": f"memcpy of {sizes.copy_bytes // MiB} MiB {rate:.1f} GB/s"}


def arm_main(argv: list[str]) -> int:
    args = arm_parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.arm in ("spill", "fit"):
        result = spill_arm(args.backend, fit=args.arm == "fit")
    elif args.arm == "copy":
        sizes = SIZES[args.backend]
        result = pinned_copy(sizes) if args.backend == "cuda" else host_memcpy(sizes)
    else:
        raise BenchError(f"unknown arm {args.arm!r} (spill, fit, copy)")
    emit({"arm": args.arm, **result})
    return 0


if __name__ == "__main__":
    sys.exit(arm_main(sys.argv[1:]))
