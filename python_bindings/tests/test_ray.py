"""salus.ray on a local Ray cluster (started and stopped here) with simulated GPUs.

The trial functions run in GPU worker actors, other processes: they are pickled by value
(ray.cloudpickle.register_pickle_by_value), so the workers need not import this file.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import salus  # noqa: E402
import salus.ray as salus_ray  # noqa: E402
from salus.ray.placement import GpuLoad, Need, choose  # noqa: E402

MiB = 1 << 20
TIMEOUT = 120  # seconds: a trial that never ends fails its test rather than hanging it

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


# --- the admission rule alone ---------------------------------------------------------------------

def test_rule_holds_persistent_plus_the_largest_ephemeral_peak() -> None:
    gpu = GpuLoad(100)
    gpu.needs["a"] = Need(20, 30)
    gpu.needs["b"] = Need(10, 50)
    assert gpu.committed() == 20 + 10 + 50  # the peaks take turns in one ephemeral region
    assert gpu.fits(Need(20, 10))  # 50 + 20 + 50 = 100
    assert not gpu.fits(Need(21, 10))
    assert not gpu.fits(Need(0, 71))  # a larger peak grows the region: 30 + 71 > 100


def test_spread_and_pack_choose_differently_and_none_when_nothing_fits() -> None:
    loads = [GpuLoad(100), GpuLoad(100)]
    loads[0].needs["a"] = Need(10, 10)
    assert choose(loads, Need(10, 10), "spread") == 1
    assert choose(loads, Need(10, 10), "pack") == 0
    assert choose(loads, Need(95, 10), "spread") is None
    capped = [GpuLoad(100, max_trials=1)]
    capped[0].needs["a"] = Need(1, 1)
    assert choose(capped, Need(1, 1)) is None
    with pytest.raises(ValueError, match="unknown placement 'best'"):
        choose(loads, Need(1, 1), "best")


def test_a_trial_of_unknown_size_gets_a_gpu_of_its_own() -> None:
    gpu = GpuLoad(100)
    assert gpu.fits(Need(0, 0, exclusive=True))
    gpu.needs["new"] = Need(0, 0, exclusive=True)
    assert not gpu.fits(Need(1, 1))
    other = GpuLoad(100)
    other.needs["a"] = Need(1, 1)
    assert not other.fits(Need(0, 0, exclusive=True))


# --- trial functions (they run in the workers) ----------------------------------------------------

def hold_and_iterate(config: dict[str, Any]) -> dict[str, Any]:
    """Allocates its persistent bytes, then per iteration its ephemeral bytes, runs a simulated
    kernel, and reports. ``extra``: bytes more than that in the last iteration (over its hint).
    ``forever``: iterates until cancelled."""
    job = salus_ray.job()
    with job:
        weights = job.allocate(config["persistent"], lifetime="persistent")
    steps = 0
    while config.get("forever") or steps < config["steps"]:
        with job.iteration():
            size = config["ephemeral"]
            if config.get("extra") and steps == config["steps"] - 1:
                size += config["extra"]
            block = job.allocate(size)
            job.sim_kernel(config.get("kernel_seconds", 0.01), 0.5)
            job.synchronize()
            job.deallocate(block)
        steps += 1
        salus_ray.report(step=steps)
    job.deallocate(weights)
    return {"steps": steps, "worker": salus_ray.trial().worker}


def build_then_iterate(config: dict[str, Any]) -> int:
    """Weights made in build_model (as a PyTorch trial makes its model), then iterations."""
    ctx = salus_ray.trial()
    with ctx.build_model() as job:
        weights = job.allocate(config["persistent"], lifetime="persistent")
    for _ in range(config["steps"]):
        with job.iteration():
            block = job.allocate(config["ephemeral"])
            job.sim_kernel(0.01, 0.4)
            job.synchronize()
            job.deallocate(block)
    job.deallocate(weights)
    return config["steps"]


def loop_over_batches(config: dict[str, Any]) -> list[int]:
    """The loop marked by ctx.iterations rather than a with block."""
    ctx = salus_ray.trial()
    seen = []
    for batch in ctx.iterations(range(config["steps"])):
        ctx.job.sim_kernel(0.002, 0.5)
        seen.append((batch, ctx.job.stats().state))
    return [b for b, state in seen if state == "running"]


def raise_value_error(config: dict[str, Any]) -> None:
    with salus_ray.job().iteration():
        raise ValueError(f"bad config {config}")


def train_mlp(config: dict[str, Any]) -> list[float]:
    """A small PyTorch model trained on synthetic data from the trial's seed."""
    import torch
    from torch import nn

    ctx = salus_ray.trial()
    with ctx.build_model():
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    gen = torch.Generator().manual_seed(ctx.seed)
    target = torch.randn(16, 1, generator=gen)
    losses = []
    for _ in range(config["steps"]):
        with ctx.job.iteration():
            x = torch.randn(64, 16, generator=gen)
            loss = ((model(x) - x @ target) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            ctx.job.sim_kernel(0.005, 0.5)
            ctx.job.synchronize()
        losses.append(loss.item())
    return losses


def hints(persistent: int, ephemeral: int) -> dict[str, int]:
    return {"persistent": persistent, "ephemeral_peak": ephemeral}


def wait_until(predicate: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.02)


# --- on the cluster -------------------------------------------------------------------------------

def niceness(config: dict) -> int:
    return os.nice(0)


def test_the_workers_of_a_cluster_started_here_run_at_the_drivers_priority(
        local_ray: None) -> None:
    # Ray's default (15) starves a worker's host side beside any busy process (tens of times
    # slower beside two busy loops); salus.ray.start_local keeps the driver's.
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="64MiB", torch=False) as cluster:
        assert cluster.submit(niceness, {}).result(timeout=TIMEOUT) == os.nice(0)
    assert ray.get(ray.remote(niceness).remote({}), timeout=TIMEOUT) == os.nice(0)


