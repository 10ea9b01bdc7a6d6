"""Part D: turns between processes. Two processes under ``salus run`` (a salusd of the
benchmark's own, policy fair) mark their iterations with ``salus.iteration()`` and take turns.

* Host time per turn: from one process's iteration body being done (its turn about to end) to
  the other process's ``begin_iteration`` returning, both on CLOCK_MONOTONIC, which every process
  of the machine shares.
* GPU gap at a turn (CUDA only): each iteration runs two kernels that stamp the GPU's global
  timer (``%globaltimer``, one clock for every process on the GPU; cuda_driver.StampKernel) at
  their start and end. At each turn, the next process's first kernel's start minus the previous
  process's last kernel's end: a gap, or an overlap when negative. Two phases: ``sync`` (the
  iteration ends with a stream synchronize, as a loop that reads its loss does) and ``queued``
  (it ends with its kernels still queued).

Reference for both: a bare Unix socket round trip between two processes (SOCK_SEQPACKET, as
salusd's socket is; a turn is a hop in and a hop out). The dry run measures the host time per
turn between two processes on the simulated backend and skips the GPU gap.
"""
from __future__ import annotations

import os
import socket
import sys
import time
from typing import Any, Optional

from bench_common import (Barrier, BenchError, Context, Daemon, Row, arm_parser, emit, median,
                          percentile, prepare_torch, salus_run, shared_runtime, wait_for_go)

ITERATIONS = 200  # per phase and process
WARMUP = 10  # turns left out at the start of each phase
KERNELS = 2  # per iteration
KERNEL_NS = 100_000
HOST_BODY_S = 0.0005  # the simulated backend's iteration: host work only
QUEUED_HOST_S = 0.0001  # the queued phase: host work while the kernels run
RTT_COUNT = 2000
ARM_TIMEOUT_S = {"cuda": 90.0, "sim": 60.0}


# --- driver side ---------------------------------------------------------------------------------

def run(ctx: Context) -> None:
    script = ctx.script("part_d_turns")
    rtt = ctx.run_arm("socket_rtt", [ctx.python, script, "--arm", "socket_rtt"], 30.0)
    clients = _clients(ctx, script)
    if rtt is None or clients is None:
        ctx.skip("no rows: " + ("the socket round trip" if rtt is None else "a client")
                 + " failed")
        return
    ref = rtt["rtt_us"]
    first_phase = clients[0]["phases"][0]
    host = turn_times(clients, first_phase)
    ctx.add_row(Row(
        part="D", name=f"host time per turn, two processes under salus run ({first_phase})",
        unit="us", value=median(host), reference=ref["median"],
        reference_label="Unix socket round trip between two processes",
        note=f"p90 {percentile(host, 0.9):.1f} us over {len(host)} turns; reference p90 "
             f"{ref['p90']:.1f} us"))
    if ctx.dry_run:
        ctx.skip("GPU gap at a turn between processes: needs CUDA (dry run)")
        return
    if clients[0].get("stamps") is None:
        ctx.skip(f"GPU gap at a turn: {clients[0]['kernel']}")
        return
    for phase in clients[0]["phases"]:
        try:
            gaps = gpu_gaps(clients, phase)
        except BenchError as e:  # one phase's turns say nothing of the other's
            ctx.fail(f"clients ({phase})", str(e))
            continue
        negative = sum(g < 0 for g in gaps)
        ctx.add_row(Row(
            part="D", name=f"GPU gap at a turn between processes ({phase})", unit="us",
            value=median(gaps), reference=ref["median"],
            reference_label="Unix socket round trip between two processes",
            note=f"{clients[0]['kernel']}; min {min(gaps):.1f} us, p90 "
                 f"{percentile(gaps, 0.9):.1f} us; {negative}/{len(gaps)} turns overlap"))


def _clients(ctx: Context, script: str) -> Optional[list[dict[str, Any]]]:
    barrier = Barrier(ctx.out / "barriers" / "D")
    with Daemon(ctx, "turns", ctx.backend, "1GiB" if ctx.dry_run else "4GiB", "fair") as daemon:
        arms = [(name, salus_run(ctx, daemon, name,
                                 [ctx.python, script, "--arm", "client", "--backend",
                                  ctx.backend, *barrier.args(name)]))
                for name in ("turns-a", "turns-b")]
        outcomes = ctx.run_together(arms, ARM_TIMEOUT_S[ctx.backend], barrier=barrier)
    results = [o.result for o in outcomes]
    if any(r is None for r in results):
        return None
    return [r for r in results if r is not None]


