"""Running jobs for real: a salus.Runtime on simulated GPUs, one thread per job, time-scaled.

``run`` and ``torch`` modes differ only in what a job does in an iteration; everything else is
here: making the runtime, starting each job's thread at its (scaled) arrival time, timing
requests, sampling utilization and memory while the jobs run, and turning what the runtime
measured back into simulated seconds and bytes, so their results read like the simulator's.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import salus

from ..errors import Error
from .errors import ModeNotSupported
from .experiment import Experiment, Variant
from .jobs import JobSpec
from .results import DeviceResult, JobResult, Timeline, VariantResult

PAGE = 2 << 20


def devices_for(exp: Experiment, mode: str, variant: Variant,
                specs: list[JobSpec]) -> tuple[int, list[JobSpec]]:
    """How many simulated GPUs the runtime gets, and each job pinned to one: the runtime has
    no placement of its own (add_job takes a device)."""
    if variant.dedicated:
        return len(specs), [replace(s, device=i) for i, s in enumerate(specs)]
    pinned = max((s.device for s in specs), default=-1) + 1
    if pinned:
        return max(pinned, 1), specs
    if variant.gpus > 1:
        raise ModeNotSupported(exp.name, mode, "the runtime has no placement across GPUs "
                               "(add_job takes a device): compare placements in simulate mode")
    return 1, [replace(s, device=0) for s in specs]


def scaled_for_run(specs: list[JobSpec], max_steps: Optional[int]) -> list[JobSpec]:
    """At most ``max_steps`` iterations per job, so that a run takes seconds: training jobs are
    coarsened (same work in fewer, longer steps), inference jobs answer fewer requests."""
    if not max_steps:
        return specs
    out = []
    for s in specs:
        if s.iterations <= max_steps:
            out.append(s)
        elif s.kind == "inference":
            out.append(replace(s, iterations=max_steps))
        else:
            out.append(replace(s, iterations=max_steps,
                               iteration_seconds=s.work_seconds / max_steps))
    return out


@dataclass
class LiveJob:
    """One job's thread: its spec (simulated seconds and bytes) and what it measured."""

    spec: JobSpec
    handle: Any = None  # salus.Job once it arrived
    arrival: float = math.nan
    first_start: float = math.nan
    finish: float = math.nan
    latencies: list[float] = field(default_factory=list)
    error: Optional[BaseException] = None
    done: bool = False


Body = Callable[["LiveRun", LiveJob], None]


