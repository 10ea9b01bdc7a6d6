"""What a run of one variant produced, the same shape whatever ran it (the discrete-event
simulator, the real mechanism on simulated GPUs, or PyTorch jobs), so that metrics, reports and
plots need no mode of their own. Times are in simulated seconds, sizes in bytes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from .experiment import Variant


@dataclass
class JobResult:
    name: str
    workload: str
    kind: str
    device: int
    arrival: float
    first_start: float
    finish: float
    attained: float  # GPU time received (slowed down by contention)
    work: float  # GPU time it needed alone
    waiting: float
    max_wait: float
    iterations: int
    latencies: list[float] = field(default_factory=list)  # inference: end - asked per request
    error: str = ""  # why it failed (run and torch modes: the runtime refused it memory)

    @property
    def jct(self) -> float:
        return self.finish - self.arrival


@dataclass
class DeviceResult:
    device: int
    busy: float  # seconds with anything running
    utilization: float  # integral of the device's utilization, seconds
    work: float
    peak_memory: int  # bytes
    peak_committed: Optional[int] = None
    over_budget: Optional[float] = None  # seconds (simulate only)
    jobs: int = 0


@dataclass
class Timeline:
    device: int
    time: list[float]
    utilization: list[float]
    running: list[float]
    memory: list[float]
    waiting: list[float]


@dataclass
class VariantResult:
    variant: Variant
    makespan: float
    throughput: float  # iterations per second
    jobs: list[JobResult]
    devices: list[DeviceResult]
    timelines: list[Timeline] = field(default_factory=list)
    trace: Optional[str] = None  # Perfetto trace file name, in the output folder
    extra: dict[str, float] = field(default_factory=dict)  # mode-specific measurements


def trace_name(variant: Variant) -> str:
    """The Perfetto trace file of a variant's run."""
    return "trace-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", variant.label) + ".json"
