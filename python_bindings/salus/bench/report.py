"""The files a run leaves: ``jobs.csv`` (one row per job per variant), ``summary.json`` and
``summary.md`` (every variant side by side, the paper's number beside ours).

``jobs.csv`` and ``summary.json`` hold only what the run computed from its inputs, so the same
seed writes the same bytes; wall-clock times go to ``summary.md`` and the console.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .experiment import Experiment, Variant
from .metrics import Metrics, percentile, ratios, variant_metrics
from .results import VariantResult

JOB_COLUMNS = ("variant", "policy", "placement", "gpus", "name", "workload", "kind", "device",
               "arrival", "first_start", "finish", "jct", "attained", "work", "waiting",
               "max_wait", "iterations", "requests", "latency_p50", "latency_p99", "error")


@dataclass
class Summary:
    """What summary.json holds, and what summary.md and the plots show."""

    experiment: Experiment
    mode: str
    seed: int
    results: list[VariantResult]
    assumptions: list[str]
    notes: list[str] = field(default_factory=list)
    baseline: Optional[Variant] = None
    metrics: dict[str, Metrics] = field(default_factory=dict)
    vs_baseline: dict[str, Metrics] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for r in self.results:
            self.metrics[r.variant.label] = variant_metrics(r)
            over = self.metrics[r.variant.label].get("over_budget_seconds")
            if over:
                peak = self.metrics[r.variant.label].get("peak_memory_gib") or 0.0
                self.notes.append(
                    f"{r.variant.label}: the jobs' combined memory was over the GPU's budget for "
                    f"{over:.3g} s (peak {peak:.2f} GiB of "
                    f"{self.experiment.gpu_memory / (1 << 30):g} GiB): the scheduler's prediction "
                    "of the running iterations' memory missed there; the real mechanism "
                    "would wait for memory or fail")
            failed = [j for j in r.jobs if j.error]
            if failed:
                self.notes.append(f"{r.variant.label}: {len(failed)} job(s) failed and are left "
                                  f"out of the completion times; the first: {failed[0].name}: "
                                  f"{failed[0].error}")
        if self.baseline is not None and self.baseline.label in self.metrics:
            base = self.metrics[self.baseline.label]
            for label, m in self.metrics.items():
                if label != self.baseline.label:
                    self.vs_baseline[label] = ratios(m, base)

    def paper_comparison(self) -> Optional[dict[str, Any]]:
        paper = self.experiment.paper
        if paper is None:
            return None
        variant = paper.variant
        ours = None
        if variant is not None:
            ours = self.vs_baseline.get(variant, {}).get(paper.metric)
            if ours is None:
                ours = self.metrics.get(variant, {}).get(paper.metric)
        return {"name": paper.name, "value": paper.value, "metric": paper.metric,
                "variant": variant, "source": paper.source, "note": paper.note, "ours": ours}

    def gpus_needed(self) -> Optional[dict[str, Any]]:
        """The sweep's answer to "how many GPUs does this workload need": the fewest GPUs whose
        average JCT is within ``target_jct_ratio`` of the largest cluster's."""
        sweep = self.experiment.section("sweep")
        rows: list[tuple[int, float]] = []
        for r in self.results:
            jct = self.metrics[r.variant.label].get("avg_jct")
            if r.variant.group == "sweep" and jct is not None:
                rows.append((r.variant.gpus, jct))
        rows.sort()
        if not rows:
            return None
        target = float(sweep.get("target_jct_ratio", 1.25))
        best = rows[-1][1]
        enough = next(g for g, j in rows if j <= target * best)
        return {"gpus": enough, "target_jct_ratio": target, "largest_gpus": rows[-1][0],
                "largest_avg_jct": best}

    def to_json(self) -> dict[str, Any]:
        exp = self.experiment
        return {
            "experiment": exp.name,
            "description": exp.description,
            "mode": self.mode,
            "scale": exp.scale,
            "seed": self.seed,
            "file": exp.path.name,
            "contention": exp.contention,
            "gpu_memory_bytes": exp.gpu_memory,
            "baseline": self.baseline.label if self.baseline else None,
            "assumptions": self.assumptions,
            "notes": self.notes,
            "paper": self.paper_comparison(),
            "gpus_needed": self.gpus_needed(),
            "variants": [{
                "label": r.variant.label, "policy": r.variant.policy,
                "placement": r.variant.placement, "machines": r.variant.machines,
                "gpus_per_machine": r.variant.gpus_per_machine, "group": r.variant.group,
                "spill": r.variant.spill, "trace": r.trace,
                "metrics": self.metrics[r.variant.label],
                "vs_baseline": self.vs_baseline.get(r.variant.label),
            } for r in self.results],
        }