def test_trials_share_the_gpu_workers(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=2, gpu_memory="64MiB", torch=False) as cluster:
        config = {"persistent": 2 * MiB, "ephemeral": 4 * MiB, "steps": 8}
        trials = cluster.map(hold_and_iterate, [config] * 6, hints=hints(2 * MiB, 4 * MiB))
        results = ray.get([t.ref for t in trials], timeout=TIMEOUT)
        assert [r["steps"] for r in results] == [8] * 6
        assert {r["worker"] for r in results} == {0, 1}
        stats = cluster.stats()
        assert all(s.peak_running >= 2 for s in stats), stats  # several trials per GPU at once
        assert sum(s.finished for s in stats) == 6
        assert all(s.allocated == 0 for s in stats)  # every trial's memory came back
        # Persistent bytes of all trials on a GPU plus one ephemeral region: never their sum.
        for s in stats:
            assert s.peak_allocated <= 3 * 2 * MiB + 4 * MiB + 3 * 4 * MiB


def test_a_trial_over_its_limit_fails_alone(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="64MiB", torch=False) as cluster:
        good = {"persistent": 2 * MiB, "ephemeral": 4 * MiB, "steps": 6}
        greedy = dict(good, extra=8 * MiB)
        trials = [cluster.submit(hold_and_iterate, good, name="good-a", hints=hints(2 * MiB,
                                                                                     4 * MiB)),
                  cluster.submit(hold_and_iterate, greedy, name="greedy",
                                 hints=hints(2 * MiB, 4 * MiB)),
                  cluster.submit(hold_and_iterate, good, name="good-b",
                                 hints=hints(2 * MiB, 4 * MiB))]
        with pytest.raises(salus.OutOfMemory) as caught:
            trials[1].result(timeout=TIMEOUT)
        err = caught.value
        assert err.job_name == "greedy"
        assert err.job_limit == 6 * MiB  # what its hints reserved
        assert err.requested >= 12 * MiB
        assert trials[0].result(timeout=TIMEOUT)["steps"] == 6
        assert trials[2].result(timeout=TIMEOUT)["steps"] == 6
        (stats,) = cluster.stats()
        assert (stats.finished, stats.failed, stats.allocated) == (2, 1, 0)


