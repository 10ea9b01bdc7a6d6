"""``torch`` mode: real PyTorch jobs on a simulated GPU.

Each job trains (or serves) a small real model on the CPU; ``salus.torch`` places its tensors in
the simulated GPU's memory, so Salus schedules its iterations and accounts its real memory. The
GPU time the job's workload would take is enqueued as a simulated kernel in every step, so the
experiment's timing (and the contention between jobs) is the measured workload's, while the
memory is what PyTorch really allocates. Models are given out round-robin from ``[torch] models``.
"""

from __future__ import annotations

import gc
import threading
from dataclasses import replace
from pathlib import Path
from typing import Callable

from .errors import ModeNotSupported
from .experiment import Experiment, Variant
from .jobs import JobSet, JobSpec
from .live import LiveJob, LiveRun, devices_for, scaled_for_run
from .results import VariantResult, trace_name


def torch_variants(exp: Experiment, jobset: JobSet, variants: list[Variant], folder: Path,
                   seed: int, progress: Callable[[str], None],
                   ) -> tuple[list[VariantResult], list[str]]:
    try:
        import torch
    except ImportError as e:
        raise ModeNotSupported(exp.name, "torch", f"PyTorch is not installed ({e})") from None
    cfg = exp.section("torch")
    models = list(cfg.get("models", ["cnn", "transformer", "lstm"]))
    steps = int(cfg.get("steps", 10))
    time_scale = float(cfg.get("time_scale", 0.01))
    gpu_memory = int(cfg.get("gpu_memory", 2 << 30))
    specs = scaled_for_run(jobset.jobs, steps)
    torch.set_num_threads(1)  # the job threads are the parallelism
    _warm_up(models)
    results = []
    for variant in variants:
        progress(variant.label)
        results.append(_torch_variant(exp, variant, specs, folder, seed, models, time_scale,
                                      gpu_memory))
    notes = [f"real PyTorch models ({', '.join(models)}) on the CPU through salus.torch, on "
             f"{gpu_memory / (1 << 30):g} GiB simulated GPU(s): memory is PyTorch's real "
             "allocations, not the workloads'; each step also enqueues the workload's GPU "
             f"time as a simulated kernel, scaled by {time_scale:g}; at most {steps} steps per "
             "job",
             "a step takes the longer of its simulated GPU time and the real model's CPU "
             "compute, which overlap as a GPU's kernels and a framework's host thread do"]
    return results, notes


def _torch_variant(exp: Experiment, variant: Variant, specs: list[JobSpec], folder: Path,
                   seed: int, models: list[str], time_scale: float,
                   gpu_memory: int) -> VariantResult:
    import salus.torch as salus_torch

    devices, pinned = devices_for(exp, "torch", variant, specs)
    live = LiveRun(exp, variant, pinned, devices, time_scale=time_scale, memory_scale=1.0,
                   gpu_memory=gpu_memory, sample_seconds=0.05, memory_hints=False)
    kinds = {s.name: models[i % len(models)] for i, s in enumerate(pinned)}
    seeds = {s.name: seed * 1000 + i for i, s in enumerate(pinned)}
    build = threading.Lock()  # torch.manual_seed is process-wide: models are built one by one

    def body(run: LiveRun, job: LiveJob) -> None:
        _job(run, job, kinds[job.spec.name], seeds[job.spec.name], build)

    def teardown() -> None:
        gc.collect()  # tensors in reference cycles go back to Salus before it closes
        salus_torch.disable()

    result = live.run(body, setup=lambda: salus_torch.enable(live.runtime), teardown=teardown,
                      trace=folder / trace_name(variant))
    result.variant = replace(variant, machines=1, gpus_per_machine=devices)
    return result


def _warm_up(models: list[str]) -> None:
    """One step of each model, in a job of a throwaway runtime, before anything is timed:
    PyTorch's first optimizer (a second here: it imports much of torch lazily) and first use
    of an operator cost far more than later ones, and time is scaled up hundreds of times."""
    import salus
    import salus.torch as salus_torch
    import torch

    from .torch_models import make_model

    with salus.Runtime("sim", memory="512MiB", policy="fifo") as runtime:
        salus_torch.enable(runtime)
        try:
            job = runtime.add_job("salus-bench warm-up")
            for kind in models:
                for inference in (False, True):
                    with job:
                        model, batch, loss_fn = make_model(
                            kind, torch.Generator().manual_seed(0), inference=inference)
                    with job.iteration():
                        inputs, targets = batch()
                        if inference:
                            with torch.no_grad():
                                model(inputs)
                        else:
                            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
                            loss_fn(model(inputs), targets).backward()
                            optimizer.step()
                            del optimizer
                    del model, batch, loss_fn
            job.leave()
        finally:
            gc.collect()
            salus_torch.disable()


def _job(run: LiveRun, job: LiveJob, kind: str, seed: int, build: threading.Lock) -> None:
    import torch

    from .torch_models import make_model

    spec = job.spec
    handle = job.handle
    gen = torch.Generator().manual_seed(seed + 1)
    with handle, build:  # weights and optimizer state: persistent
        torch.manual_seed(seed)
        model, batch, loss_fn = make_model(kind, gen, inference=spec.kind == "inference")
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3) \
            if spec.kind == "training" else None
    gpu_seconds = run.real(spec.iteration_seconds)
    for _ in range(spec.iterations):
        with run.iteration(job):
            # The GPU time first: the simulated GPU runs it while the real model computes on
            # the CPU, as a GPU runs kernels while the framework's host thread goes on.
            handle.sim_kernel(gpu_seconds, spec.occupancy)
            inputs, targets = batch()
            if optimizer is None:
                with torch.no_grad():
                    model(inputs).argmax(dim=-1)
            else:
                loss = loss_fn(model(inputs), targets)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        run.think(job)
    del model, optimizer