class LiveRun:
    """One variant run on a fresh runtime. ``time_scale``: real seconds per simulated second;
    ``memory_scale``: bytes in the runtime per simulated byte."""

    def __init__(self, exp: Experiment, variant: Variant, specs: list[JobSpec], devices: int, *,
                 time_scale: float, memory_scale: float, gpu_memory: int,
                 sample_seconds: float, memory_hints: bool = True,
                 blocks_outlive_job: bool = True) -> None:
        self.exp = exp
        self.variant = variant
        self.jobs = [LiveJob(s) for s in specs]
        self.devices = devices
        self.time_scale = time_scale
        self.memory_scale = memory_scale
        self.sample_seconds = sample_seconds
        # Hints seed the profiler; with real PyTorch tensors the workload's sizes would mislead.
        self.memory_hints = memory_hints
        # Raw blocks (run mode) die with their job; tensors (torch mode) may outlive it.
        self.blocks_outlive_job = blocks_outlive_job
        memory = max(PAGE * 4, math.ceil(gpu_memory * memory_scale / PAGE) * PAGE)
        self.runtime = salus.Runtime("sim", devices=devices, memory=memory,
                                     policy=variant.policy, contention=exp.contention)
        self._t0 = 0.0
        self._samples: list[list[tuple[float, float, float, float, float]]] = \
            [[] for _ in range(devices)]
        self._stop = threading.Event()

    # --- time and memory in the experiment's units ---
    def now(self) -> float:
        """Simulated seconds since the run started."""
        return (time.monotonic() - self._t0) / self.time_scale

    def real(self, seconds: float) -> float:
        return seconds * self.time_scale

    def bytes(self, simulated: int) -> int:
        return max(0, int(simulated * self.memory_scale))

    # --- what a body uses ---
    @contextmanager
    def iteration(self, job: LiveJob) -> Iterator[Any]:
        """One iteration: waits for the job's turn, runs the body, waits until the GPU got
        through the iteration's work, and times it as a request (asked to end)."""
        asked = self.now()
        with job.handle.iteration() as it:
            if math.isnan(job.first_start):
                job.first_start = self.now()
            yield it
            job.handle.synchronize()
        if job.spec.kind == "inference":
            job.latencies.append(self.now() - asked)

    def wait_for_gpu(self, job: LiveJob) -> None:
        """Inside an iteration, after enqueuing kernels: waits for the job's stream, so that
        what the host does next (freeing activations in backward) happens at GPU pace."""
        job.handle.synchronize()

    def think(self, job: LiveJob) -> None:
        if job.spec.think_seconds > 0:
            time.sleep(self.real(job.spec.think_seconds))

    # --- the run ---
    def run(self, body: Body, *, setup: Optional[Callable[[], None]] = None,
            teardown: Optional[Callable[[], None]] = None,
            trace: Optional[Path] = None) -> VariantResult:
        threads = [threading.Thread(target=self._job_thread, args=(j, body), daemon=True,
                                    name=j.spec.name) for j in self.jobs]
        monitor = threading.Thread(target=self._monitor, daemon=True, name="salus-bench monitor")
        try:
            if setup is not None:
                setup()
            self._t0 = time.monotonic()
            monitor.start()
            for t in threads:
                t.start()
            self._join(threads)
            self._stop.set()
            monitor.join()
            if trace is not None:
                self.runtime.write_trace(trace)
            result = self._result(trace.name if trace is not None else None)
        finally:
            self._stop.set()
            if monitor.is_alive():  # a failed run: the monitor must not read a closed runtime
                monitor.join()
            if teardown is not None:
                teardown()
            self.runtime.close()
        # A job the runtime refused memory is a result (reported per job); anything else is a
        # failure of the run.
        failed = next((j for j in self.jobs if j.error is not None
                       and not isinstance(j.error, salus.OutOfMemory)), None)
        if failed is not None:
            raise failed.error  # type: ignore[misc]
        return result

    def _join(self, threads: list[threading.Thread]) -> None:
        # A generous bound: every job's work one after the other, ten times, plus its arrival.
        serial = sum(j.spec.work_seconds + j.spec.iterations * j.spec.think_seconds
                     for j in self.jobs)
        latest = max((j.spec.arrival for j in self.jobs), default=0.0)
        deadline = time.monotonic() + 60.0 + 10.0 * self.real(serial + latest)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [(j, t) for j, t in zip(self.jobs, threads) if t.is_alive()]
        if stuck:
            # What each stuck job was doing, read before the cancels change it: a hang that a
            # busy CI machine shows once must say where it was.
            where = self._where(stuck)
            for j, _ in stuck:
                if j.handle is not None:
                    j.handle.cancel()
            for t in threads:
                t.join(10.0)
            raise Error(f"{len(stuck)} job(s) did not finish in time (first: "
                        f"{stuck[0][0].spec.name}); they were cancelled. Where they were:\n"
                        f"{where}", jobs=[j.spec.name for j, _ in stuck], where=where)

    def _where(self, stuck: list[tuple[LiveJob, threading.Thread]]) -> str:
        """Each stuck job's state in the runtime and its thread's innermost Python frames."""
        try:
            states = {s.name: s for s in self.runtime.job_stats()}
        except Error as e:
            states = {}
            lines = [f"  (job_stats failed: {e})"]
        else:
            lines = []
        frames = sys._current_frames()
        for j, t in stuck:
            s = states.get(j.spec.name)
            state = (f"{s.state}, {s.iterations} iterations, lane {s.lane}, "
                     f"{s.memory.in_use} bytes in use" if s is not None else "not in job_stats")
            lines.append(f"  {j.spec.name}: {state}")
            frame = frames.get(t.ident) if t.ident is not None else None
            if frame is not None:
                for entry in traceback.format_stack(frame)[-4:]:
                    lines.append("    " + entry.rstrip().replace("\n", "\n    "))
        others = [s for s in states.values() if s.state in ("running", "waiting")
                  and s.name not in {j.spec.name for j, _ in stuck}]
        for s in others:
            lines.append(f"  (not stuck) {s.name}: {s.state}, lane {s.lane}")
        return "\n".join(lines)

    def _job_thread(self, job: LiveJob, body: Body) -> None:
        spec = job.spec
        try:
            delay = self._t0 + self.real(spec.arrival) - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            job.arrival = self.now()
            job.handle = self.runtime.add_job(
                spec.name, kind=spec.kind, priority=spec.priority, device=spec.device,
                expected_iterations=spec.iterations,
                hints=self._hints(spec), blocks_outlive_job=self.blocks_outlive_job)
            body(self, job)
        except BaseException as e:  # noqa: BLE001 - re-raised by run()
            job.error = e
        finally:
            if job.handle is not None:
                try:
                    job.handle.leave()
                except Error as e:
                    job.error = job.error or e
            job.finish = self.now()
            job.done = True

    def _hints(self, spec: JobSpec) -> salus.MemoryHints:
        if not self.memory_hints:
            return salus.MemoryHints(iteration_seconds=self.real(spec.iteration_seconds))
        return salus.MemoryHints(persistent=self.bytes(spec.persistent_bytes),
                                 ephemeral_peak=self.bytes(spec.ephemeral_peak_bytes),
                                 iteration_seconds=self.real(spec.iteration_seconds))

    def _monitor(self) -> None:
        """Samples each device's utilization (from its compute activity since the last sample),
        memory in use and the running and waiting jobs."""
        last = [0.0] * self.devices
        last_t = 0.0
        while True:
            stopping = self._stop.wait(self.sample_seconds)
            t = self.now()
            states = self.runtime.job_stats()
            for d in range(self.devices):
                activity = self.runtime.device_activity(d)
                util_s = float(activity["utilization_seconds"]) / self.time_scale
                dt = t - last_t
                util = (util_s - last[d]) / dt if dt > 0 else 0.0
                last[d] = util_s
                memory = self.runtime.device_stats(d).allocated / self.memory_scale
                running = sum(1 for s in states if s.device == d and s.state == "running")
                waiting = sum(1 for s in states if s.device == d and s.state == "waiting")
                self._samples[d].append((t, min(max(util, 0.0), 1.0), float(running),
                                         memory, float(waiting)))
            last_t = t
            if stopping:
                return

    def _result(self, trace: Optional[str]) -> VariantResult:
        ts = self.time_scale
        stats = {s.name: s for s in self.runtime.job_stats()}
        jobs = []
        for j in self.jobs:
            s = stats.get(j.spec.name)
            jobs.append(JobResult(
                name=j.spec.name, workload=j.spec.workload, kind=j.spec.kind,
                device=j.spec.device, arrival=j.arrival,
                first_start=j.first_start, finish=j.finish,
                attained=s.attained_seconds / ts if s else 0.0, work=j.spec.work_seconds,
                waiting=s.waiting_seconds / ts if s else 0.0,
                max_wait=s.max_wait_seconds / ts if s else 0.0,
                iterations=s.iterations if s else 0, latencies=j.latencies,
                error=_describe(j.error)))
        makespan = max((j.finish for j in jobs), default=0.0)
        devices = []
        for d in range(self.devices):
            activity = self.runtime.device_activity(d)
            peak = self.runtime.device_stats(d).peak_allocated
            devices.append(DeviceResult(
                device=d, busy=float(activity["busy_seconds"]) / ts,
                utilization=float(activity["utilization_seconds"]) / ts,
                work=float(activity["work_seconds"]) / ts,
                peak_memory=int(peak / self.memory_scale),
                jobs=sum(1 for j in jobs if j.device == d)))
        timelines = [Timeline(device=d, time=[x[0] for x in s], utilization=[x[1] for x in s],
                              running=[x[2] for x in s], memory=[x[3] for x in s],
                              waiting=[x[4] for x in s])
                     for d, s in enumerate(self._samples)]
        iterations = sum(j.iterations for j in jobs)
        return VariantResult(self.variant, makespan,
                             iterations / makespan if makespan > 0 else 0.0, jobs, devices,
                             timelines, trace)


def _describe(error: Optional[BaseException]) -> str:
    if error is None:
        return ""
    message = getattr(error, "message", None) or str(error)
    return f"{type(error).__name__}: {message}"
