"""One experiment, end to end: load it, make its jobs, run every variant in the chosen mode,
write the CSV, JSON, Markdown, plots (and traces), and hand back where they are."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from .errors import InputError
from .experiment import MODES, Experiment, Variant, find_experiment, known_policies, load_experiment
from .jobs import JobSet, make_jobs
from .plots import write_plots
from .report import Summary, write_jobs_csv, write_summary_json, write_summary_md
from .results import VariantResult

DEFAULT_SEED = 1


@dataclass
class Outcome:
    """Where a run's files are, and what it found."""

    folder: Path
    summary: Summary
    wall_seconds: float
    files: list[str]


class _Progress:
    """A tqdm bar over the variants of a run (off when quiet or not on a terminal)."""

    def __init__(self, total: int, enabled: bool, title: str) -> None:
        self._bar = None
        self._started = False
        if enabled and total > 1:
            try:
                from tqdm import tqdm
            except ImportError:  # a dependency of the package, but the bar is a nicety
                return
            self._bar = tqdm(total=total, desc=title, unit="run", leave=False, file=sys.stderr)

    def __call__(self, label: str) -> None:
        if self._bar is None:
            return
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_postfix_str(label)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update(1)
            self._bar.close()


def parse_policies(text: Optional[str]) -> Optional[list[str]]:
    """``--policies a,b``: names checked here, so a typo is one clear error."""
    if text is None:
        return None
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise InputError("<command line>", None, "--policies", "no policy named")
    known = known_policies()
    for name in names:
        if name not in known:
            raise InputError("<command line>", None, "--policies",
                             f"unknown policy {name!r} (known: {', '.join(known)})")
    return list(dict.fromkeys(names))


def run(experiment: str, mode: str, *, out: Optional[Path] = None, seed: int = DEFAULT_SEED,
        scale: str = "full", policies: Optional[list[str]] = None,
        progress: bool = False, log: Callable[[str], None] = lambda _: None) -> Outcome:
    """Runs ``experiment`` (a name or a path) in ``mode``; raises InputError for bad input and
    ModeNotSupported when the experiment cannot run in that mode."""
    if mode not in MODES:
        raise InputError("<command line>", None, "mode",
                         f"unknown mode {mode!r} (known: {', '.join(MODES)})")
    started = time.monotonic()
    exp = load_experiment(find_experiment(experiment), scale)
    exp.check_mode(mode)
    variants, baseline = _variants(exp, mode, policies)
    jobset = JobSet([]) if exp.is_harvesting or exp.is_scripts else make_jobs(exp, seed)
    _preflight(exp, mode)  # after the input is checked: its mistakes come first
    folder = Path(out) if out is not None else Path("bench-results") / f"{exp.name}-{mode}"
    folder.mkdir(parents=True, exist_ok=True)
    jobs = len(exp.section("scripts")["script"]) if exp.is_scripts else len(jobset.jobs)
    log(f"{exp.name}: {jobs} jobs, {len(variants)} variants, mode {mode}, "
        f"{scale} scale, seed {seed}")
    bar = _Progress(len(variants), progress, f"{exp.name} ({mode})")
    try:
        results, notes = _run_mode(exp, mode, jobset, variants, folder, seed, bar)
    finally:
        bar.close()
    summary = Summary(exp, mode, seed, results, jobset.assumptions + exp.assumptions(),
                      notes, baseline)
    plots = write_plots(folder, results, summary.metrics, exp.name)
    if not plots:
        summary.notes.append("no plots: matplotlib is not installed")
    write_jobs_csv(folder / "jobs.csv", results)
    write_summary_json(folder / "summary.json", summary)
    wall = time.monotonic() - started
    write_summary_md(folder / "summary.md", summary, wall_seconds=wall, plots=plots)
    files = ["jobs.csv", "summary.json", "summary.md", *plots,
             *[r.trace for r in results if r.trace]]
    return Outcome(folder, summary, wall, files)


def _variants(exp: Experiment, mode: str,
              policies: Optional[list[str]]) -> tuple[list[Variant], Optional[Variant]]:
    """What is compared, and against which: ray mode has arms of its own (the first, one trial
    per GPU, is the baseline); the other modes the experiment's variants."""
    if mode == "ray":
        from .ray_mode import ray_arms

        arms = ray_arms(exp, policies)
        return arms, arms[0]
    variants = exp.variants(policies)
    return variants, exp.baseline(variants, strict=policies is None)


def _preflight(exp: Experiment, mode: str) -> None:
    """Says now, before any output, when the harvesting study cannot run (its binary) or ray
    mode has no Ray to run on."""
    if mode == "ray":
        from .ray_mode import check_ray

        check_ray(exp)
    if mode == "scripts":
        from .scripts_mode import check_scripts

        check_scripts(exp)
    if exp.is_harvesting:
        from .harvest import check_harvest

        check_harvest(exp, mode)


def _run_mode(exp: Experiment, mode: str, jobset: JobSet, variants: list[Variant],
              folder: Path, seed: int, bar: _Progress) -> tuple[list[VariantResult], list[str]]:
    """Imports each mode's module only when used: torch and Ray are heavy, the simulator is
    not."""
    if mode == "simulate":
        from .simulate import simulate_variants

        return simulate_variants(exp, jobset, variants, bar), _simulate_notes(exp)
    if mode == "scripts":
        from .scripts_mode import scripts_variants

        return scripts_variants(exp, variants, folder, bar)
    if exp.is_harvesting:
        from .harvest import run_harvest

        return run_harvest(exp, mode, folder, bar)
    if mode == "ray":
        from .ray_mode import ray_variants

        return ray_variants(exp, jobset, variants, bar)
    if mode == "run":
        from .run_mode import run_variants

        return run_variants(exp, jobset, variants, folder, bar)
    from .torch_mode import torch_variants

    return torch_variants(exp, jobset, variants, folder, seed, bar)


def _simulate_notes(exp: Experiment) -> list[str]:
    return [f"discrete-event simulation of the scheduler's decision core on a virtual clock "
            f"(contention model: {exp.contention}); deterministic for a seed"]
