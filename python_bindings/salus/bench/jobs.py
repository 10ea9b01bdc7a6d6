"""Jobs from workloads: the seeded generators behind every experiment.

Every random choice (which workload, when it arrives, how busy an inference model is) comes from
one ``random.Random(seed)``, so a seed gives the same jobs on every machine and Python version.
The generators also say, in words, what they assumed; those sentences go into every summary.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from .experiment import Experiment
from .workloads import Workload, load_workloads, select

GiB = 1 << 30


@dataclass(frozen=True)
class JobSpec:
    """One job as the simulator and the runners see it (times in seconds, sizes in bytes)."""

    name: str
    workload: str
    kind: str
    priority: int
    arrival: float
    iterations: int
    iteration_seconds: float
    persistent_bytes: int
    ephemeral_peak_bytes: int
    forward_fraction: float
    think_seconds: float
    occupancy: float
    device: int = -1

    @property
    def work_seconds(self) -> float:
        """GPU time it needs alone."""
        return self.iterations * self.iteration_seconds

    @property
    def peak_bytes(self) -> int:
        return self.persistent_bytes + self.ephemeral_peak_bytes

    def native(self) -> dict[str, Any]:
        """The dict salus._salus.simulate takes."""
        out = asdict(self)
        del out["workload"]
        return out


@dataclass
class JobSet:
    jobs: list[JobSpec]
    assumptions: list[str] = field(default_factory=list)

    @property
    def devices_needed(self) -> int:
        """GPUs the pinned jobs name (pairs are pinned one pair per GPU)."""
        return max((j.device for j in self.jobs), default=-1) + 1


def make_jobs(exp: Experiment, seed: int) -> JobSet:
    """The experiment's jobs for ``seed``."""
    jobs_cfg = exp.section("jobs")
    workload_cfg = exp.section("workload")
    generator = jobs_cfg.get("generator", "sample")
    rows = load_workloads(exp.workload_csv, trace=generator == "trace")
    include = workload_cfg.get("include", ["*"])
    chosen, unmatched = select(rows, include, workload_cfg.get("exclude", []))
    if unmatched is not None:
        raise exp.error(("workload", "include"), f"unknown workload {unmatched!r}: no row of "
                        f"{exp.workload_csv.name} matches it")
    if not chosen:
        raise exp.error(("workload", "exclude"), "excludes every workload included")
    rng = random.Random(seed)
    maker = _Maker(exp, rng)
    if generator == "sample":
        jobs = maker.sample(chosen)
    elif generator == "pairs":
        jobs = maker.pairs(chosen)
    else:
        jobs = maker.trace(chosen)
    return JobSet(jobs, maker.assumptions(jobs))


