"""gpu_check.sh's Ray step: trials as processes of a CUDA salusd (SalusCluster(processes=True))
on this node's GPUs. Four small training trials on CUDA tensors, two at a time on a GPU, must end
with the losses they end with one at a time, each in a process of its own. Prints what it saw;
exits non-zero on a mismatch."""
from __future__ import annotations

import os
import sys
from typing import Any

import ray

import salus.ray as salus_ray


def train(config: dict[str, Any]) -> dict[str, Any]:
    import torch
    from torch import nn

    ctx = salus_ray.trial()
    with ctx.build_model():
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    gen = torch.Generator().manual_seed(ctx.seed)
    data = torch.randn(512, 256, generator=gen).cuda()
    target = torch.randint(0, 10, (512,), generator=gen).cuda()
    losses = []
    for step in range(config["steps"]):
        with ctx.job.iteration():
            loss = nn.functional.cross_entropy(model(data), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(loss.item())
    return {"losses": losses, "pid": os.getpid(), "gpu": ctx.worker}


def run(trials_per_gpu: int) -> tuple[list[dict[str, Any]], list[Any]]:
    configs = [{"lr": lr, "steps": 8} for lr in (0.01, 0.02, 0.05, 0.1)]
    with salus_ray.SalusCluster(processes=True, gpu_memory="4GiB", trials_per_gpu=trials_per_gpu,
                                placement="pack") as cluster:
        trials = cluster.map(train, configs,
                             hints={"persistent": "64MiB", "ephemeral_peak": "256MiB"})
        results = [t.result(timeout=300) for t in trials]
        return results, cluster.stats()


def main() -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    salus_ray.start_local(include_dashboard=False, log_to_driver=True, configure_logging=False)
    try:
        packed, stats = run(2)
        alone, _ = run(1)
    finally:
        ray.shutdown()
    print("workers:", [(s.worker, s.backend, s.capacity >> 20, s.peak_running, s.finished)
                       for s in stats])
    same = all(p["losses"] == a["losses"] for p, a in zip(packed, alone))
    pids = {p["pid"] for p in packed}
    print(f"trials {len(packed)}, processes {len(pids)}, packed losses equal alone: {same}")
    return 0 if same and len(pids) == len(packed) else 1


if __name__ == "__main__":
    sys.exit(main())
