"""What a training function sees while it runs as a trial in a Salus GPU worker.

The function keeps Ray Tune's shape, ``fn(config)``; it reaches its Salus job through
:func:`trial` (or the shortcuts :func:`job`, :func:`report`, :func:`device`)::

    def train(config):
        with salus.ray.build_model():          # weights: the job's persistent memory, seeded
            model = make_model(config)
        for step in range(config["steps"]):
            with salus.ray.job().iteration():  # waits for the trial's turn on the GPU
                loss = step_fn(model)
            salus.ray.report(step=step, loss=loss.item())
        return {"loss": loss.item()}
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Optional, TypeVar

from ..errors import InvalidArgument

if TYPE_CHECKING:
    from .._runtime import Job

T = TypeVar("T")


@dataclass
class TrialContext:
    """One running trial: its Salus job, seed and reports. Made by the worker, one per trial."""

    trial_id: str
    name: str
    seed: int
    worker: int  # the GPU worker's index in its cluster
    job: "Job"
    backend: str  # "sim" or "cuda"
    _build_lock: threading.Lock = field(repr=False)
    reports: list[dict[str, Any]] = field(default_factory=list)
    _reports_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def report(self, **metrics: Any) -> None:
        """Records one set of metrics (the last one is the trial's latest; all are kept)."""
        with self._reports_lock:
            self.reports.append(dict(metrics))

    def reports_since(self, start: int) -> list[dict[str, Any]]:
        with self._reports_lock:
            return [dict(r) for r in self.reports[start:]]

    @property
    def device(self) -> Any:
        """The torch device the trial's tensors go on: cuda:0 on a GPU (a worker sees only its
        own), the CPU on the simulated backend (Salus makes CPU tensors simulated GPU memory)."""
        import torch

        return torch.device("cuda", 0) if self.backend == "cuda" else torch.device("cpu")

    def iterations(self, batches: Iterable[T]) -> Iterator[T]:
        """``for batch in ctx.iterations(loader):``: each pass of the loop body is one
        iteration of the job (its turn on the GPU), for loops that cannot be re-indented under
        ``with job.iteration():``. Frameworks with step callbacks call ``job.begin_iteration()``
        and ``job.end_iteration()`` from them instead."""
        for batch in batches:
            with self.job.iteration():
                yield batch

    @contextmanager
    def build_model(self) -> Iterator["Job"]:
        """``with build_model():`` builds the model as the trial's first iteration: it waits until
        the scheduler admits the job and gives it its turn (weights made before that would hold
        memory no policy gave them, squeezing the trials already running), and what survives the
        block (weights, optimizer state) becomes the job's persistent memory. torch's global
        generator is seeded with the trial's seed first; trials of one worker build one at a
        time, since torch has one global generator per process, so the same seed gives the same
        weights whatever else runs beside the trial."""
        with self._build_lock:
            import torch

            torch.manual_seed(self.seed)
            with self.job.iteration():
                yield self.job

_current = threading.local()


def _enter(ctx: TrialContext) -> None:
    _current.ctx = ctx


def _leave() -> None:
    _current.ctx = None


def trial() -> TrialContext:
    """The trial the calling thread runs; InvalidArgument outside a salus.ray trial."""
    ctx: Optional[TrialContext] = getattr(_current, "ctx", None)
    if ctx is None:
        raise InvalidArgument("not inside a salus.ray trial: run the function with "
                              "SalusCluster.submit (it runs in a GPU worker's thread)")
    return ctx


def job() -> "Job":
    """The calling trial's Salus job: ``with salus.ray.job().iteration():`` marks an iteration."""
    return trial().job


def report(**metrics: Any) -> None:
    """Records metrics for the calling trial (readable with Trial.reports() while it runs)."""
    trial().report(**metrics)


def device() -> Any:
    return trial().device


def build_model() -> Any:
    """See TrialContext.build_model."""
    return trial().build_model()
