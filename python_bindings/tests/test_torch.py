"""Real PyTorch training through Salus on the simulated backend: correctness, accounting,
sharing, cancel and limits."""

from __future__ import annotations

import gc
import json
import threading
import time
from typing import Callable

import pytest
import torch

import salus
import salus.torch as salus_torch
from conftest import make_torch_runtime
from models import Workload, make

ALIGN = 512  # Salus's block alignment (MemoryManager::kBlockAlignment)


def reference_run(kind: str, seed: int, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    """The same seeded training without Salus (PyTorch's own CPU allocator)."""
    assert not salus_torch.enabled()
    w = make(kind, seed)
    for _ in range(steps):
        w.step()
    return w.losses, w.parameters()


def run_job(job: salus.Job, w: Workload, steps: int,
            inside: Callable[[int], None] = lambda step: None) -> None:
    for step in range(steps):
        with job.iteration():
            w.step()
            inside(step)


@pytest.mark.parametrize("kind", ["cnn", "transformer", "lstm"])
def test_training_through_salus_is_bitwise_identical(kind: str) -> None:
    ref_losses, ref_params = reference_run(kind, seed=7, steps=20)
    rt = make_torch_runtime()
    try:
        job = rt.add_job(kind)
        with job:
            w = make(kind, seed=7)
        run_job(job, w, 20)
        counters = salus_torch.counters()
        assert counters["allocations"] > 0, "nothing went through Salus"
        assert w.losses == ref_losses
        for mine, ref in zip(w.parameters(), ref_params):
            assert torch.equal(mine, ref)
        # The model's tensors do live in Salus's memory.
        assert rt.device_stats(0).allocated > 0
        job.leave()
    finally:
        salus_torch.disable()
        rt.close()


def tensor_bytes(tensors: list[torch.Tensor]) -> tuple[int, int]:
    raw = sum(t.untyped_storage().nbytes() for t in tensors)
    return raw, len(tensors)


def test_persistent_bytes_are_parameters_plus_optimizer_state(torch_runtime: salus.Runtime) -> None:
    job = torch_runtime.add_job("cnn")
    with job:
        w = make("cnn", seed=1)
    params = list(w.model.parameters())
    raw, count = tensor_bytes(params)
    stats = job.stats()
    assert raw <= stats.memory.persistent.in_use <= raw + count * ALIGN
    assert stats.memory.ephemeral.in_use == 0

    run_job(job, w, 3)
    state = [t for s in w.optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    raw_state, count_state = tensor_bytes(state)
    stats = job.stats()
    # Adam's state is made inside the first iteration and survives it: promoted to persistent.
    assert stats.memory.promoted_bytes >= raw_state
    low = raw + raw_state
    assert low <= stats.memory.persistent.in_use <= low + (count + count_state) * ALIGN
    # Ephemeral memory (activations, gradients) peaked inside each iteration and is gone after.
    assert stats.ephemeral_peak_bytes > 0
    assert stats.memory.ephemeral.peak > 0
    assert stats.memory.ephemeral.in_use == 0
    assert stats.persistent_bytes == stats.memory.persistent.in_use
    del w, params, state
    job.leave()


def iteration_spans(rt: salus.Runtime) -> list[tuple[float, float, str]]:
    events = json.loads(rt.trace_json())["traceEvents"]
    spans = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in events
             if e.get("cat") == "iteration"]
    return sorted(spans)


def test_three_jobs_in_threads_interleave_under_fair() -> None:
    rt = make_torch_runtime("fair")
    steps = 6
    try:
        kinds = ["cnn", "transformer", "lstm"]
        jobs = [rt.add_job(k) for k in kinds]
        work = []
        for job, kind in zip(jobs, kinds):
            with job:
                work.append(make(kind, seed=3))
        # A gate job holds the lane until all three wait for it, so that they start together
        # whatever the machine does with their threads.
        gate = rt.add_job("gate")
        gate.begin_iteration()
        threads = [threading.Thread(target=run_job, args=(j, w, steps)) for j, w in zip(jobs, work)]
        for t in threads:
            t.start()
        while any(s.state != "waiting" for s in rt.job_stats() if s.name in kinds):
            time.sleep(0.001)
        gate.end_iteration()
        gate.leave()
        for t in threads:
            t.join()
        spans = [s for s in iteration_spans(rt) if s[2] != "gate"]
        names = [name for _, _, name in spans]
        assert sorted(names) == sorted(kinds * steps)
        # Single lane: iterations never overlap.
        for (_, end, _), (start, _, _) in zip(spans, spans[1:]):
            assert start >= end - 1.0  # microseconds of trace rounding
        # They interleave: all three waited when the lane came free, each with no GPU time yet,
        # and fair gives the turn to the least served, so each runs once before any runs twice.
        # (How many turns each gets later follows their measured compute, which is the
        # machine's business: not asserted.)
        assert sorted(names[:3]) == sorted(kinds), f"no interleaving: {names}"
        for job in jobs:
            job.leave()
    finally:
        salus_torch.disable()
        rt.close()


def test_inference_waits_at_most_one_training_iteration_under_priority() -> None:
    rt = make_torch_runtime("priority")
    try:
        trainers = [rt.add_job(f"train{i}", priority=0) for i in range(2)]
        server = rt.add_job("serve", kind="inference", priority=10)
        work = []
        for job in trainers:
            with job:
                work.append(make("cnn", seed=5))
        with server:
            model = make("cnn", seed=6).model.eval()
        durations: list[float] = []
        lock = threading.Lock()
        done = threading.Event()

        def train(job: salus.Job, w: Workload) -> None:
            while not done.is_set():
                with job.iteration():
                    t0 = time.perf_counter()
                    w.step()
                    with lock:
                        durations.append(time.perf_counter() - t0)

        def serve() -> None:
            gen = torch.Generator().manual_seed(9)
            for _ in range(15):
                time.sleep(0.005)  # requests arrive while the trainers run
                with server.iteration(), torch.no_grad():
                    model(torch.randn(4, 3, 32, 32, generator=gen)).argmax(1)
            done.set()

        threads = [threading.Thread(target=train, args=(j, w)) for j, w in zip(trainers, work)]
        threads.append(threading.Thread(target=serve))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        served = server.stats()
        assert served.iterations == 15
        longest = max(durations)
        # The request waits for the training iteration in flight, never for a queue of them.
        assert served.max_wait_seconds <= longest * 1.25 + 0.010, (served.max_wait_seconds, longest)
        for job in [*trainers, server]:
            job.leave()
    finally:
        salus_torch.disable()
        rt.close()


def test_cancel_mid_iteration_frees_memory_once_the_thread_stops_and_others_are_unharmed() -> None:
    steps = 8
    ref = {k: reference_run(k, seed=11, steps=steps)[0] for k in ("cnn", "lstm")}
    rt = make_torch_runtime("fair")
    try:
        a, victim, c = rt.add_job("cnn"), rt.add_job("victim"), rt.add_job("lstm")
        with a:
            wa = make("cnn", seed=11)
        with c:
            wc = make("lstm", seed=11)
        with victim:
            wv = make("transformer", seed=11)
        inside, cancelled, checked = threading.Event(), threading.Event(), threading.Event()
        outcome: dict[str, object] = {}

        def victim_loop() -> None:
            try:
                for step in range(100):
                    with victim.iteration():
                        wv.step()
                        if step == 2:
                            held = torch.full((1 << 18,), 7.0)  # 1 MiB the thread keeps using
                            inside.set()
                            cancelled.wait()
                            checked.wait()
                            # Still computing after the cancel: its memory is still its own.
                            # (numpy reads the tensor's memory without allocating through it)
                            outcome["intact"] = bool((held.numpy() == 7.0).all())
                            held.numpy()[:] = 14.0  # and writes it
                            torch.empty(1 << 20)  # the next allocation reports the cancel
            except salus.JobCancelled as e:
                outcome["error"] = e

        threads = [threading.Thread(target=run_job, args=(a, wa, steps)),
                   threading.Thread(target=run_job, args=(c, wc, steps)),
                   threading.Thread(target=victim_loop)]
        for t in threads:
            t.start()
        assert inside.wait(60)
        victim.cancel()
        cancelled.set()
        time.sleep(0.05)  # the others run meanwhile
        victim_stats = [s for s in rt.job_stats() if s.name == "victim"][0]
        assert victim_stats.state == "cancelled"
        checked.set()
        for t in threads:
            t.join()
        assert isinstance(outcome.get("error"), salus.JobCancelled), outcome
        assert outcome["intact"] is True, "its memory changed under it while it computed"
        assert wa.losses == ref["cnn"]
        assert wc.losses == ref["lstm"]
        # Its blocks stayed valid for its tensors (charged to nobody); they go with the tensors.
        after = [s for s in rt.job_stats() if s.name == "victim"][0]
        assert after.memory.in_use == 0
        outcome.clear()  # the exception's frames hold tensors
        del wv
        assert salus_torch.counters()["failed_frees"] == 0
        a.leave()
        c.leave()
        del wa, wc
        gc.collect()
        assert rt.device_stats(0).allocated == 0, "something leaked"
    finally:
        salus_torch.disable()
        rt.close()


def test_job_over_its_limit_gets_out_of_memory_naming_it_and_nothing_leaks() -> None:
    rt = make_torch_runtime("fair")
    try:
        other = rt.add_job("other")
        with other:
            wo = make("cnn", seed=2)
        baseline = rt.device_stats(0).allocated
        small = rt.add_job("small", limits=salus.JobLimits(total="8MiB"))
        with pytest.raises(salus.OutOfMemory) as info:
            with small.iteration():
                keep = torch.zeros(1 << 20)  # 4 MiB: fits
                torch.zeros(2 << 20)  # 8 MiB more: over the limit
        err = info.value
        assert err.job_name == "small"
        assert err.job == small.id
        assert err.requested >= 8 << 20
        assert err.job_limit == 8 << 20
        assert "small" in str(err)
        del keep
        # The job goes on after the refusal, within its limit.
        with small.iteration():
            torch.ones(1 << 20).sum()
        small.leave()
        assert rt.device_stats(0).allocated == baseline, "the refused job leaked"
        run_job(other, wo, 2)
        assert len(wo.losses) == 2
        other.leave()
    finally:
        salus_torch.disable()
        rt.close()


def test_a_failed_iterations_tensors_are_freed_as_its_error_unwinds() -> None:
    """The error an iteration raises for lack of memory holds no cycle through Salus's frames:
    with the cyclic collector off, the iteration's tensors are freed once the frame that caught
    it returns. Before, Iteration.__exit__ raised the Salus error from its own frame, whose
    locals its traceback reaches, and the failed job's memory stayed taken until the collector
    ran (issue 34: a job that cannot fit took the others down)."""
    import gc

    rt = make_torch_runtime("fair", memory="20MiB")
    job = rt.add_job("hog")

    def hog() -> str:
        try:
            with job.iteration():
                held = []
                for _ in range(20):
                    held.append(torch.empty(2 << 20, dtype=torch.uint8))
        except salus.OutOfMemory as e:
            return type(e).__name__
        return "fitted"

    enabled = gc.isenabled()
    gc.disable()
    try:
        assert hog() == "OutOfMemory"
        assert rt.device_stats(0).allocated == 0, "the failed iteration's tensors are alive"
        job.leave()
    finally:
        if enabled:
            gc.enable()
        salus_torch.disable()
        rt.close()


def test_enable_refuses_twice_and_wrong_types(torch_runtime: salus.Runtime) -> None:
    with pytest.raises(salus.InvalidArgument, match="enabled already"):
        salus_torch.enable(torch_runtime)
    with pytest.raises(TypeError, match="salus.Runtime"):
        salus_torch.enable("sim")  # type: ignore[arg-type]


def test_tensors_outlive_disable_and_the_runtime() -> None:
    rt = make_torch_runtime()
    t = torch.arange(1000.0)  # unattributed: no job's leave frees it
    salus_torch.disable()
    rt.close()
    # The glue keeps the runtime's memory while its tensors live.
    assert float(t.sum()) == 499500.0
    fresh = torch.ones(10)  # PyTorch's own allocator again
    assert float(fresh.sum()) == 10.0
    del t


class ShortestFirst(salus.Policy):
    """Fewest iterations done first: a policy written in Python."""

    name = "fewest_done"

    def key(self, job: salus.JobView) -> float:
        return float(job.iterations_done)


def test_training_threads_under_a_python_policy_do_not_deadlock() -> None:
    # The policy takes the GIL under the scheduler's lock; PyTorch allocates holding the GIL. The
    # glue releases the GIL around its runtime calls when a Python policy is in use.
    salus.register_policy("fewest_done", ShortestFirst)
    try:
        rt = make_torch_runtime("fewest_done")
        try:
            jobs = [rt.add_job(f"t{i}") for i in range(3)]
            work = []
            for job in jobs:
                with job:
                    work.append(make("cnn", seed=4))
            threads = [threading.Thread(target=run_job, args=(j, w, 4))
                       for j, w in zip(jobs, work)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=120)
                assert not t.is_alive(), "deadlock: a training thread is stuck"
            assert all(len(w.losses) == 4 for w in work)
            for job in jobs:
                job.leave()
        finally:
            salus_torch.disable()
            rt.close()
    finally:
        salus.unregister_policy("fewest_done")
