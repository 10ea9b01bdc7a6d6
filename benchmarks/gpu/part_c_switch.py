"""Part C: the in-process switch. Two jobs of one runtime, each in its own thread, take turns
under ``fair``; each iteration (``with job.iteration():``) runs one small kernel.

* Host latency of a hand-over: from the moment one job's iteration body is done (its
  ``__exit__`` about to end the turn) to the moment the other job's ``begin_iteration`` has
  returned in its thread. Reference: the same hand-over between two Python threads through a
  bare ``threading.Condition`` (the cost of waking a thread, the GIL's included).
* GPU idle gap (CUDA only): from the end of one job's kernel to the start of the other's next
  kernel, with CUDA events recorded around each kernel on the job's stream, and with the kernels'
  own ``%globaltimer`` stamps where the stamp kernel loads (cuda_driver.py). Reference: the same
  two measurements for two kernels back to back on one stream.

The dry run measures the host latency on the simulated backend (a simulated kernel per iteration)
and skips the GPU gap.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from bench_common import (BenchError, Context, Row, arm_parser, emit, median, percentile,
                          prepare_torch, salus_runtime)

ITERATIONS = 300  # per job
WARMUP = 10  # hand-overs left out at the start
KERNEL_NS = 20_000  # the small kernel: 20 us
SLEEP_CYCLES = 40_000  # torch.cuda._sleep's fallback, about 20 us at 2 GHz
ARM_TIMEOUT_S = 60.0


# --- driver side ---------------------------------------------------------------------------------

def run(ctx: Context) -> None:
    got = ctx.run_arm("switch", [ctx.python, ctx.script("part_c_switch"), "--arm", "switch",
                                 "--backend", ctx.backend], ARM_TIMEOUT_S)
    if got is None:
        return
    host, ref = got["host_us"], got["condvar_us"]
    ctx.add_row(Row(
        part="C", name="host latency of a hand-over, two jobs in two threads", unit="us",
        value=host["median"], reference=ref["median"],
        reference_label="threading.Condition hand-over",
        note=f"p90 {host['p90']:.1f} us (reference p90 {ref['p90']:.1f}); "
             f"{host['count']} hand-overs; kernel: {got['kernel']}"))
    if ctx.dry_run:
        ctx.skip("GPU idle gap between two jobs' iterations: needs CUDA (dry run)")
        return
    for key, label in (("events", "CUDA events"), ("stamps", "globaltimer stamps")):
        gap, b2b = got["gpu_gap_us"].get(key), got["back_to_back_us"].get(key)
        if gap is None or b2b is None:
            ctx.skip(f"GPU idle gap by {label}: {got['kernel']}")
            continue
        ctx.add_row(Row(
            part="C", name=f"GPU idle gap between two jobs' iterations ({label})", unit="us",
            value=gap["median"], reference=b2b["median"],
            reference_label="two kernels back to back on one stream",
            note=f"p90 {gap['p90']:.1f} us, min {gap['min']:.1f} us; {gap['count']} hand-overs; "
                 f"kernel {KERNEL_NS / 1000:.0f} us"))


# --- arm side ------------------------------------------------------------------------------------

def condvar_handover(count: int) -> list[float]:
    """Microseconds from one thread's notify to the other's wake-up, ``count`` hand-overs."""
    cond = threading.Condition()
    state = {"turn": 0, "since": 0}
    latencies: list[float] = []

    def player(me: int) -> None:
        for _ in range(count // 2):
            with cond:
                while state["turn"] != me:
                    cond.wait()
                if state["since"]:
                    latencies.append((time.perf_counter_ns() - state["since"]) / 1e3)
                state["since"] = time.perf_counter_ns()
                state["turn"] = 1 - me
                cond.notify()

    threads = [threading.Thread(target=player, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies[WARMUP:]


@dataclass
class Record:
    job: int
    slot: int
    begun_ns: int  # begin_iteration returned
    done_ns: int  # the body is done; the turn is about to end


class Kernels:
    """The small kernel of each iteration and what times it: CUDA events around it, and its
    globaltimer stamps when the stamp kernel loads; on the simulator, a simulated kernel."""

    def __init__(self, backend: str, slots: int) -> None:
        self.cuda = backend == "cuda"
        self.stamp: Any = None
        self.how = "simulated kernel of 20 us (Job.sim_kernel)"
        if not self.cuda:
            return
        import torch

        from cuda_driver import stamp_kernel_or_reason

        self.torch = torch
        self.events = [(torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True)) for _ in range(slots)]
        self.stamps = torch.zeros(slots * 2, dtype=torch.int64, device="cuda")
        torch.cuda.synchronize()
        self.stamp, self.how = stamp_kernel_or_reason()

    def launch(self, slot: int, job: Any = None) -> None:
        """The kernel on the current stream (the job's, inside its iteration)."""
        if not self.cuda:
            job.sim_kernel(KERNEL_NS / 1e9)
            job.synchronize()  # fair charges a simulated kernel's time once it has run
            return
        stream = self.torch.cuda.current_stream()
        self.events[slot][0].record(stream)
        if self.stamp is not None:
            self.stamp.launch(stream.cuda_stream, self.stamps.data_ptr() + 16 * slot, KERNEL_NS)
        else:
            self.torch.cuda._sleep(SLEEP_CYCLES)
        self.events[slot][1].record(stream)

    def gap_events_us(self, before: int, after: int) -> float:
        return self.events[before][1].elapsed_time(self.events[after][0]) * 1e3

    def stamp_pairs(self) -> Optional[list[tuple[int, int]]]:
        if self.stamp is None:
            return None
        flat = self.stamps.cpu().tolist()
        return list(zip(flat[0::2], flat[1::2]))


def back_to_back(kernels: Kernels, pairs: int) -> dict[str, Optional[dict[str, float]]]:
    """Two kernels back to back on the default stream, ``pairs`` times: the gaps between them."""
    for i in range(pairs):
        kernels.launch(2 * i)
        kernels.launch(2 * i + 1)
    kernels.torch.cuda.synchronize()
    events = [kernels.gap_events_us(2 * i, 2 * i + 1) for i in range(pairs)]
    stamps = kernels.stamp_pairs()
    stamp_gaps = None if stamps is None else [
        (stamps[2 * i + 1][0] - stamps[2 * i][1]) / 1e3 for i in range(pairs)]
    return {"events": summary(events[WARMUP:]),
            "stamps": None if stamp_gaps is None else summary(stamp_gaps[WARMUP:])}


def take_turns(runtime: Any, kernels: Kernels) -> list[Record]:
    """Two jobs, one thread each, ITERATIONS iterations each, one kernel per iteration."""
    jobs = [runtime.add_job(f"switch-{i}") for i in range(2)]
    records: list[Record] = []
    lock = threading.Lock()
    slots = iter(range(2 * ITERATIONS))
    start = threading.Barrier(2)

    finished = [False, False]

    def other_waits(k: int) -> None:
        # As benchmarks/switch_bench.cpp does: a turn ends only once the other job is blocked
        # in begin_iteration, so that each end is a hand-over, not a lane left free.
        other = 1 - k
        while not finished[other] and jobs[other].stats().state != "waiting":
            time.sleep(0)

    def work(k: int) -> None:
        job = jobs[k]
        start.wait()
        for _ in range(ITERATIONS):
            with job.iteration():
                begun = time.perf_counter_ns()
                with lock:
                    slot = next(slots)
                kernels.launch(slot, job)
                other_waits(k)
                done = time.perf_counter_ns()
            records.append(Record(k, slot, begun, done))
        finished[k] = True

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for job in jobs:
        job.leave()
    return sorted(records, key=lambda r: r.begun_ns)


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        raise BenchError("no hand-over was measured (the jobs never alternated)")
    return {"median": float(median(values) or 0.0), "p90": float(percentile(values, 0.9) or 0.0),
            "min": min(values), "count": len(values)}


def handovers(records: list[Record]) -> list[tuple[Record, Record]]:
    """Consecutive iterations of different jobs: the turns that changed hands."""
    turns = [(a, b) for a, b in zip(records, records[1:]) if a.job != b.job]
    return turns[WARMUP:]


def arm_main(argv: list[str]) -> int:
    args = arm_parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.arm != "switch":
        raise BenchError(f"unknown arm {args.arm!r} (switch)")
    cuda = args.backend == "cuda"
    runtime = salus_runtime(args.backend, enable_torch=cuda)
    if cuda:
        prepare_torch(args.backend)
    reference = condvar_handover(2 * ITERATIONS)
    kernels = Kernels(args.backend, max(2 * ITERATIONS, 2 * 100))
    b2b = back_to_back(kernels, 100) if cuda else {}
    records = take_turns(runtime, kernels)
    turns = handovers(records)
    result: dict[str, Any] = {
        "arm": args.arm, "kernel": kernels.how,
        "host_us": summary([(b.begun_ns - a.done_ns) / 1e3 for a, b in turns]),
        "condvar_us": summary(reference), "gpu_gap_us": {}, "back_to_back_us": b2b}
    if cuda:
        kernels.torch.cuda.synchronize()
        result["gpu_gap_us"]["events"] = summary(
            [kernels.gap_events_us(a.slot, b.slot) for a, b in turns])
        stamps = kernels.stamp_pairs()
        if stamps is not None:
            result["gpu_gap_us"]["stamps"] = summary(
                [(stamps[b.slot][0] - stamps[a.slot][1]) / 1e3 for a, b in turns])
    emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(arm_main(sys.argv[1:]))
