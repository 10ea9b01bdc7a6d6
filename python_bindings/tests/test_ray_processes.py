"""salus.ray with trials as processes (SalusCluster(processes=True)): each trial a Ray actor
process of its own and a process of the salusd the cluster starts, on a local Ray cluster with
simulated GPUs. Trials are packed by the same admission rule, end with the losses they end with
one trial per GPU, and a trial that raises or whose process dies fails alone."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import salus.ray as salus_ray  # noqa: E402
from salus.errors import InvalidArgument  # noqa: E402
from salus.ray.cluster import daemon_args, trial_actor_options  # noqa: E402

TIMEOUT = 600  # a bound on a hang, not a speed: Ray starts slowly on a busy machine

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def train(config: dict[str, Any]) -> dict[str, Any]:
    """A small PyTorch model, seeded by the trial; ``fail``: "raise" or "die" at step 2."""
    import torch
    from torch import nn

    ctx = salus_ray.trial()
    with ctx.build_model():
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    gen = torch.Generator().manual_seed(ctx.seed)
    data, target = torch.randn(32, 16, generator=gen), torch.randn(32, 1, generator=gen)
    losses = []
    for step in range(config["steps"]):
        if step == 2 and config.get("fail") == "raise":
            raise ValueError("this trial's config is bad")
        if step == 2 and config.get("fail") == "die":
            os._exit(3)  # the process dies mid-trial, holding its pages
        with ctx.job.iteration():
            loss = nn.functional.mse_loss(model(data), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(loss.item())
        salus_ray.report(step=step)
    return {"losses": losses, "pid": os.getpid(), "gpu": ctx.worker}


CONFIGS = [{"lr": lr, "steps": 6} for lr in (0.01, 0.02, 0.05, 0.1)]
HINTS = {"persistent": "1MiB", "ephemeral_peak": "4MiB"}


def run_all(trials_per_gpu: int, configs: list[dict[str, Any]]) -> list[Any]:
    with salus_ray.SalusCluster(simulated_gpus=2, gpu_memory="64MiB", processes=True,
                                trials_per_gpu=trials_per_gpu, placement="pack") as cluster:
        trials = cluster.map(train, configs, hints=HINTS)
        outcomes = []
        for t in trials:
            try:
                outcomes.append(t.result(timeout=TIMEOUT))
            except Exception as e:  # noqa: BLE001: which trials failed is the point
                outcomes.append(e)
        stats = cluster.stats()
    return [outcomes, stats]


def test_trials_in_processes_pack_and_train_as_one_per_gpu(local_ray: None) -> None:
    packed, stats = run_all(2, CONFIGS)
    alone, _ = run_all(1, CONFIGS)
    for p, a in zip(packed, alone):
        assert not isinstance(p, Exception), p
        assert p["losses"] == a["losses"]  # bitwise: sharing changed nothing
    pids = {p["pid"] for p in packed}
    assert len(pids) == len(CONFIGS), "each trial has a process of its own"
    assert os.getpid() not in pids
    assert max(s.peak_running for s in stats) == 2, stats  # packed: two at once on a GPU
    assert sum(s.finished for s in stats) == len(CONFIGS)
    # The bytes are the daemon's count of the trials' pages: a GPU held at most its size.
    assert all(0 < s.peak_allocated <= 64 << 20 for s in stats), stats


def test_a_failing_trial_fails_alone(local_ray: None) -> None:
    configs = [dict(c) for c in CONFIGS]
    configs[1]["fail"] = "raise"
    configs[2]["fail"] = "die"
    outcomes, stats = run_all(2, configs)
    clean, _ = run_all(2, CONFIGS)  # the same trials (and seeds), none failing
    assert isinstance(outcomes[1], ray.exceptions.RayTaskError)
    assert "this trial's config is bad" in str(outcomes[1])
    assert isinstance(outcomes[2], ray.exceptions.RayError), outcomes[2]  # its process died
    assert outcomes[0]["losses"] == clean[0]["losses"]
    assert outcomes[3]["losses"] == clean[3]["losses"]
    assert sum(s.failed for s in stats) == 2 and sum(s.finished for s in stats) == 2, stats


def test_trials_as_processes_on_real_gpus_need_a_gpu(local_ray: None) -> None:
    # This Ray cluster has no GPU: real GPUs are asked for, and the error says what to pass.
    with pytest.raises(InvalidArgument, match="has no GPU"):
        salus_ray.SalusCluster(processes=True)


def test_a_cuda_daemon_serves_the_nodes_gpus_from_their_free_memory() -> None:
    assert daemon_args("cuda", 4, None, "fair") == [
        "--backend", "cuda", "--policy", "fair", "--log-level", "warn"]
    assert daemon_args("cuda", 4, 8 << 30, "pack")[-2:] == ["--memory", str(8 << 30)]
    assert daemon_args("sim", 2, 64 << 20, "fair") == [
        "--backend", "sim", "--policy", "fair", "--log-level", "warn", "--devices", "2",
        "--memory", str(64 << 20)]


def test_cuda_trial_processes_stay_on_the_daemons_node_and_see_its_gpus(local_ray: None) -> None:
    node = ray.get_runtime_context().get_node_id()
    cuda = trial_actor_options("cuda", node, {"CUDA_VISIBLE_DEVICES": "GPU-1234,GPU-5678"})
    strategy = cuda["scheduling_strategy"]
    assert strategy.node_id == node and strategy.soft is False
    assert cuda["runtime_env"]["env_vars"] == {
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
        "CUDA_VISIBLE_DEVICES": "GPU-1234,GPU-5678"}
    # Unset in the driver: Ray leaves the trials' alone too (they see what the node's raylet saw).
    assert "CUDA_VISIBLE_DEVICES" not in trial_actor_options("cuda", node, {})["runtime_env"][
        "env_vars"]
    assert "runtime_env" not in trial_actor_options("sim", node, {})
