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
    SettingIgnored,
    UnknownJob,
)
from .policies import JobView, Policy, register_policy, unregister_policy

__version__ = "0.1.0"


def iteration() -> Iteration:
    """``with salus.iteration():`` marks one iteration (an inference request, say) of this
    process's job under ``salus run`` or :func:`salus.torch.share`. From the first such mark on,
    the script's marks are the only ones: optimizer steps no longer mark iterations.
    InvalidArgument when the process has no such job."""
    from . import torch as salus_torch

    return salus_torch._shared_job("salus.iteration()").iteration()


__all__ = [
    "ClassBytes", "DeviceStats", "Iteration", "Job", "JobLimits", "JobMemory", "JobStats",
    "MemoryHints", "Runtime", "connect", "default_runtime", "parse_size", "cuda_available", "errors",
    "policies", "DeviceError", "Error", "InvalidArgument", "JobCancelled", "NotSupported",
    "OutOfMemory", "UnknownJob", "JobView", "Policy", "register_policy", "unregister_policy",
    "LOG_LEVELS", "log_level", "set_log_level", "MAX_SIM_DEVICES", "iteration",
    "SettingIgnored",
]

# The PyTorch glue, as salus.torch (importing it imports no torch). It installs its iteration
# hooks into the core when imported; the core never imports it.
from . import torch  # noqa: E402,F401  (after the core it depends on)
