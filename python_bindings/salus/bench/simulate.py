"""``simulate`` mode: the discrete-event simulator of the scheduler's decision core.

The simulator (``salus._salus.simulate``) runs the same policies as the real runtime on a
virtual clock, so thousands of jobs take seconds; it is deterministic, so a seed gives
byte-identical results.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Optional

from .. import _salus
from .experiment import Experiment, Variant
from .jobs import JobSet, JobSpec
from .results import DeviceResult, JobResult, Timeline, VariantResult

Progress = Callable[[str], None]


def simulate_variants(exp: Experiment, jobset: JobSet, variants: list[Variant],
                      progress: Optional[Progress] = None) -> list[VariantResult]:
    simulate = _salus.simulate
    out = []
    for variant in variants:
        if progress is not None:
            progress(variant.label)
        out.append(simulate_variant(exp, jobset, variant, simulate))
    return out


def simulate_variant(exp: Experiment, jobset: JobSet, variant: Variant,
                     simulate: Any) -> VariantResult:
    jobs = jobset.jobs
    machines, per_machine = variant.machines, variant.gpus_per_machine
    if variant.dedicated:
        # Each job alone on a GPU of its own: the "no sharing" baseline, computed by a run.
        jobs = [replace(j, device=i) for i, j in enumerate(jobs)]
        machines, per_machine = 1, len(jobs)
    elif machines == 1 and jobset.devices_needed > per_machine:
        per_machine = jobset.devices_needed  # pinned jobs (pairs): one GPU per group
    config = exp.section("simulate")
    record = bool(config.get("record_iterations",
                             any(j.kind == "inference" for j in jobs)))
    raw = simulate([j.native() for j in jobs], variant.policy, machines=machines,
                   gpus_per_machine=per_machine, device_memory=exp.gpu_memory,
                   placement=variant.placement, contention=exp.contention,
                   record_iterations=record,
                   timeline_step=float(config.get("timeline_step", 0.0)))
    effective = replace(variant, machines=machines, gpus_per_machine=per_machine)
    return _result(effective, jobs, raw)


def _result(variant: Variant, specs: list[JobSpec], raw: dict[str, Any]) -> VariantResult:
    latencies: dict[int, list[float]] = {}
    for record in raw.get("iterations") or []:
        job, _device, _lane, asked, _start, end = record
        if specs[job].kind == "inference":
            latencies.setdefault(job, []).append(end - asked)
    jobs = []
    for i, (spec, j) in enumerate(zip(specs, raw["jobs"])):
        jobs.append(JobResult(
            name=spec.name, workload=spec.workload, kind=spec.kind, device=int(j["device"]),
            arrival=float(j["arrival"]), first_start=float(j["first_start"]),
            finish=float(j["finish"]), attained=float(j["attained"]), work=float(j["work"]),
            waiting=float(j["waiting"]), max_wait=float(j["max_wait"]),
            iterations=int(j["iterations"]), latencies=latencies.get(i, [])))
    devices = [DeviceResult(device=i, busy=float(d["busy"]), utilization=float(d["utilization"]),
                            work=float(d["work"]), peak_memory=int(d["peak_combined"]),
                            peak_committed=int(d["peak_committed"]),
                            over_budget=float(d["over_budget"]), jobs=int(d["jobs"]))
               for i, d in enumerate(raw["devices"])]
    timelines = [Timeline(device=int(t["device"]), time=list(t["time"]),
                          utilization=list(t["utilization"]), running=list(t["running"]),
                          memory=list(t["memory"]), waiting=list(t["waiting"]))
                 for t in raw.get("timelines") or []]
    return VariantResult(variant, float(raw["makespan"]), float(raw["throughput"]), jobs,
                         devices, timelines)
