"""Scheduling policies written in Python, registered by name.

A policy orders the jobs waiting for a lane: Salus serves them in increasing ``key(job)`` order
(ties by arrival). Subclass :class:`Policy`, then ``register_policy("name", MyPolicy)`` and pass
``policy="name"`` to :class:`salus.Runtime`. Runtimes made afterwards know the name; each device
makes its own instance by calling the factory.

``key`` runs on the thread of a job that starts waiting, with the scheduler's lock held: keep it
short, and do not call Salus from it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Union

from .errors import InvalidArgument

SortKey = Union[float, tuple[float, float]]


@dataclass(frozen=True)
class JobView:
    """What a policy may know about one job."""

    id: int
    kind: str  # "training" or "inference"
    priority: int
    arrival: int
    iterations_done: int
    expected_iterations: int
    iteration_seconds: float
    attained_seconds: float
    persistent_bytes: int
    ephemeral_peak_bytes: int
    remaining_seconds: float

    @property
    def latency_critical(self) -> bool:
        return self.kind == "inference"


class Policy:
    """Base for policies written in Python."""

    name: str = "python"
    lanes: str = "single"  # "single": jobs take turns; "packed": as many lanes as memory allows
    runs_to_completion: bool = False

    def key(self, job: JobView) -> SortKey:
        raise NotImplementedError


PolicyFactory = Callable[[], Policy]

_lock = threading.Lock()
_registry: dict[str, PolicyFactory] = {}
BUILTIN_POLICIES = ("fifo", "srtf", "fair", "pack", "priority", "memory_aware")


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Registers ``factory`` (a Policy subclass or a function returning a Policy) under ``name``."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"a policy name must be a non-empty string, not {name!r}")
    if not callable(factory):
        raise TypeError(f"policy factory for {name!r} must be callable, "
                        f"not {type(factory).__name__}")
    with _lock:
        if name in BUILTIN_POLICIES or name in _registry:
            raise InvalidArgument(f"policy name {name!r} is taken")
        _registry[name] = factory


def unregister_policy(name: str) -> None:
    with _lock:
        if _registry.pop(name, None) is None:
            raise InvalidArgument(f"no policy {name!r} was registered from Python")


def registered_policies() -> dict[str, PolicyFactory]:
    with _lock:
        return dict(_registry)