def test_a_loop_marked_by_iterations_runs_each_pass_as_an_iteration(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="16MiB", torch=False) as cluster:
        trial = cluster.submit(loop_over_batches, {"steps": 5}, hints=hints(0, MiB))
        assert trial.result(timeout=TIMEOUT) == [0, 1, 2, 3, 4]
        (job,) = ray.get(cluster.workers[0].job_stats.remote())
        assert job.iterations == 5


def test_trials_waiting_for_a_lane_build_nothing_before_their_turn(local_ray: None) -> None:
    # 48 MiB: the placer admits four trials of 8 + 12 MiB (4 * 8 + 12 = 44); "pack" runs two
    # lanes at once and keeps the fourth trial waiting for admission. Weights it made before
    # then would take 8 MiB the two running lanes hold (24 + 12 + 12 = 48).
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="48MiB", policy="pack",
                                torch=False) as cluster:
        config = {"persistent": 8 * MiB, "ephemeral": 12 * MiB, "steps": 6}
        trials = cluster.map(build_then_iterate, [config] * 6, hints=hints(8 * MiB, 12 * MiB))
        assert ray.get([t.ref for t in trials], timeout=TIMEOUT) == [6] * 6
        (stats,) = cluster.stats()
        assert (stats.finished, stats.failed, stats.allocated) == (6, 0, 0)
        assert stats.peak_running >= 3
        assert stats.peak_allocated <= 48 * MiB


def test_an_error_in_a_trial_raises_in_the_driver_and_harms_no_other(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="64MiB", torch=False) as cluster:
        ok = cluster.submit(hold_and_iterate, {"persistent": MiB, "ephemeral": MiB, "steps": 4},
                            hints=hints(MiB, MiB))
        bad = cluster.submit(raise_value_error, {"lr": -1}, hints=hints(MiB, MiB))
        with pytest.raises(ValueError, match="bad config"):
            ray.get(bad.ref, timeout=TIMEOUT)
        assert ok.result(timeout=TIMEOUT)["steps"] == 4


def test_cancelling_frees_memory_and_lets_a_waiting_trial_in(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="64MiB", torch=False) as cluster:
        big = hints(40 * MiB, 2 * MiB)
        spinning = cluster.submit(hold_and_iterate, {"persistent": 40 * MiB,
                                                     "ephemeral": 2 * MiB, "forever": True},
                                  name="spinning", hints=big)
        wait_until(lambda: len(spinning.reports()) >= 2)
        waiting = cluster.submit(hold_and_iterate, {"persistent": 40 * MiB, "ephemeral": 2 * MiB,
                                                    "steps": 3}, name="waiting", hints=big)
        never = cluster.submit(hold_and_iterate, {"persistent": 40 * MiB, "ephemeral": 2 * MiB,
                                                  "steps": 3}, name="never", hints=big)
        wait_until(lambda: cluster.waiting() == 2)  # 40 + 40 MiB do not fit in 64
        (before,) = cluster.stats()
        assert before.allocated >= 40 * MiB and before.running == ["spinning"]
        never.cancel()  # while it waits: it never starts
        with pytest.raises(ray.exceptions.TaskCancelledError):
            never.result(timeout=TIMEOUT)
        spinning.cancel()  # while it runs: stopped at an iteration boundary
        with pytest.raises(ray.exceptions.TaskCancelledError):
            spinning.result(timeout=TIMEOUT)
        assert waiting.result(timeout=60)["steps"] == 3
        (after,) = cluster.stats()
        assert (after.finished, after.cancelled, after.allocated) == (1, 1, 0)
        assert cluster.waiting() == 0


