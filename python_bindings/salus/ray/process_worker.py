"""Trials as processes: each trial runs in a Ray actor process of its own, a process of the
node's salusd, which orders every trial's turns and hands each its GPU pages.

The placer sees the same worker as in the actor-per-GPU mode (one per GPU: ``run``, ``cancel``,
``reports``, ``stats``, ``info``), and keeps its admission rule and profiles; the worker here
only starts the trial's process, waits for its outcome and ends the process, so that a trial's
crash, out-of-memory or leak ends with its process and costs nobody else anything (the daemon
takes its pages back when the process has exited).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import ray

from ..errors import JobCancelled
from .worker import GpuWorker, Outcome, TrialSpec, WorkerStats


class ProcessGpuWorker:
    """Device ``index`` of the salusd at ``socket``: its trials run in processes of their own
    (``trial_cpus`` CPUs each, as Ray reserves them), as jobs of that device. ``capacity``: the
    bytes the placer may plan with there."""

    def __init__(self, index: int, *, socket: str, capacity: int, torch: bool = True,
                 torch_threads: int = 1, trial_cpus: float = 1, backend: str = "sim",
                 trial_options: Optional[dict[str, Any]] = None) -> None:
        self.index = index
        self._socket = socket
        self._capacity = capacity
        self._backend = backend
        # trial_options: where Ray puts the trials' processes and what they see (cluster.py's
        # trial_actor_options: the daemon's node, its GPUs).
        self._trial = ray.remote(GpuWorker).options(num_cpus=trial_cpus, max_concurrency=4,
                                                    max_restarts=0, **(trial_options or {}))
        self._trial_args = {"torch": torch, "torch_threads": torch_threads}
        self._lock = threading.Lock()
        self._live: dict[str, tuple[str, Any]] = {}  # trial id -> (name, its process's actor)
        self._peak_running = 0
        self._counts = {"finished": 0, "failed": 0, "cancelled": 0}

    def info(self) -> dict[str, Any]:
        return {"worker": self.index, "backend": self._backend, "capacity": self._capacity,
                "policy": "salusd"}

    def run(self, spec: TrialSpec, fn: Callable[[Any], Any], config: Any) -> Outcome:
        """Runs ``fn(config)`` in a new process as a job of salusd; raises what it raised (a
        process that died: Ray's ActorDiedError)."""
        actor = self._trial.remote(self.index, socket=self._socket, **self._trial_args)
        with self._lock:
            self._live[spec.trial_id] = (spec.name, actor)
            self._peak_running = max(self._peak_running, len(self._live))
        outcome = "failed"
        try:
            result: Outcome = ray.get(actor.run.remote(spec, fn, config))
            outcome = "finished"
            return result
        except ray.exceptions.TaskCancelledError:
            outcome = "cancelled"
            raise
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, JobCancelled):
                outcome = "cancelled"
            raise
        finally:
            with self._lock:
                del self._live[spec.trial_id]
                self._counts[outcome] += 1
            ray.kill(actor)  # the process goes; salusd takes its pages back when it has

    def cancel(self, trial_id: str) -> bool:
        with self._lock:
            live = self._live.get(trial_id)
        if live is None:
            return False
        try:
            return bool(ray.get(live[1].cancel.remote(trial_id)))
        except ray.exceptions.RayActorError:
            return False  # its process is gone already

    def reports(self, trial_id: str, start: int = 0) -> Optional[list[dict[str, Any]]]:
        with self._lock:
            live = self._live.get(trial_id)
        if live is None:
            return None
        try:
            return ray.get(live[1].reports.remote(trial_id, start))
        except ray.exceptions.RayActorError:
            return None

    def stats(self) -> WorkerStats:
        """Counts of the trials here; the bytes are what the daemon has handed out on this GPU
        to the trials' processes (now, and the most at once since it started)."""
        from ..cli import device_use

        use = device_use(self._socket)[self.index]
        with self._lock:
            return WorkerStats(self.index, "sim", self._capacity, use.granted, use.peak,
                               [name for name, _ in self._live.values()], self._peak_running,
                               **self._counts)

    def job_stats(self) -> list[Any]:
        return []
