"""Errors of salus.ray, with fields (they travel through Ray with them: salus.errors.Error)."""

from __future__ import annotations

from ..errors import Error, InvalidArgument


class FitsNoGpu(InvalidArgument):
    """A trial needs more memory than any GPU of the cluster has, so it could never start.

    Fields: ``trial`` (its name), ``persistent`` and ``ephemeral_peak`` (bytes it needs),
    ``largest_gpu`` (bytes).
    """

    trial: str
    persistent: int
    ephemeral_peak: int
    largest_gpu: int


class ClusterClosed(Error):
    """The SalusCluster was shut down: it takes no more trials."""


__all__ = ["FitsNoGpu", "ClusterClosed"]