@ray.remote(num_cpus=0)
class TrialOwner:
    """Stands for a Ray Tune trial actor: it submits a trial and waits for it."""

    def submit(self, handle: Any, config: dict[str, Any]) -> str:
        me = ray.get_runtime_context().current_actor
        self.trial = handle.submit(hold_and_iterate, config, name="owned", seed=0, hints=None,
                                   profile=None, priority=0, owner=me)
        return self.trial.trial_id


def test_a_trial_whose_owner_dies_is_cancelled(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="16MiB", torch=False) as cluster:
        owner = TrialOwner.remote()
        ray.get(owner.submit.remote(cluster.handle, {"persistent": MiB, "ephemeral": MiB,
                                                     "forever": True}), timeout=TIMEOUT)
        wait_until(lambda: cluster.stats()[0].running == ["owned"])
        ray.kill(owner)
        wait_until(lambda: cluster.stats()[0].cancelled == 1)
        (stats,) = cluster.stats()
        assert (stats.running, stats.allocated) == ([], 0)
        wait_until(lambda: cluster.load()[0]["trials"] == 0)


def test_results_equal_one_trial_per_gpu(local_ray: None) -> None:
    configs = [{"lr": lr, "steps": 12} for lr in (0.01, 0.03, 0.05, 0.1)]

    def run(**kwargs: Any) -> tuple[list[list[float]], list[Any]]:
        with salus_ray.SalusCluster(simulated_gpus=2, gpu_memory="256MiB", **kwargs) as cluster:
            trials = cluster.map(train_mlp, configs, seed=7, hints=hints(4 * MiB, 4 * MiB))
            return ray.get([t.ref for t in trials], timeout=TIMEOUT), cluster.stats()

    shared, shared_stats = run()
    alone, alone_stats = run(trials_per_gpu=1)
    assert any(s.peak_running >= 2 for s in shared_stats)
    assert all(s.peak_running == 1 for s in alone_stats)
    assert shared == alone  # bit for bit: same seeds, same steps, whatever ran beside them
    assert all(losses[-1] < losses[0] for losses in shared)


def test_unhinted_trials_run_alone_until_measured(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="64MiB", torch=False) as cluster:
        config = {"persistent": 2 * MiB, "ephemeral": 2 * MiB, "steps": 3}
        first = cluster.submit(hold_and_iterate, config)
        first.result(timeout=TIMEOUT)
        profiles = ray.get(cluster._placer.profiles.remote())
        assert profiles[hold_and_iterate.__qualname__] == (2 * MiB, 2 * MiB)
        later = [cluster.submit(hold_and_iterate, dict(config, steps=6)) for _ in range(3)]
        ray.get([t.ref for t in later], timeout=TIMEOUT)
        assert cluster.stats()[0].peak_running >= 2  # measured: they now share
        # Weights made in build_model (the first iteration) count as persistent only.
        built = cluster.submit(build_then_iterate, {"persistent": 2 * MiB, "ephemeral": 3 * MiB,
                                                    "steps": 3})
        assert built.result(timeout=TIMEOUT) == 3
        profiles = ray.get(cluster._placer.profiles.remote())
        assert profiles[build_then_iterate.__qualname__] == (2 * MiB, 3 * MiB)


def test_a_trial_larger_than_every_gpu_is_refused(local_ray: None) -> None:
    with salus_ray.SalusCluster(simulated_gpus=2, gpu_memory="64MiB", torch=False) as cluster:
        trial = cluster.submit(hold_and_iterate, {}, name="huge", hints=hints(60 * MiB, 8 * MiB))
        with pytest.raises(salus_ray.FitsNoGpu) as caught:
            trial.result(timeout=TIMEOUT)
        assert (caught.value.trial, caught.value.persistent, caught.value.largest_gpu) == \
            ("huge", 60 * MiB, 64 * MiB)