def _turns(clients: list[dict[str, Any]], phase: str) -> list[tuple[list[Any], list[Any]]]:
    """(previous, next) iterations, from different processes and one phase, in the order the
    turns were taken; each record [process, iteration, begin_call, begun, done, ended] in ns."""
    records = sorted(([p, *r[1:]] for p, c in enumerate(clients) for r in c["records"]
                      if r[0] == phase), key=lambda r: r[3])
    turns = [(a, b) for a, b in zip(records, records[1:]) if a[0] != b[0]]
    if len(turns) <= WARMUP:
        raise BenchError(f"phase {phase}: the processes took {len(turns)} turns; they never "
                         "alternated (was one of them done before the other began?)")
    return turns[WARMUP:]


def turn_times(clients: list[dict[str, Any]], phase: str) -> list[float]:
    return [(b[3] - a[4]) / 1e3 for a, b in _turns(clients, phase)]


def gpu_gaps(clients: list[dict[str, Any]], phase: str) -> list[float]:
    stamps = [{(s[0], s[1], s[2]): (s[3], s[4]) for s in c["stamps"]} for c in clients]
    gaps = []
    for a, b in _turns(clients, phase):
        last_end = stamps[a[0]][(phase, a[1], KERNELS - 1)][1]
        first_start = stamps[b[0]][(phase, b[1], 0)][0]
        gaps.append((first_start - last_end) / 1e3)
    return gaps


# --- arm side ------------------------------------------------------------------------------------

def socket_rtt(count: int) -> list[float]:
    """Microseconds per round trip of one byte between this process and a forked echo."""
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the echo: no Python teardown, nothing of the parent's to flush
        here.close()
        while message := there.recv(64):
            there.send(message)
        os._exit(0)
    there.close()
    times = []
    for _ in range(count):
        start = time.perf_counter_ns()
        here.send(b"x")
        here.recv(64)
        times.append((time.perf_counter_ns() - start) / 1e3)
    here.close()
    os.waitpid(pid, 0)
    return times[WARMUP:]


class Body:
    """An iteration's work: stamp kernels on the job's stream (CUDA), or host time (simulator)."""

    def __init__(self, backend: str, phases: list[str]) -> None:
        self.cuda = backend == "cuda"
        self.stamp: Any = None
        self.how = "host work only (simulated backend)"
        self.slots: dict[tuple[str, int, int], int] = {}
        if not self.cuda:
            return
        from cuda_driver import stamp_kernel_or_reason

        self.torch = prepare_torch(backend)
        count = len(phases) * ITERATIONS * KERNELS
        self.buffer = self.torch.zeros(count * 2, dtype=self.torch.int64, device="cuda")
        self.torch.cuda.synchronize()
        self.stamp, self.how = stamp_kernel_or_reason()

    def run(self, phase: str, iteration: int) -> None:
        if not self.cuda:
            time.sleep(HOST_BODY_S)
            return
        stream = self.torch.cuda.current_stream()
        for k in range(KERNELS):
            if self.stamp is None:
                self.torch.cuda._sleep(KERNEL_NS * 2)  # cycles at about 2 GHz
                continue
            slot = self.slots.setdefault((phase, iteration, k), len(self.slots))
            self.stamp.launch(stream.cuda_stream, self.buffer.data_ptr() + 16 * slot, KERNEL_NS)
        if phase == "sync":
            stream.synchronize()
        else:
            time.sleep(QUEUED_HOST_S)

    def stamps(self) -> Optional[list[list[Any]]]:
        if self.stamp is None:
            return None
        self.torch.cuda.synchronize()
        flat = self.buffer.cpu().tolist()
        return [[*key, flat[2 * slot], flat[2 * slot + 1]] for key, slot in self.slots.items()]


def client(backend: str, ready: Optional[str], go: Optional[str]) -> dict[str, Any]:
    import salus

    shared_runtime()  # fails clearly when not under salus run
    phases = ["sync", "queued"] if backend == "cuda" else ["host"]
    body = Body(backend, phases)
    wait_for_go(ready, go)
    records = []
    for phase in phases:
        for i in range(ITERATIONS):
            begin_call = time.monotonic_ns()
            with salus.iteration():
                begun = time.monotonic_ns()
                body.run(phase, i)
                done = time.monotonic_ns()
            records.append([phase, i, begin_call, begun, done, time.monotonic_ns()])
    return {"phases": phases, "records": records, "stamps": body.stamps(), "kernel": body.how}


def arm_main(argv: list[str]) -> int:
    args = arm_parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.arm == "socket_rtt":
        times = socket_rtt(RTT_COUNT)
        emit({"arm": args.arm, "rtt_us": {"median": median(times),
                                          "p90": percentile(times, 0.9)}})
    elif args.arm == "client":
        emit({"arm": args.arm, **client(args.backend, args.ready, args.go)})
    else:
        raise BenchError(f"unknown arm {args.arm!r} (socket_rtt, client)")
    return 0


if __name__ == "__main__":
    sys.exit(arm_main(sys.argv[1:]))