def write_jobs_csv(path: Path, results: list[VariantResult]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(JOB_COLUMNS)
        for r in results:
            v = r.variant
            for j in r.jobs:
                lat = j.latencies
                writer.writerow([
                    v.label, v.policy, v.placement, v.gpus, j.name, j.workload, j.kind, j.device,
                    _f(j.arrival), _f(j.first_start), _f(j.finish), _f(j.jct), _f(j.attained),
                    _f(j.work), _f(j.waiting), _f(j.max_wait), j.iterations,
                    len(lat) if lat else "", _f(percentile(lat, 50)), _f(percentile(lat, 99)),
                    j.error])


def write_summary_json(path: Path, summary: Summary) -> None:
    path.write_text(json.dumps(summary.to_json(), indent=2, sort_keys=False) + "\n",
                    encoding="utf-8")


def _f(value: Optional[float]) -> str:
    """Six decimals; empty for no value (a job that failed before it started has no start)."""
    return "" if value is None or value != value else f"{value:.6f}"


# --- Markdown -----------------------------------------------------------------------------------

Column = tuple[str, str, Callable[[Optional[float]], str]]


def _seconds(x: Optional[float]) -> str:
    if x is None:
        return "–"
    if abs(x) >= 3600:
        return f"{x / 3600:.2f} h"
    return f"{x:.3g} s" if abs(x) < 100 else f"{x:.0f} s"


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{x * 100:.1f}%"


def _times(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}x"


def _num(x: Optional[float]) -> str:
    return "–" if x is None else (f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}")


def _ms(x: Optional[float]) -> str:
    return "–" if x is None else f"{x * 1000:.3g} ms"


def _gib(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}"


MAIN_COLUMNS: list[Column] = [
    ("gpus", "GPUs", _num), ("jobs", "jobs", _num), ("failed_jobs", "failed", _num),
    ("avg_jct", "avg JCT", _seconds),
    ("median_jct", "median JCT", _seconds), ("p95_jct", "p95 JCT", _seconds),
    ("makespan", "makespan", _seconds), ("mean_gpu_makespan", "mean GPU makespan", _seconds),
    ("utilization", "GPU utilization", _pct),
    ("busy", "GPU busy", _pct), ("throughput", "iterations/s", _num),
    ("peak_memory_gib", "peak memory GiB", _gib), ("over_budget_seconds", "over budget", _seconds),
]
LATENCY_COLUMNS: list[Column] = [
    ("requests", "requests", _num), ("latency_p50", "latency p50", _ms),
    ("latency_p95", "latency p95", _ms), ("latency_p99", "latency p99", _ms),
]
RATIO_COLUMNS: list[Column] = [
    ("avg_jct_speedup", "avg JCT speedup", _times), ("p95_jct_speedup", "p95 JCT speedup", _times),
    ("makespan_speedup", "makespan speedup", _times),
    ("gpu_makespan_speedup", "GPU makespan speedup", _times),
    ("utilization_gain", "utilization gain", _times),
    ("throughput_gain", "throughput gain", _times), ("gpu_saving", "GPUs saved", _times),
    ("p99_latency_ratio", "p99 latency ratio", _times),
]


def write_summary_md(path: Path, summary: Summary, *, wall_seconds: float,
                     plots: list[str]) -> None:
    exp = summary.experiment
    paper = summary.paper_comparison()
    out = [f"# {exp.name} ({summary.mode}, {exp.scale} scale, seed {summary.seed})", "",
           exp.description, ""]
    r0 = summary.results[0] if summary.results else None
    if r0 is not None:
        out += [f"Jobs: {len(r0.jobs)}. GPU memory: {exp.gpu_memory / (1 << 30):g} GiB each. "
                f"Contention model: {exp.contention}. "
                f"Baseline: {summary.baseline.label if summary.baseline else 'none'}.", ""]
    groups = [("Variants", [r for r in summary.results if r.variant.group != "sweep"]),
              ("GPU count sweep", [r for r in summary.results if r.variant.group == "sweep"])]
    for title, rows in groups:
        if not rows:
            continue
        out += [f"## {title}", ""]
        out += _table(summary, rows, MAIN_COLUMNS, paper, ratio=False)
        if any(summary.metrics[r.variant.label].get("requests") for r in rows):
            out += ["", "Request latency (a request's end minus when it was asked for):", ""]
            out += _table(summary, rows, LATENCY_COLUMNS, paper, ratio=False)
        needed = summary.gpus_needed() if title == "GPU count sweep" else None
        if needed is not None:
            out += ["", f"GPUs this workload needs: **{needed['gpus']}** (the fewest whose "
                    f"average JCT is within {needed['target_jct_ratio']:g}x of "
                    f"{needed['largest_gpus']} GPUs')."]
        ratio_rows = [r for r in rows if r.variant.label in summary.vs_baseline]
        if ratio_rows and summary.baseline is not None:
            out += ["", f"Against {summary.baseline.label} (> 1: better):", ""]
            out += _table(summary, ratio_rows, RATIO_COLUMNS, paper, ratio=True)
        out.append("")
    if paper is not None:
        ours = paper["ours"]
        shown = "not measured in this run" if ours is None else f"{ours:.2f}"
        out += ["## The paper's number", "",
                f"- {paper['name']}: **{paper['value']:g}** ({paper['metric']}"
                f"{', ' + paper['variant'] if paper['variant'] else ''}); ours: **{shown}**.",
                f"- Source: {paper['source']}."]
        if paper["note"]:
            out.append(f"- {paper['note']}")
        out.append("")
    if summary.assumptions:
        out += ["## Assumptions", ""] + [f"- {a}" for a in summary.assumptions] + [""]
    if summary.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in summary.notes] + [""]
    traces = [r.trace for r in summary.results if r.trace]
    files = ["jobs.csv", "summary.json", *plots, *traces]
    out += ["## Files", "", ", ".join(f"`{f}`" for f in files), "",
            f"Wall time: {wall_seconds:.1f} s.", ""]
    path.write_text("\n".join(out), encoding="utf-8")


def _table(summary: Summary, rows: list[VariantResult], columns: list[Column],
           paper: Optional[dict[str, Any]], *, ratio: bool) -> list[str]:
    source = summary.vs_baseline if ratio else summary.metrics

    def shown(key: str) -> bool:
        values = [source.get(r.variant.label, {}).get(key) for r in rows]
        present = [v for v in values if v is not None]
        if paper is not None and paper["metric"] == key and present:
            return True
        # A ratio that is 1 everywhere (GPUs saved on one GPU) says nothing.
        return bool(present) and not (ratio and all(v == 1.0 for v in present))

    used = [c for c in columns if shown(c[0])]
    # The policy and placement columns only where the label does not already say them.
    detail = any(r.variant.label != r.variant.policy for r in rows)
    head = ["variant"] + (["policy", "placement"] if detail else []) + [c[1] for c in used]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        values = source.get(r.variant.label, {})
        cells = [r.variant.label] + ([r.variant.policy, r.variant.placement] if detail else [])
        for key, _, fmt in used:
            cell = fmt(values.get(key))
            if (paper is not None and paper["variant"] == r.variant.label
                    and paper["metric"] == key):
                cell += f" (paper: {fmt(paper['value'])})"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return lines