def test_bad_arguments_are_named(local_ray: None) -> None:
    with pytest.raises(salus.InvalidArgument, match="unknown policy 'fastest'"):
        salus_ray.SalusCluster(simulated_gpus=1, policy="fastest")
    with pytest.raises(salus.InvalidArgument, match="trials_per_gpu must be at least 1"):
        salus_ray.SalusCluster(simulated_gpus=1, trials_per_gpu=0)
    with pytest.raises(salus.InvalidArgument, match="unknown placement"):
        salus_ray.SalusCluster(simulated_gpus=1, placement="random")
    with pytest.raises(salus.InvalidArgument, match="has no GPU"):
        salus_ray.SalusCluster()
    cluster = salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="16MiB", torch=False)
    with pytest.raises(TypeError, match="fn must be callable"):
        cluster.submit(42)  # type: ignore[arg-type]
    with pytest.raises(salus.InvalidArgument, match="cannot read 'lots'"):
        cluster.submit(hold_and_iterate, {}, hints={"persistent": "lots"})
    cluster.shutdown()
    with pytest.raises(salus_ray.ClusterClosed):
        cluster.submit(hold_and_iterate, {})
    with pytest.raises(salus.InvalidArgument, match="not inside a salus.ray trial"):
        salus_ray.job()


def quiet_then_return(config: dict[str, Any]) -> dict[str, float]:
    """A trial that reports nothing until it returns, more than a second later."""
    job = salus_ray.job()
    with job.iteration():
        job.sim_kernel(config["quiet_seconds"], 0.5)
        job.synchronize()
    return {"quiet": 1.0}


def fit_within(tuner: Any, seconds: float) -> Any:
    """tuner.fit(), failing the test instead of hanging it when Tune never finishes."""
    import concurrent.futures

    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(tuner.fit).result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        pytest.fail(f"Tune did not finish its trials within {seconds} s")
    finally:
        pool.shutdown(wait=False)


@pytest.mark.parametrize("processes", [False, True], ids=["worker-threads", "trial-processes"])
def test_ray_tune_trials_run_as_salus_jobs(processes: bool, local_ray: None,
                                           tmp_path: Any) -> None:
    """Tune's function trainables, each trial a job of a GPU worker (threads) or a process of
    its own of the cluster's salusd: reports reach Tune, a failing trial fails alone, and a
    trial that reports nothing for longer than the placer takes to check on its owner (once a
    second) finishes (Tune's trial actor, whose one thread waits for the trial meanwhile, once
    kept that check from ever returning)."""
    tune = pytest.importorskip("ray.tune")
    import salus.ray.tune as salus_tune

    def pick(config: dict[str, Any]) -> Any:
        if config["kind"] == "fail":
            return raise_value_error(config)
        if config["kind"] == "quiet":
            return quiet_then_return(config)
        return hold_and_iterate(config)

    with salus_ray.SalusCluster(simulated_gpus=1, gpu_memory="64MiB", torch=False,
                                processes=processes) as cluster:
        trainable = tune.with_resources(
            salus_tune.trainable(pick, cluster, hints=hints(2 * MiB, 2 * MiB)), {"cpu": 0.1})
        tuner = tune.Tuner(
            trainable,
            param_space={"kind": tune.grid_search(["iterate", "fail", "quiet"]),
                         "persistent": 2 * MiB, "ephemeral": 2 * MiB, "steps": 5,
                         "quiet_seconds": 1.5},
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0))
        results = {r.config["kind"]: r for r in fit_within(tuner, TIMEOUT)}
        assert results["iterate"].error is None
        assert results["iterate"].metrics["step"] == 5  # every report came through tune.report
        assert len(results["iterate"].metrics_dataframe) == 5
        assert isinstance(results["fail"].error, Exception)
        assert "bad config" in str(results["fail"].error)
        assert results["quiet"].error is None and results["quiet"].metrics["quiet"] == 1.0
        (stats,) = cluster.stats()
        assert (stats.finished, stats.failed) == (2, 1)
        if not processes:  # a trial process's pages come back once it has exited, a little later
            assert stats.allocated == 0
