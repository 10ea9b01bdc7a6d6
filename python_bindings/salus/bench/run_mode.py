"""``run`` mode: the experiment's jobs on the real mechanism (salus.Runtime, simulated GPUs).

Each job is a thread doing what a training loop does to Salus, with simulated kernels in place
of real ones: it allocates its persistent memory once admitted; then, per iteration, it
allocates activations layer by layer while enqueuing the forward kernels, and frees them in
reverse while enqueuing the backward kernels, waiting for its stream after each layer so that
memory rises and falls at GPU pace, as in a framework. Kernels take the job's iteration time
(scaled to real seconds) at its occupancy and are slowed by the contention model when others run.
Scheduling, memory accounting and contention are Salus's own; only time is scaled.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable

from .experiment import Experiment, Variant
from .jobs import JobSet
from .live import LiveJob, LiveRun, devices_for, scaled_for_run
from .results import VariantResult, trace_name


def run_variants(exp: Experiment, jobset: JobSet, variants: list[Variant], folder: Path,
                 progress: Callable[[str], None]) -> tuple[list[VariantResult], list[str]]:
    cfg = exp.section("run")
    time_scale = float(cfg.get("time_scale", 0.01))
    memory_scale = float(cfg.get("memory_scale", 1 / 256))
    max_steps = int(cfg.get("max_steps", 20))
    layers = int(cfg.get("layers", 4))
    specs = scaled_for_run(jobset.jobs, max_steps)
    results = []
    for variant in variants:
        progress(variant.label)
        devices, pinned = devices_for(exp, "run", variant, specs)
        live = LiveRun(exp, variant, pinned, devices, time_scale=time_scale,
                       memory_scale=memory_scale, gpu_memory=exp.gpu_memory,
                       sample_seconds=float(cfg.get("sample_seconds", 0.05)),
                       blocks_outlive_job=False)
        result = live.run(lambda run, job: _train(run, job, layers),
                          trace=folder / trace_name(variant))
        result.variant = replace(variant, machines=1, gpus_per_machine=devices)
        results.append(result)
    notes = [f"the real mechanism: salus.Runtime on {exp.contention} simulated GPUs; time "
             f"scaled by {time_scale:g} (real seconds per simulated second), memory by "
             f"{memory_scale:g}; at most {max_steps} iterations per job (training jobs "
             "coarsened to the same work in fewer steps, inference jobs answer fewer requests)",
             "host overhead (Python threads on this machine) adds to each iteration's time, "
             "more so the smaller the time scale"]
    return results, notes


def _train(run: LiveRun, job: LiveJob, layers: int) -> None:
    """One job's loop. Its weights are allocated once it is first admitted (in its first
    iteration, marked persistent), as Salus admits a job before its model is made: allocated
    at arrival, the weights of jobs still waiting would hold memory no policy gave them."""
    spec = job.spec
    handle = job.handle
    persistent = run.bytes(spec.persistent_bytes)
    block = run.bytes(spec.ephemeral_peak_bytes) // layers
    forward = run.real(spec.iteration_seconds) * spec.forward_fraction / layers
    backward = run.real(spec.iteration_seconds) * (1.0 - spec.forward_fraction) / layers
    for step in range(spec.iterations):
        with run.iteration(job):
            if step == 0 and persistent:
                handle.allocate(persistent, lifetime="persistent")  # freed when it leaves
            activations = []
            for _layer in range(layers):
                if block:
                    activations.append(handle.allocate(block))  # inside: ephemeral
                handle.sim_kernel(forward, spec.occupancy)
                run.wait_for_gpu(job)
            for _layer in range(layers):
                handle.sim_kernel(backward, spec.occupancy)
                run.wait_for_gpu(job)
                if activations:
                    handle.deallocate(activations.pop())
        run.think(job)
