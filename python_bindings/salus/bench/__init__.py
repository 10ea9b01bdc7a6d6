"""salus-bench: GPU-sharing experiments, from the discrete-event simulator to real PyTorch jobs.

``salus-bench simulate|run|torch|ray EXPERIMENT`` runs an experiment (a TOML file in
``benchmarks/experiments/``, or any path) and writes per-job CSV, a JSON and Markdown summary,
PNG plots and, for the real mechanism, Perfetto traces. From Python::

    from salus.bench import run
    outcome = run("jct", "simulate", scale="small", seed=3)
    print(outcome.summary.metrics["srtf"]["avg_jct"])

Bad input raises :class:`InputError` (fields ``path``, ``line``, ``field``, ``reason``); an
experiment that a mode cannot run raises :class:`ModeNotSupported` (``experiment``, ``mode``,
``reason``).
"""

from __future__ import annotations

from .errors import InputError, ModeNotSupported
from .runner import Outcome, run

__all__ = ["InputError", "ModeNotSupported", "Outcome", "run"]