class _Maker:
    def __init__(self, exp: Experiment, rng: random.Random) -> None:
        self.exp = exp
        self.rng = rng
        self.jobs_cfg = exp.section("jobs")
        workload_cfg = exp.section("workload")
        self.persistent_fraction = float(workload_cfg.get("persistent_fraction", 0.3))
        self.forward_fraction = float(workload_cfg.get("forward_fraction", 0.6))
        self.occupancy = exp.occupancy
        self.max_steps = int(self.jobs_cfg.get("max_steps", 0))
        self.duration_scale = float(self.jobs_cfg.get("duration_scale", 1.0))
        self.coarsened = 0
        self.kind = str(self.jobs_cfg.get("kind", "training"))

    # --- generators ---
    def sample(self, chosen: list[Workload]) -> list[JobSpec]:
        count = int(self.jobs_cfg["count"])
        arrival = self.jobs_cfg.get("arrival", "at_once")
        mean_gap = float(self.jobs_cfg.get("mean_interarrival_seconds", 0.0))
        now = 0.0
        jobs = []
        for i in range(count):
            workload = self.rng.choice(chosen)
            if arrival == "poisson" and i > 0:
                now += self.rng.expovariate(1.0 / mean_gap)
            jobs.append(self.job(f"j{i:05d}-{workload.name}", workload, now))
        return jobs

    def trace(self, chosen: list[Workload]) -> list[JobSpec]:
        rows = sorted(chosen, key=lambda w: (w.arrival_seconds or 0.0, w.line))
        rows = rows[: int(self.jobs_cfg["count"])]
        return [self.job(f"j{i:05d}-{w.name}", w, float(w.arrival_seconds or 0.0))
                for i, w in enumerate(rows)]

    def pairs(self, chosen: list[Workload]) -> list[JobSpec]:
        """Pairs whose peaks do not fit the GPU together but fit when their iterations are
        offset in time: persistent memory, the larger ephemeral peak and ``overlap`` of the
        smaller one (what is left of it when the other peaks) fit. That is the case
        memory-aware co-scheduling (Zico) is for."""
        pairs_cfg = self.jobs_cfg["pairs"]
        budget = self.exp.gpu_memory
        overlap = float(pairs_cfg.get("overlap", 0.5))
        fitting = []
        for a, b in itertools.combinations(chosen, 2):
            pa, ea = self.split(a)
            pb, eb = self.split(b)
            shifted = pa + pb + max(ea, eb) + overlap * min(ea, eb)
            if pa + ea + pb + eb > budget >= shifted:
                fitting.append((a, b))
        count = int(pairs_cfg["count"])
        if len(fitting) < count:
            raise self.exp.error(("jobs", "pairs", "count"), f"only {len(fitting)} pairs of the "
                                 f"workloads chosen have peaks that do not fit together in "
                                 f"{budget / GiB:g} GiB while offset iterations do")
        stagger = float(pairs_cfg.get("stagger_seconds", 0.0))
        jobs = []
        for device, (a, b) in enumerate(self.rng.sample(fitting, count)):
            jobs.append(self.job(f"p{device:03d}a-{a.name}", a, 0.0, device=device))
            jobs.append(self.job(f"p{device:03d}b-{b.name}", b, stagger, device=device))
        return jobs

    # --- one job ---
    def split(self, w: Workload) -> tuple[int, int]:
        persistent = int(round(w.peak_bytes * self.persistent_fraction))
        return persistent, w.peak_bytes - persistent

    def job(self, name: str, w: Workload, arrival: float, *, device: int = -1) -> JobSpec:
        kind = w.kind or self.kind
        occupancy = self.occupancy_of(w)
        forward = w.forward_fraction or self.forward_fraction
        if kind == "inference":
            return self.inference(name, w, arrival, occupancy, forward, device)
        iterations = max(1, round(w.iterations * self.duration_scale))
        seconds = w.iteration_seconds
        if self.max_steps and iterations > self.max_steps:
            seconds = seconds * iterations / self.max_steps
            iterations = self.max_steps
            self.coarsened += 1
        persistent, ephemeral = self.split(w)
        return JobSpec(name, w.name, "training", int(self.jobs_cfg.get("priority", 0)), arrival,
                       iterations, seconds, persistent, ephemeral, forward,
                       float(self.jobs_cfg.get("think_seconds", 0.0)), occupancy, device)

    def inference(self, name: str, w: Workload, arrival: float, occupancy: float,
                  forward: float, device: int) -> JobSpec:
        """A model serving requests for ``duration_seconds``, busy ``duty`` of the time."""
        cfg = self.jobs_cfg["inference"]
        request = w.iteration_seconds * float(cfg["request_fraction"])
        duty = self.rng.uniform(float(cfg["duty_min"]), float(cfg["duty_max"]))
        think = request * (1.0 / duty - 1.0)
        start = arrival + self.rng.uniform(0.0, request + think)  # models do not start in step
        requests = max(1, round(float(cfg["duration_seconds"]) / (request + think)))
        persistent = int(round(w.peak_bytes * float(cfg.get("persistent_fraction", 0.1))))
        ephemeral = int(round(w.peak_bytes * float(cfg.get("ephemeral_fraction", 0.1))))
        return JobSpec(name, w.name, "inference", int(cfg.get("priority", 0)), start,
                       requests, request, persistent, ephemeral, forward, think, occupancy,
                       device)

    def occupancy_of(self, w: Workload) -> float:
        if w.occupancy is not None:
            return w.occupancy
        rule = self.occupancy
        for key in (w.name, w.model):
            if key in rule.by_model:
                return rule.by_model[key]
        if w.batch is not None and w.batch in rule.by_batch:
            return rule.by_batch[w.batch]
        return rule.default

    # --- what was assumed ---
    def arrivals(self, jobs: list[JobSpec]) -> str:
        """How the jobs arrive, and how much work that offers the cluster."""
        generator = self.jobs_cfg.get("generator", "sample")
        if generator == "pairs":
            overlap = float(self.jobs_cfg["pairs"].get("overlap", 0.5))
            return ("pairs: drawn from the pairs of workloads whose peaks together exceed the "
                    "GPU while persistent memory + the larger ephemeral peak + "
                    f"{overlap:.0%} of the smaller one fit; each pair is pinned to a GPU of its "
                    "own and both jobs arrive at once")
        if generator == "trace":
            return "arrivals: the arrival_seconds column of the workload file"
        if self.kind == "inference":
            return "models start at random offsets within their first request period"
        if self.jobs_cfg.get("arrival", "at_once") == "at_once":
            return "arrivals: every job is submitted at time 0"
        cluster = self.exp.section("cluster")
        gpus = int(cluster.get("machines", 1)) * int(cluster.get("gpus_per_machine", 1))
        span = max(j.arrival for j in jobs)
        gap = float(self.jobs_cfg["mean_interarrival_seconds"])
        text = f"arrivals: a Poisson process with a mean gap of {gap:g} s"
        if span > 0:
            load = sum(j.work_seconds for j in jobs) / (span * gpus)
            text += (f"; the jobs' work alone is {load:.2f}x what {gpus} GPU(s) can do one job "
                     "at a time over the arrival period")
        return text

    def assumptions(self, jobs: list[JobSpec]) -> list[str]:
        out = [self.occupancy.describe(), self.arrivals(jobs)]
        if self.kind == "training" or self.jobs_cfg.get("generator") == "pairs":
            out.append(f"memory: persistent (weights, optimizer state) = "
                       f"{self.persistent_fraction:.0%} of the measured peak, the rest "
                       f"ephemeral, a triangle rising through forward (the first "
                       f"{self.forward_fraction:.0%} of an iteration) and falling through "
                       "backward")
        if self.kind == "inference":
            cfg = self.jobs_cfg["inference"]
            out.append(
                f"inference models are derived from the measured training workloads: a request "
                f"takes {float(cfg['request_fraction']):.0%} of a training iteration's GPU time "
                f"(forward only, small batch), holds "
                f"{float(cfg.get('persistent_fraction', 0.1)):.0%} of the training peak as "
                f"weights and {float(cfg.get('ephemeral_fraction', 0.1)):.0%} as activations; "
                f"each model keeps its GPU busy a share drawn uniformly in "
                f"[{float(cfg['duty_min']):.1%}, {float(cfg['duty_max']):.1%}] (think time "
                f"between requests) and serves for about {float(cfg['duration_seconds']):g} s")
        if self.duration_scale != 1.0:
            out.append(f"durations: each job runs {self.duration_scale:g}x its measured "
                       "iteration count")
        if self.max_steps:
            out.append(f"iterations are coarsened to at most {self.max_steps} steps per job "
                       f"(step seconds = completion time alone / steps; {self.coarsened} jobs "
                       "coarsened) so that the simulation stays fast")
        return out
