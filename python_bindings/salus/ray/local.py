"""A local Ray cluster whose workers run at the driver's priority."""

from __future__ import annotations

import os
from typing import Any

import ray

# Ray starts its worker processes at niceness 15 unless told otherwise (its config key
# worker_niceness, read by the raylet from this variable when it starts). A Salus GPU worker's
# host side is on its GPU's critical path: at niceness 15 beside work at 0 it gets a few percent
# of a CPU, and its trials run tens of times slower (examples/ray_tune_sharing.py: 9 s alone,
# more than 190 s beside two busy loops; 22 s with the workers at 0).
NICENESS_VARIABLE = "RAY_worker_niceness"


def start_local(**init_kwargs: Any) -> Any:
    """``ray.init(**init_kwargs)`` for a cluster started here, its workers at the driver's
    niceness unless ``RAY_worker_niceness`` says otherwise; returns what ``ray.init`` does."""
    os.environ.setdefault(NICENESS_VARIABLE, str(os.nice(0)))
    return ray.init(**init_kwargs)
