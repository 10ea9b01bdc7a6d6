"""Ray Tune trials that run as Salus jobs: ``salus.ray.tune.trainable(fn, cluster)``.

Tune runs each trial as a small actor of its own; the trainable made here submits the training
function to the SalusCluster's placer (so it runs in a GPU worker, beside other trials, placed
by memory), forwards what the function reports (``salus.ray.report``) to ``tune.report`` as it
comes, and raises what the function raised, so Tune marks the trial errored::

    cluster = salus.ray.SalusCluster()
    tuner = tune.Tuner(
        tune.with_resources(salus.ray.tune.trainable(train, cluster, hints=...), {"cpu": 0.25}),
        param_space={"lr": tune.grid_search([1e-3, 1e-2])})
    tuner.fit()

The Tune trial actor only waits: give it a small CPU share, and no GPU (the worker has it).
"""

from __future__ import annotations

from typing import Any, Callable, Union

import ray

from .._runtime import MemoryHints
from .cluster import SalusCluster
from .context import trial


@ray.remote(num_cpus=0)
class _Sentinel:
    """Stands for a Tune trial to the placer, which cancels the trial when its owner dies. Ray
    ends an actor with the worker that made it, so this one lives as long as the trial's actor;
    and unlike that actor, whose one thread is busy running the trial (Tune's function trainable
    runs one call at a time), it answers the placer's "are you alive" at once."""


class _KeepReports:
    """The function, returning its reports with its value: the last reports of a trial come back
    with its result, not by polling a worker that has forgotten it."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn
        self.__qualname__ = getattr(fn, "__qualname__", repr(fn))

    def __call__(self, config: Any) -> tuple[Any, list[dict[str, Any]]]:
        value = self.fn(config)
        return value, trial().reports_since(0)


def trainable(fn: Callable[[Any], Any], cluster: SalusCluster, *,
              hints: Union[MemoryHints, dict[str, Any], None] = None,
              profile: Union[str, Callable[[dict[str, Any]], str], None] = None,
              poll_seconds: float = 0.2,
              seed_key: str = "seed") -> Callable[[dict[str, Any]], None]:
    """A Tune function trainable running ``fn(config)`` on ``cluster``. The trial's seed (for
    salus.ray.build_model) is ``config[seed_key]`` when present, else 0. If ``fn`` returns a dict
    and reported nothing, the dict is reported once at the end. ``profile``: a name, or a function
    of the config giving one (trials of a profile are placed by what the first one measured, when
    they have no hints)."""
    handle = cluster.handle
    wrapped = _KeepReports(fn)

    def run_trial(config: dict[str, Any]) -> None:
        from ray import tune

        name = tune.get_context().get_trial_name() or "tune-trial"
        named = profile(config) if callable(profile) else (profile or wrapped.__qualname__)
        sentinel = _Sentinel.remote()  # type: ignore[attr-defined]
        submitted = handle.submit(wrapped, config, name=name, seed=int(config.get(seed_key, 0)),
                                  hints=hints, profile=named, priority=0, owner=sentinel)
        seen = 0
        finished = False
        try:
            while not ray.wait([submitted.ref], timeout=poll_seconds)[0]:
                for metrics in handle.reports(submitted.trial_id, seen):
                    tune.report(metrics)
                    seen += 1
            value, reports = ray.get(submitted.ref)
            finished = True
        finally:
            if not finished:  # Tune stopped the trial, or waiting failed: stop it in its worker
                ray.cancel(submitted.ref)
            ray.kill(sentinel)
        for metrics in reports[seen:]:
            tune.report(metrics)
        if not reports and isinstance(value, dict):
            tune.report(value)
        # Nothing is returned: Tune would report a returned dict once more.

    run_trial.__name__ = getattr(fn, "__name__", "salus_trial")
    return run_trial


__all__ = ["trainable"]
