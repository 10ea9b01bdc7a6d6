"""The placer: one async Ray actor per cluster that admits trials to GPU workers.

``run`` is the whole life of a trial as Ray sees it: wait until the trial fits a GPU (the
admission rule of placement.py), run it on that GPU's worker, give its place back. The driver
holds the ObjectRef of ``run``, so results and errors come back through Ray as usual, and
``ray.cancel`` on it cancels the trial: while it waits, it leaves the queue; while it runs, its
Salus job is cancelled and its place is given back only once the worker has freed its memory.

Waiting trials are served in arrival order, first fit: a trial that fits now starts even if an
earlier, larger one still waits (so a large trial can wait long behind a stream of small ones).
What a trial needs comes from its memory hints; without hints, from what the last trial of the
same profile measured; without either, a whole GPU (it runs alone until it has been measured).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import ray

from ..errors import InvalidArgument
from .errors import FitsNoGpu
from .placement import GpuLoad, Need, choose
from .worker import Outcome, TrialSpec


@dataclass
class Request:
    """A trial as the driver submits it."""

    spec: TrialSpec
    profile: str
    hinted: bool  # spec's hints say what it needs
    enforce: bool  # limit the job to what placement reserved for it
    # An actor that lives as long as somebody wants the result (a Ray Tune trial's), when that
    # is not the driver: when it dies, the trial is cancelled. The placer asks it whether it is
    # alive (__ray_ready__) once a second, so it must answer while the trial runs: not an actor
    # whose one thread waits for the trial (salus.ray.tune passes a sentinel its trial made).
    # (A driver's death takes the cluster's actors with it.)
    owner: Any = None


@dataclass
class _Waiter:
    trial_id: str
    need: Need
    placed: "asyncio.Future[int]"


class _OwnerGone(Exception):
    """The actor waiting for a trial died: the trial is cancelled."""


class Placer:
    OWNER_CHECK_SECONDS = 1.0
    def __init__(self, workers: list[Any], capacities: list[int], *,
                 max_trials: Optional[int] = None, placement: str = "spread",
                 margin: float = 0.1) -> None:
        if len(workers) != len(capacities) or not workers:
            raise InvalidArgument("a placer needs one capacity per worker, and a worker")
        self._workers = workers
        self._loads = [GpuLoad(c, max_trials) for c in capacities]
        self._placement = placement
        self._margin = margin  # added to a measured profile: the next trial may be a bit larger
        self._profiles: dict[str, Need] = {}
        self._measuring: dict[str, asyncio.Event] = {}  # profiles whose first trial runs now
        self._queue: list[_Waiter] = []

    # --- the trial's life ---
    async def run(self, request: Request, fn: Callable[[Any], Any], config: Any) -> Any:
        need = await self._need(request)
        try:
            return await self._place_and_run(request, need, fn, config)
        finally:
            if need.exclusive:
                self._measured(request.profile)

    async def _place_and_run(self, request: Request, need: Need, fn: Callable[[Any], Any],
                             config: Any) -> Any:
        gpu = await self._admit(request.spec.trial_id, need)
        spec = request.spec
        # Only hints are a promise: a profile measured another trial, maybe a smaller one.
        if request.enforce and request.hinted and need.total < self._loads[gpu].capacity:
            spec = replace(spec, limit_total=need.total)
        worker = self._workers[gpu]
        done = asyncio.wrap_future(worker.run.remote(spec, fn, config).future())
        try:
            outcome: Outcome = await self._result_while_wanted(done, request.owner)
        except (asyncio.CancelledError, _OwnerGone):
            worker.cancel.remote(spec.trial_id)
            # Its place is given back once its memory is: wait for the worker to finish it.
            await asyncio.wait([done])
            raise
        else:
            self._profiles[request.profile] = Need(outcome.persistent_peak,
                                                   outcome.ephemeral_peak)
        finally:
            self._release(gpu, spec.trial_id)
        return outcome.value

    async def _result_while_wanted(self, done: "asyncio.Future[Outcome]", owner: Any) -> Outcome:
        """The worker's outcome; raises _OwnerGone if the owner dies first."""
        if owner is None:
            return await asyncio.shield(done)
        while True:
            finished, _ = await asyncio.wait([done], timeout=self.OWNER_CHECK_SECONDS)
            if finished:
                return done.result()
            try:
                await owner.__ray_ready__.remote()
            except ray.exceptions.RayActorError:
                raise _OwnerGone() from None

    async def _need(self, request: Request) -> Need:
        spec = request.spec
        if request.hinted:
            need = Need(spec.persistent_hint, spec.ephemeral_hint)
        else:
            # Trials of a profile nobody measured yet wait for the first one to be measured
            # (it runs on a GPU of its own), rather than each taking a whole GPU.
            while request.profile not in self._profiles:
                measuring = self._measuring.get(request.profile)
                if measuring is None:
                    self._measuring[request.profile] = asyncio.Event()
                    return Need(0, 0, exclusive=True)
                await measuring.wait()
            measured = self._profiles[request.profile]
            need = Need(int(measured.persistent * (1 + self._margin)),
                        int(measured.ephemeral_peak * (1 + self._margin)))
        if not any(load.fits_alone(need) for load in self._loads):
            largest = max(load.capacity for load in self._loads)
            raise FitsNoGpu(
                f"trial '{spec.name}' needs {need.persistent} persistent + {need.ephemeral_peak} "
                f"ephemeral bytes, more than the largest GPU's {largest}",
                trial=spec.name, persistent=need.persistent, ephemeral_peak=need.ephemeral_peak,
                largest_gpu=largest)
        return need

    async def _admit(self, trial_id: str, need: Need) -> int:
        waiter = _Waiter(trial_id, need, asyncio.get_running_loop().create_future())
        self._queue.append(waiter)
        self._dispatch()
        try:
            return await waiter.placed
        except asyncio.CancelledError:
            if waiter in self._queue:
                self._queue.remove(waiter)
            elif waiter.placed.done() and not waiter.placed.cancelled():
                self._release(waiter.placed.result(), trial_id)  # placed as it was cancelled
            raise

    def _measured(self, profile: str) -> None:
        """The first trial of a profile ended: the waiting ones go on (if it failed before it
        was measured, the next of them is measured instead)."""
        event = self._measuring.pop(profile, None)
        if event is not None:
            event.set()

    def _release(self, gpu: int, trial_id: str) -> None:
        self._loads[gpu].needs.pop(trial_id, None)
        self._dispatch()

    def _dispatch(self) -> None:
        """Places the waiting trials that fit now, in arrival order. The GPU is taken here, for
        the waiter, so that two waiters woken together cannot both count on the same bytes."""
        for waiter in list(self._queue):
            gpu = choose(self._loads, waiter.need, self._placement)
            if gpu is None:
                continue
            self._queue.remove(waiter)
            self._loads[gpu].needs[waiter.trial_id] = waiter.need
            waiter.placed.set_result(gpu)

    # --- what the driver may ask ---
    def load(self) -> list[dict[str, Any]]:
        return [{"gpu": i, "capacity": load.capacity, "trials": len(load.needs),
                 "committed": load.committed()} for i, load in enumerate(self._loads)]

    def waiting(self) -> int:
        return len(self._queue)

    def profiles(self) -> dict[str, tuple[int, int]]:
        return {k: (v.persistent, v.ephemeral_peak) for k, v in self._profiles.items()}
