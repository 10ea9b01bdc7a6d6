"""Summary numbers per variant, and each variant's ratios to the baseline.

All of them are computed from a run's per-job and per-device results, never written down: the
same code summarizes the simulator, the real mechanism and PyTorch runs.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from .results import VariantResult

GiB = float(1 << 30)
Metrics = dict[str, Optional[float]]

# Ratio name -> (metric, True when larger is better). A ratio > 1 always means "better than the
# baseline", so a table reads the same way for every column.
RATIOS = {
    "avg_jct_speedup": ("avg_jct", False),
    "p95_jct_speedup": ("p95_jct", False),
    "makespan_speedup": ("makespan", False),
    "gpu_makespan_speedup": ("mean_gpu_makespan", False),
    "utilization_gain": ("utilization", True),
    "throughput_gain": ("throughput", True),
    "gpu_saving": ("gpus", False),
    "p99_latency_ratio": ("latency_p99", False),
}


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> Optional[float]:
    return sum(values) / len(values) if values else None


def variant_metrics(result: VariantResult) -> Metrics:
    """Completion times (of training jobs: an inference model's lifetime is no completion
    time), utilization, memory and request latency (inference jobs)."""
    jobs = result.jobs
    jcts = [j.jct for j in jobs if j.kind == "training" and not j.error]
    devices = result.devices
    gpus = len(devices)
    makespan = result.makespan
    if result.variant.dedicated:
        # Each GPU's share of its own job's lifetime: "one GPU each" wastes the rest.
        shares = []
        for d in devices:
            mine = [j for j in jobs if j.device == d.device]
            window = max(j.finish for j in mine) - min(j.arrival for j in mine) if mine else 0.0
            if window > 0:
                shares.append((d.utilization / window, d.busy / window))
        utilization = mean([s[0] for s in shares])
        busy = mean([s[1] for s in shares])
    else:
        span = makespan * gpus
        utilization = sum(d.utilization for d in devices) / span if span > 0 else None
        busy = sum(d.busy for d in devices) / span if span > 0 else None
    # Per GPU, from its first arrival to its last finish: what pinned groups (pairs) take, where
    # the makespan is only the slowest GPU's.
    spans = []
    for d in devices:
        mine = [j for j in jobs if j.device == d.device]
        if mine:
            spans.append(max(j.finish for j in mine) - min(j.arrival for j in mine))
    latencies = [x for j in jobs for x in j.latencies]
    over = [d.over_budget for d in devices if d.over_budget is not None]
    out: Metrics = {
        "jobs": float(len(jobs)),
        "failed_jobs": float(sum(1 for j in jobs if j.error)) or None,
        "gpus": float(gpus),
        "avg_jct": mean(jcts),
        "median_jct": percentile(jcts, 50),
        "p95_jct": percentile(jcts, 95),
        "makespan": makespan,
        "mean_gpu_makespan": mean(spans) if gpus > 1 and not result.variant.dedicated else None,
        "throughput": result.throughput,
        "utilization": utilization,
        "busy": busy,
        "avg_wait": mean([j.waiting for j in jobs]),
        "peak_memory_gib": max((d.peak_memory for d in devices), default=0) / GiB,
        "over_budget_seconds": sum(over) if over else None,
        "requests": float(len(latencies)) if latencies else None,
        "latency_p50": percentile(latencies, 50),
        "latency_p95": percentile(latencies, 95),
        "latency_p99": percentile(latencies, 99),
    }
    out.update({k: float(v) for k, v in result.extra.items()})
    return out


def ratios(metrics: Metrics, baseline: Metrics) -> Metrics:
    """Each ratio of RATIOS where both sides have the metric (> 1: better than the baseline)."""
    out: Metrics = {}
    for name, (metric, larger_better) in RATIOS.items():
        ours, theirs = metrics.get(metric), baseline.get(metric)
        if ours is None or theirs is None or ours <= 0 or theirs <= 0:
            continue
        out[name] = ours / theirs if larger_better else theirs / ours
    return out
