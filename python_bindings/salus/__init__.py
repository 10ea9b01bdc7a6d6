"""Salus: an in-process GPU sharing runtime.

Several jobs (training loops, trials, inference models) share each GPU at iteration granularity::

    import salus

    runtime = salus.Runtime(policy="fair")
    job = runtime.add_job("trainer")
    for batch in data:
        with job.iteration():
            step(batch)

``salus.torch.enable(runtime)`` routes PyTorch's allocations through Salus.
"""

from __future__ import annotations

from . import errors, policies
from ._logging import LOG_LEVELS, log_level, set_log_level
from ._runtime import (
    ClassBytes,
    DeviceStats,
    Iteration,
    Job,
    JobLimits,
    JobMemory,
    JobStats,
    MAX_SIM_DEVICES,
    MemoryHints,
    Runtime,
    connect,
    default_runtime,
    parse_size,
)
from ._salus import cuda_available
from .errors import (
    DeviceError,
    Error,
    InvalidArgument,
    JobCancelled,
    NotSupported,
    OutOfMemory,
    UnknownJob,
)
from .policies import JobView, Policy, register_policy, unregister_policy

__version__ = "0.1.0"

__all__ = [
    "ClassBytes", "DeviceStats", "Iteration", "Job", "JobLimits", "JobMemory", "JobStats",
    "MemoryHints", "Runtime", "connect", "default_runtime", "parse_size", "cuda_available", "errors",
    "policies", "DeviceError", "Error", "InvalidArgument", "JobCancelled", "NotSupported",
    "OutOfMemory", "UnknownJob", "JobView", "Policy", "register_policy", "unregister_policy",
    "LOG_LEVELS", "log_level", "set_log_level", "MAX_SIM_DEVICES",
]
