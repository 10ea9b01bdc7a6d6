#!/usr/bin/env python3
"""Sixteen hyper-parameter trials of a small PyTorch model sharing two GPUs through Salus on Ray.

    python examples/ray_tune_sharing.py                 # Ray Tune, 2 simulated GPUs
    python examples/ray_tune_sharing.py --no-tune       # SalusCluster.map, same trials
    python examples/ray_tune_sharing.py --one-per-gpu   # the baseline: one trial per GPU at once

A local Ray cluster is started here. Without GPUs each Salus worker holds a simulated GPU
(``--gpu-memory``): tensors live in simulated GPU memory and the arithmetic runs on the CPU; each
step also enqueues a simulated kernel standing for its GPU time. On a Ray cluster with GPUs
(``--address auto``), one worker per GPU holds the real one.

The trials carry no memory hints: the first one runs on a GPU of its own, Salus measures it,
and the rest are placed by what it measured (persistent weights plus one shared ephemeral
region per GPU), as many per GPU as fit. The table shows each trial's final loss, and each GPU
how many trials it ran at once and its simulated utilization.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

import ray
import salus.ray
import salus.ray.tune

import torch
from torch import nn

STEPS = 30
SIMULATED_STEP = (0.004, 0.3)  # seconds alone, occupancy: a small model leaves most of a GPU idle


class Classifier(nn.Module):
    """An MLP over 2-D points in 4 classes (a spiral-like synthetic set)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def batch(gen: torch.Generator, size: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 4, (size,), generator=gen)
    radius = torch.rand(size, generator=gen) + 0.2
    angle = labels.float() * (torch.pi / 2) + radius * 2.5 + 0.2 * torch.randn(size, generator=gen)
    return torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1), labels


def train(config: dict[str, Any]) -> dict[str, Any]:
    """One trial: runs in a Salus GPU worker's thread, as a Salus job."""
    ctx = salus.ray.trial()
    with ctx.build_model():  # weights and optimizer state: the job's persistent memory
        model = Classifier(config["hidden"]).to(ctx.device)
        opt = torch.optim.Adam(model.parameters(), lr=config["lr"])
    gen = torch.Generator().manual_seed(ctx.seed)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(STEPS):
        with ctx.job.iteration():  # waits for this trial's turn on its GPU
            x, y = batch(gen)
            loss = loss_fn(model(x.to(ctx.device)), y.to(ctx.device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if ctx.backend == "sim":
                ctx.job.sim_kernel(*SIMULATED_STEP)
            ctx.job.synchronize()
        if step % 10 == 9 or step == STEPS - 1:
            ctx.report(step=step + 1, loss=loss.item())
    return {"loss": loss.item(), "worker": ctx.worker}


LEARNING_RATES = (1e-3, 3e-3, 1e-2, 3e-2)
HIDDEN = (32, 64, 128, 256)
SEED = 0  # every trial sees the same data and initial draw: only the hyper-parameters differ


def configs() -> list[dict[str, Any]]:
    return [{"lr": lr, "hidden": hidden} for lr in LEARNING_RATES for hidden in HIDDEN]


def profile_of(config: dict[str, Any]) -> str:
    """Trials of one model size need the same memory: Salus measures the first of each."""
    return f"classifier-{config['hidden']}"


def run_with_tune(cluster: salus.ray.SalusCluster) -> list[dict[str, Any]]:
    from ray import tune

    trainable = tune.with_resources(
        salus.ray.tune.trainable(train, cluster, profile=profile_of), {"cpu": 0.1})
    tuner = tune.Tuner(
        trainable, param_space={"lr": tune.grid_search(list(LEARNING_RATES)),
                                "hidden": tune.grid_search(list(HIDDEN)), "seed": SEED},
        tune_config=tune.TuneConfig(max_concurrent_trials=16),
        run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(prefix="salus-tune-"),
                                  verbose=0))
    results = tuner.fit()
    return [{"lr": r.config["lr"], "hidden": r.config["hidden"], "loss": r.metrics.get("loss"),
             "error": r.error} for r in results]


def run_plain(cluster: salus.ray.SalusCluster) -> list[dict[str, Any]]:
    trials = [cluster.submit(train, c, name=f"lr{c['lr']:g}-h{c['hidden']}", seed=SEED,
                             profile=profile_of(c))
              for c in configs()]
    out = []
    for c, t in zip(configs(), trials):
        try:
            out.append(dict(c, **t.result(), error=None))
        except Exception as e:  # noqa: BLE001 (a failed trial is a row, not the end)
            out.append(dict(c, loss=None, error=e))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", help="a running Ray cluster ('auto'); default: start one")
    parser.add_argument("--gpus", type=int, default=2, help="simulated GPUs (no real GPU)")
    parser.add_argument("--gpu-memory", default="8MiB", help="each simulated GPU's memory")
    parser.add_argument("--no-tune", action="store_true", help="SalusCluster.submit, no Tune")
    parser.add_argument("--one-per-gpu", action="store_true", help="one trial per GPU at once")
    args = parser.parse_args()

    if args.address:
        ray.init(address=args.address, include_dashboard=False, log_to_driver=False)
    else:  # a local cluster, its workers at this process's priority
        salus.ray.start_local(include_dashboard=False, log_to_driver=False, num_cpus=4)
    real_gpus = int(ray.cluster_resources().get("GPU", 0))
    started = time.monotonic()
    with salus.ray.SalusCluster(simulated_gpus=None if real_gpus else args.gpus,
                                gpu_memory=args.gpu_memory,
                                trials_per_gpu=1 if args.one_per_gpu else None) as cluster:
        rows = run_plain(cluster) if args.no_tune else run_with_tune(cluster)
        wall = time.monotonic() - started
        stats = cluster.stats()
    print(f"{'lr':>7} {'hidden':>6} {'loss':>8}  error")
    for r in sorted(rows, key=lambda r: (r["lr"], r["hidden"])):
        loss = "-" if r["loss"] is None else f"{r['loss']:.4f}"
        print(f"{r['lr']:>7g} {r['hidden']:>6} {loss:>8}  {r['error'] or ''}")
    for s in stats:
        util = s.utilization_seconds / wall if wall > 0 else 0.0
        print(f"GPU {s.worker} ({s.backend}): {s.finished} trials finished, {s.failed} failed, "
              f"at most {s.peak_running} at once, peak {s.peak_allocated / 2**20:.1f} MiB of "
              f"{s.capacity / 2**20:.0f}, simulated utilization {util:.0%}")
    failed = sum(1 for r in rows if r["error"] is not None)
    print(f"{len(rows)} trials, {failed} failed, {wall:.1f} s")
    ray.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
