"""Models the project did not write (torchvision, timm, Hugging Face transformers) trained in
threads through Salus on the simulated backend, under every policy, with memory set just above
what a one-lane schedule needs (measured here): no OutOfMemory, no starvation, and results
bitwise identical to the same training without Salus, five runs of five. And beside them a job
that cannot fit fails alone: the others train as if it were not there."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Optional

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("timm")
pytest.importorskip("transformers")

import salus  # noqa: E402
import salus.torch as salus_torch  # noqa: E402
from third_party import MODELS, make  # noqa: E402

STEPS = 4
SEED = 11
RUNS = 5
PAGE = 2 << 20
POLICIES = ("fifo", "srtf", "fair", "pack", "priority", "memory_aware")


@dataclass
class Outcome:
    losses: dict[str, list[float]]
    parameters: dict[str, list[torch.Tensor]]
    errors: dict[str, BaseException]
    peak_reserved: int
    starts: list[str]  # job names in the order their iterations started


def train_alone(name: str) -> tuple[list[float], list[torch.Tensor]]:
    """The reference: the same seeded training with PyTorch's own allocator."""
    assert not salus_torch.enabled()
    job = make(name, SEED)
    for _ in range(STEPS):
        job.step()
    return job.losses, job.parameters()


def without_frames(error: BaseException) -> BaseException:
    """The error with its chain's tracebacks dropped: kept for the report, it must not keep the
    failed iteration's frames, and their tensors, alive (a script that failed keeps nothing)."""
    seen: Optional[BaseException] = error
    while seen is not None:
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return error


def hog(job: salus.Job, memory: int, errors: dict[str, BaseException]) -> None:
    """A job that cannot fit: each iteration takes 2 MiB blocks up to twice the device, held in
    a local of its frame as a forward pass holds its activations."""
    try:
        for _ in range(STEPS):
            with job.iteration():
                held = []
                for _ in range(memory // (1 << 20)):
                    held.append(torch.empty(2 << 20, dtype=torch.uint8))
                del held
    except BaseException as e:  # noqa: BLE001 (reported by the test)
        errors[job.name] = without_frames(e)
    finally:
        job.leave()


def train_shared(policy: str, memory: int, with_hog: bool = False) -> Outcome:
    """The three models in threads, each its own Salus job, on one simulated GPU (and `hog`, a
    job that cannot fit, in a fourth thread)."""
    rt = salus.Runtime("sim", memory=memory, policy=policy)
    salus_torch.enable(rt)
    errors: dict[str, BaseException] = {}
    try:
        jobs, work = [], []
        for name in MODELS:
            job = rt.add_job(name)
            with job:  # weights and optimizer state: the job's persistent memory
                work.append(make(name, SEED))
            jobs.append(job)

        def train(job: salus.Job, w: object) -> None:
            try:
                for _ in range(STEPS):
                    with job.iteration():
                        w.step()
            except BaseException as e:  # noqa: BLE001 (reported by the test)
                errors[job.name] = e
            finally:
                job.leave()

        threads = [threading.Thread(target=train, args=(j, w)) for j, w in zip(jobs, work)]
        if with_hog:
            threads.append(threading.Thread(target=hog, args=(rt.add_job("hog"), memory, errors)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
            assert not t.is_alive(), f"{policy}: a training thread hangs"
        events = json.loads(rt.trace_json())["traceEvents"]
        spans = sorted((e["ts"], e["name"]) for e in events if e.get("cat") == "iteration")
        peak = rt.device_stats(0).peak_reserved
        salus_torch.disable()  # the copies below are the test's, not the jobs'
        return Outcome({w.name: w.losses for w in work},
                       {w.name: w.parameters() for w in work}, errors, peak,
                       [name for _, name in spans])
    finally:
        salus_torch.disable()
        rt.close()


@pytest.fixture(scope="module")
def references() -> dict[str, tuple[list[float], list[torch.Tensor]]]:
    return {name: train_alone(name) for name in MODELS}


@pytest.fixture(scope="module")
def tight_memory() -> int:
    """1.05x the device peak of one lane (fair), measured on a generous device, in whole pages:
    the three jobs' persistent memory and the largest iteration's."""
    measured = train_shared("fair", 512 << 20)
    assert not measured.errors, measured.errors
    need = measured.peak_reserved
    return -(-int(need * 1.05) // PAGE) * PAGE


def assert_turns_bounded(starts: list[str], policy: str) -> None:
    """While all three jobs are present, none waits more than six turns of others."""
    last_start = min(max(i for i, n in enumerate(starts) if n == name) for name in MODELS)
    seen: dict[str, int] = {}
    for i, name in enumerate(starts[:last_start + 1]):
        gap = i - seen.get(name, -1)
        assert gap <= 7, f"{policy}: {name} waited {gap - 1} turns ({''.join(n[0] for n in starts)})"
        seen[name] = i


def assert_as_alone(outcome: Outcome, references: dict, policy: str) -> None:
    for name in MODELS:
        ref_losses, ref_params = references[name]
        assert outcome.losses[name] == ref_losses, f"{policy}: {name}'s losses differ"
        for mine, ref in zip(outcome.parameters[name], ref_params):
            assert torch.equal(mine, ref), f"{policy}: {name}'s parameters differ"


@pytest.mark.parametrize("policy", POLICIES)
def test_three_third_party_models_share_a_tight_gpu(policy: str, references: dict,
                                                    tight_memory: int) -> None:
    for run in range(RUNS):
        outcome = train_shared(policy, tight_memory)
        assert not outcome.errors, f"{policy} at {tight_memory >> 20} MiB, run {run}: {outcome.errors}"
        assert outcome.peak_reserved <= tight_memory
        assert sorted(outcome.starts) == sorted(list(MODELS) * STEPS)
        if policy != "fifo":  # fifo runs each job to completion, by design
            assert_turns_bounded(outcome.starts, policy)
        assert_as_alone(outcome, references, policy)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_job_that_cannot_fit_fails_alone(policy: str, references: dict,
                                            tight_memory: int) -> None:
    """Before, the others failed beside it under every policy but fifo: a failed iteration's
    frames (and tensors) stayed alive in a reference cycle through Iteration.__exit__ until the
    cyclic collector ran, a job short of memory with nothing else running failed at once, and
    iterations short at the same time all failed."""
    for run in range(RUNS):
        outcome = train_shared(policy, tight_memory, with_hog=True)
        assert set(outcome.errors) == {"hog"}, f"{policy}, run {run}: {outcome.errors}"
        assert isinstance(outcome.errors["hog"], salus.OutOfMemory), outcome.errors["hog"]
        assert_as_alone(outcome, references, policy)
