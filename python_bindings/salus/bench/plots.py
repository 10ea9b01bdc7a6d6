"""PNG plots of a run (matplotlib, Agg backend: no display needed).

- ``jct_cdf.png``: completion-time distribution per variant;
- ``timeline.png``: GPU utilization and memory over time (averaged over the GPUs of a variant),
  from the simulator's timelines or the samples taken during a run;
- ``bars.png``: makespan and GPU utilization per variant;
- ``latency_cdf.png``: request latency per variant, where there are inference jobs;
- ``sweep.png``: average JCT and utilization against the number of GPUs, where there is a sweep.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .metrics import Metrics
from .results import Timeline, VariantResult

GiB = float(1 << 30)
SMOOTHING = 30  # a timeline is averaged over 1/SMOOTHING of the run


def write_plots(folder: Path, results: list[VariantResult], metrics: dict[str, Metrics],
                title: str) -> list[str]:
    """Writes the plots; returns their file names (none where matplotlib is not installed)."""
    try:
        import matplotlib
    except ImportError:
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, draw in (("jct_cdf.png", _jct_cdf), ("timeline.png", _timeline),
                       ("bars.png", _bars), ("latency_cdf.png", _latency_cdf),
                       ("sweep.png", _sweep)):
        fig = draw(plt, results, metrics, title)
        if fig is None:
            continue
        fig.savefig(folder / name, dpi=110, bbox_inches="tight", metadata={"Software": None})
        plt.close(fig)
        written.append(name)
    return written


def _cdf(ax: Any, values: list[float], label: str) -> None:
    ordered = sorted(values)
    n = len(ordered)
    ax.step(ordered, [(i + 1) / n for i in range(n)], where="post", label=label)


def _jct_cdf(plt: Any, results: list[VariantResult], metrics: dict[str, Metrics],
             title: str) -> Any:
    if not any(j.kind == "training" for r in results for j in r.jobs):
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        jobs = [j for j in r.jobs if j.kind == "training" and not j.error]
        if jobs:
            _cdf(ax, [j.jct for j in jobs], r.variant.label)
    ax.set_xlabel("job completion time (s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"{title}: JCT distribution")
    if ax.get_xlim()[1] > 20 * max(ax.get_xlim()[0], 1e-9):
        ax.set_xscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _smooth(values: list[float], window: int) -> list[float]:
    """Moving average over ``window`` samples (centred), so that trends show through."""
    if window <= 1:
        return values
    out = []
    total = 0.0
    prefix = [0.0]
    for v in values:
        total += v
        prefix.append(total)
    half = window // 2
    for i in range(len(values)):
        lo, hi = max(0, i - half), min(len(values), i + half + 1)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def _mean_timeline(timelines: list[Timeline]) -> tuple[list[float], list[float], list[float]]:
    """Time, mean utilization and mean memory (GiB) over the GPUs that share a time grid,
    smoothed over about 1/SMOOTHING of the run when there are many samples."""
    first = timelines[0]
    same = [t for t in timelines if len(t.time) == len(first.time)]
    n = len(same)
    util = [sum(t.utilization[i] for t in same) / n for i in range(len(first.time))]
    memory = [sum(t.memory[i] for t in same) / n / GiB for i in range(len(first.time))]
    window = len(first.time) // SMOOTHING
    return list(first.time), _smooth(util, window), _smooth(memory, window)


def _timeline(plt: Any, results: list[VariantResult], metrics: dict[str, Metrics],
              title: str) -> Any:
    shown = [r for r in results if r.timelines and not r.variant.dedicated]
    if not shown:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for r in shown:
        time, util, memory = _mean_timeline(r.timelines)
        gpus = len(r.timelines)
        label = r.variant.label + (f" (mean of {gpus} GPUs)" if gpus > 1 else "")
        top.plot(time, [u * 100 for u in util], label=label, linewidth=1)
        bottom.plot(time, memory, label=label, linewidth=1)
    top.set_ylabel("GPU utilization (%)")
    top.set_ylim(0, 105)
    bottom.set_ylabel("memory in use (GiB)")
    bottom.set_xlabel("time (s)")
    smoothed = max(len(r.timelines[0].time) for r in shown) >= 2 * SMOOTHING
    note = f" (moving average, {100 / SMOOTHING:.0f}% of the run)" if smoothed else ""
    top.set_title(f"{title}: utilization and memory over time{note}")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=8)
    return fig


def _bars(plt: Any, results: list[VariantResult], metrics: dict[str, Metrics],
          title: str) -> Any:
    labels = [r.variant.label for r in results]
    makespan = [metrics[x].get("makespan") or 0.0 for x in labels]
    util = [(metrics[x].get("utilization") or 0.0) * 100 for x in labels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(8, 1.2 * len(labels) + 4), 4))
    left.bar(labels, makespan, color="tab:blue")
    left.set_ylabel("makespan (s)")
    right.bar(labels, util, color="tab:green")
    right.set_ylabel("GPU utilization (%)")
    right.set_ylim(0, 105)
    for ax in (left, right):
        ax.tick_params(axis="x", rotation=45, labelsize=8)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title}: makespan and utilization")
    fig.tight_layout()
    return fig


def _latency_cdf(plt: Any, results: list[VariantResult], metrics: dict[str, Metrics],
                 title: str) -> Any:
    shown = [r for r in results if any(j.latencies for j in r.jobs)]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in shown:
        _cdf(ax, [x * 1000 for j in r.jobs for x in j.latencies], r.variant.label)
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_xscale("log")
    ax.set_title(f"{title}: request latency")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _sweep(plt: Any, results: list[VariantResult], metrics: dict[str, Metrics],
           title: str) -> Any:
    rows = sorted((r for r in results if r.variant.group == "sweep"),
                  key=lambda r: r.variant.gpus)
    if len(rows) < 2:
        return None
    gpus = [r.variant.gpus for r in rows]
    fig, left = plt.subplots(figsize=(7, 4.5))
    left.plot(gpus, [metrics[r.variant.label].get("avg_jct") or 0.0 for r in rows],
              marker="o", color="tab:blue")
    left.set_xlabel("GPUs")
    left.set_ylabel("average JCT (s)", color="tab:blue")
    left.set_yscale("log")
    right = left.twinx()
    right.plot(gpus, [(metrics[r.variant.label].get("utilization") or 0.0) * 100 for r in rows],
               marker="s", color="tab:green")
    right.set_ylabel("GPU utilization (%)", color="tab:green")
    right.set_ylim(0, 105)
    left.set_xticks(gpus)
    left.grid(alpha=0.3)
    left.set_title(f"{title}: how many GPUs ({rows[0].variant.policy}, "
                   f"{rows[0].variant.placement})")
    return fig
