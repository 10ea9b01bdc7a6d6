"""The GPU worker: one Ray actor per GPU holding one Salus runtime; each trial runs in one of the
actor's threads as a Salus job.

It is a threaded actor (``max_concurrency``): Ray runs each ``run`` call in a thread of its own,
so a trial's ``with job.iteration():`` blocks only that thread while it waits for its turn.
Which trials come here is the placer's business (placer.py); the worker only runs them, keeps
their memory within their limits (Salus job limits), and says what they measured.
"""

from __future__ import annotations

import gc
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import salus
from salus.errors import JobCancelled

from .context import TrialContext, _enter, _leave


@dataclass(frozen=True)
class TrialSpec:
    """What the placer asks of a worker for one trial (sizes in bytes; None: unlimited)."""

    trial_id: str
    name: str
    seed: int
    persistent_hint: int = 0
    ephemeral_hint: int = 0
    limit_total: Optional[int] = None
    priority: int = 0
    blocks_outlive_job: bool = True


@dataclass(frozen=True)
class Outcome:
    """What ``run`` hands the placer: the function's value and what the trial measured."""

    value: Any
    persistent_peak: int
    ephemeral_peak: int


@dataclass
class WorkerStats:
    worker: int
    backend: str
    capacity: int  # bytes the worker's runtime may hold on its GPU
    allocated: int  # bytes allocated now
    peak_allocated: int
    running: list[str] = field(default_factory=list)  # names of the trials running now
    peak_running: int = 0  # most trials at once
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    busy_seconds: float = 0.0  # simulated GPU only: time with a kernel running
    utilization_seconds: float = 0.0  # simulated GPU only: busy share integrated over time


class GpuWorker:
    """``backend``: "auto" (the GPU Ray gave the actor, else simulated), "cuda" or "sim";
    ``memory``: the simulated GPU's size, or on a real GPU the most Salus may hold there (None:
    the runtime's default: the whole GPU); ``torch``: route PyTorch's allocations through the
    runtime (salus.torch) so trials' tensors are Salus memory; ``torch_threads``: torch's
    intra-op threads for the whole actor (1 keeps trials deterministic and out of each other's
    way on the CPU). ``socket``: a process of that salusd instead of a runtime of its own (a
    trial in a process of its own, process_worker.py); its trials' jobs are on the daemon's
    device ``index``."""

    def __init__(self, index: int, *, backend: str = "auto", memory: Any = None,
                 policy: str = "fair", contention: str = "processor_sharing",
                 torch: bool = True, torch_threads: int = 1,
                 setup: Optional[Callable[["salus.Runtime"], None]] = None,
                 socket: Optional[str] = None) -> None:
        self.index = index
        self.device = 0 if socket is None else index
        if socket is not None:
            self.runtime = salus.connect(socket)
        elif backend == "sim":
            self.runtime = salus.Runtime("sim", memory=memory, policy=policy,
                                         contention=contention)
        else:
            self.runtime = salus.Runtime(backend, policy=policy, contention=contention,
                                         device_limits=None if memory is None else [memory])
        if torch:
            import torch as torch_module
            from salus import torch as salus_torch

            torch_module.set_num_threads(torch_threads)
            salus_torch.enable(self.runtime)
        if setup is not None:
            setup(self.runtime)
        self.connected = socket is not None
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self._live: dict[str, TrialContext] = {}
        self._peak_running = 0
        self._counts = {"finished": 0, "failed": 0, "cancelled": 0}

    # --- what the placer and the cluster ask ---
    def info(self) -> dict[str, Any]:
        """What the placer plans with: the GPU's Salus limit less what is held outside trials
        when the worker starts (what ``setup`` allocated)."""
        stats = self.runtime.device_stats(self.device)
        return {"worker": self.index, "backend": self.runtime.backend_name,
                "capacity": max(0, stats.limit - stats.allocated), "policy": self.runtime.policy}

    def run(self, spec: TrialSpec, fn: Callable[[Any], Any], config: Any) -> Outcome:
        """Runs ``fn(config)`` as a Salus job in this thread; raises what it raised."""
        limits = None if spec.limit_total is None else salus.JobLimits(total=spec.limit_total)
        job = self.runtime.add_job(
            spec.name, priority=spec.priority, limits=limits, device=self.device,
            hints=salus.MemoryHints(persistent=spec.persistent_hint,
                                    ephemeral_peak=spec.ephemeral_hint),
            blocks_outlive_job=spec.blocks_outlive_job)
        ctx = TrialContext(spec.trial_id, spec.name, spec.seed, self.index, job,
                           self.runtime.backend_name, self._build_lock)
        with self._lock:
            self._live[spec.trial_id] = ctx
            self._peak_running = max(self._peak_running, len(self._live))
        outcome = "failed"
        _enter(ctx)
        try:
            if self.connected:
                # The process is the trial's: what it allocates outside iterations (its data, a
                # batch made between them) is the job's persistent memory, on the job's device,
                # not unattributed memory of device 0.
                with job:
                    value = fn(config)
            else:
                value = fn(config)
            stats = job.stats()
            # The last iteration's peak, once there are two: the first one (build_model) also
            # made the weights, which are counted as persistent.
            ephemeral = (stats.ephemeral_peak_bytes if stats.iterations > 1
                         else stats.memory.ephemeral.peak)
            outcome = "finished"
            return Outcome(value, stats.memory.persistent.peak, ephemeral)
        except JobCancelled:
            outcome = "cancelled"
            raise
        except BaseException as e:
            # The frames of the failed call hold its tensors: clear them, so that its memory
            # comes back before the placer gives its place to another trial.
            traceback.clear_frames(e.__traceback__)
            raise
        finally:
            _leave()
            job.leave()
            gc.collect()  # tensors in reference cycles of the trial's objects
            with self._lock:
                del self._live[spec.trial_id]
                self._counts[outcome] += 1

    def cancel(self, trial_id: str) -> bool:
        """Cancels a running trial: its next wait for a turn raises JobCancelled. False when it
        is not running here (finished already, or never came)."""
        with self._lock:
            ctx = self._live.get(trial_id)
        if ctx is None:
            return False
        ctx.job.cancel()
        return True

    def reports(self, trial_id: str, start: int = 0) -> Optional[list[dict[str, Any]]]:
        """The trial's reports from index ``start``; None when it is not running here."""
        with self._lock:
            ctx = self._live.get(trial_id)
        return None if ctx is None else ctx.reports_since(start)

    def stats(self) -> WorkerStats:
        device = self.runtime.device_stats(self.device)
        with self._lock:
            running = [ctx.name for ctx in self._live.values()]
            out = WorkerStats(self.index, self.runtime.backend_name, device.limit,
                              device.allocated, device.peak_allocated, running,
                              self._peak_running, **self._counts)
        if self.runtime.backend_name == "sim" and not self.connected:
            activity = self.runtime.device_activity(0)
            out.busy_seconds = activity["busy_seconds"]
            out.utilization_seconds = activity["utilization_seconds"]
        return out

    def job_stats(self) -> list[salus.JobStats]:
        return self.runtime.job_stats()
