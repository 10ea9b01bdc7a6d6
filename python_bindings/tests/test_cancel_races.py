"""Cancels and leaves racing PyTorch work in the default mode (issue 19).

Jobs made by ``rt.add_job`` keep their blocks past their end (``blocks_outlive_job``): a cancel or
a leave frees nothing that tensors still hold, and the tensors free their blocks when they go.
Here threads train real models through ``salus.torch`` on the simulated backend while another
thread cancels or leaves their jobs at random moments, under every policy; and six threads
allocate raw blocks on one job while it is cancelled. Afterwards nothing may be left allocated,
a fresh job must get the whole device, and a cancelled job must have heard JobCancelled, never
UnknownJob, until it left.

Every test is bounded in time: a thread still running past its deadline fails the test, and a
hang that no join can bound (the main thread stuck in Salus) ends the process with every thread's
traceback (faulthandler). SALUS_TEST_SEED replays a run; the seed is in every failure message.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator, Optional

import pytest
import torch

import salus
import salus.torch as salus_torch
from models import Workload, make

POLICIES = ["fifo", "srtf", "fair", "pack", "priority", "memory_aware"]
DEVICE = "256MiB"
SURVIVOR_STEPS = 4
RACE_SECONDS = 4.0  # cancels and leaves keep coming this long (survivors done or not)
LOADERS = 3  # helper threads allocating for each victim job
JOIN_SECONDS = 30.0  # a thread still running this long after the race is a hang


def seed_of_run() -> int:
    return int(os.environ.get("SALUS_TEST_SEED", random.randrange(1 << 32)))


@pytest.fixture(autouse=True)
def hang_guard() -> Iterator[None]:
    """A test past 120 s ends the process with every thread's traceback instead of hanging CI."""
    faulthandler.dump_traceback_later(120, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


_references: dict[tuple[str, int], list[float]] = {}


def reference_losses(kind: str, seed: int) -> list[float]:
    """The same seeded training without Salus (computed before salus.torch is enabled)."""
    key = (kind, seed)
    if key not in _references:
        assert not salus_torch.enabled()
        w = make(kind, seed)
        for _ in range(SURVIVOR_STEPS):
            w.step()
        _references[key] = w.losses
    return _references[key]


@dataclass
class Answers:
    """What job threads heard after the canceller ended their job, and what went wrong."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    ended_by: dict[int, str] = field(default_factory=dict)  # job id -> "cancel" | "leave"
    cancelled: int = 0  # JobCancelled to a cancelled job
    unknown: int = 0  # UnknownJob to a cancelled job that had not left
    after_leave: int = 0  # InvalidArgument or UnknownJob after another thread's leave
    problems: list[str] = field(default_factory=list)

    def end(self, job: salus.Job, rng: random.Random) -> None:
        """Cancels (two times in three) or leaves `job` from this thread, noted first."""
        how = "leave" if rng.randrange(3) == 0 else "cancel"
        with self.lock:
            self.ended_by[job.id] = how
        if how == "cancel":
            job.cancel()
        else:
            job.leave()

    def heard(self, job: salus.Job, error: BaseException) -> None:
        with self.lock:
            how = self.ended_by.get(job.id)
            if how == "cancel" and isinstance(error, salus.JobCancelled):
                self.cancelled += 1
            elif how == "cancel" and isinstance(error, salus.UnknownJob):
                self.unknown += 1
                self.problems.append(f"{job.name}: UnknownJob after a cancel: {error}")
            elif how == "leave" and isinstance(error, (salus.InvalidArgument, salus.UnknownJob)):
                self.after_leave += 1
            else:
                self.problems.append(f"{job.name} (ended by {how}): {type(error).__name__}: "
                                     f"{error}")


@dataclass
class Victims:
    """The jobs the canceller may end, one per training thread at a time."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    live: dict[int, salus.Job] = field(default_factory=dict)  # slot -> its current job

    def pick(self, rng: random.Random) -> Optional[tuple[int, salus.Job]]:
        with self.lock:
            if not self.live:
                return None
            slot = rng.choice(sorted(self.live))
            return slot, self.live.pop(slot)  # each job is ended once


def loader(job: salus.Job, done: threading.Event, answers: Answers) -> None:
    """A helper thread allocating for the job, as a data loader would: several threads allocate
    for one job while another thread ends it."""
    kept: list[torch.Tensor] = []
    try:
        while not done.is_set():
            with job:
                kept.append(torch.empty(1 << (10 + len(kept) % 8)))
            if len(kept) > 6:
                kept.pop(0)
    except salus.Error as e:
        answers.heard(job, e)
    except Exception as e:  # noqa: BLE001  (a thread's exception would otherwise vanish)
        with answers.lock:
            answers.problems.append(f"{job.name} (loader): {type(e).__name__}: {e}")


def victim_loop(rt: salus.Runtime, slot: int, seed: int, victims: Victims, answers: Answers,
                stop: threading.Event) -> None:
    """Jobs that train until the canceller ends them, one after another. A canary tensor checks
    that the job's memory stays its own after the end, while its thread still computes."""
    kinds = ["cnn", "transformer", "lstm"]
    for n in range(1_000_000):
        if stop.is_set():
            return
        job = rt.add_job(f"victim{slot}.{n}")
        w: Optional[Workload] = None
        canary: Optional[torch.Tensor] = None
        done = threading.Event()
        loaders = [threading.Thread(target=loader, daemon=True, args=(job, done, answers))
                   for _ in range(LOADERS)]
        with victims.lock:
            victims.live[slot] = job
        for t in loaders:
            t.start()
        try:
            with job:
                canary = torch.full((1 << 14,), float(slot + 1))
                w = make(kinds[(slot + n) % len(kinds)], seed + n)
            while not stop.is_set():
                with job.iteration():
                    w.step()
        except salus.Error as e:
            answers.heard(job, e)
        except Exception as e:  # noqa: BLE001  (a thread's exception would otherwise vanish)
            with answers.lock:
                answers.problems.append(f"{job.name}: {type(e).__name__}: {e}")
        finally:
            with victims.lock:
                if victims.live.get(slot) is job:
                    del victims.live[slot]
            done.set()
            for t in loaders:
                t.join(timeout=JOIN_SECONDS)
            # numpy reads the tensor's memory without allocating through Salus.
            if canary is not None and not bool((canary.numpy() == float(slot + 1)).all()):
                with answers.lock:
                    answers.problems.append(f"{job.name}: its canary changed after its end")
            job.leave()
            del w, canary  # the tensors free their blocks here, after the job's end


def survivor(job: salus.Job, w: Workload, kind: str, out: dict[str, list[float]]) -> None:
    for _ in range(SURVIVOR_STEPS):
        with job.iteration():
            w.step()
    out[kind] = w.losses
    job.leave()


def canceller(victims: Victims, answers: Answers, rng: random.Random,
              survivors: list[threading.Thread], deadline: float) -> None:
    """Ends a random victim every few milliseconds until the survivors are done and the race has
    lasted RACE_SECONDS (or the deadline passed)."""
    start = time.monotonic()
    while time.monotonic() < deadline:
        if time.monotonic() - start > RACE_SECONDS and not any(t.is_alive() for t in survivors):
            return
        time.sleep(rng.uniform(0.002, 0.03))
        picked = victims.pick(rng)
        if picked is not None:
            answers.end(picked[1], rng)


def assert_nothing_left(rt: salus.Runtime, context: str,
                        glue_before: Optional[dict[str, int]] = None) -> None:
    """Every tensor gone: nothing allocated, and a fresh job gets the whole device. With
    `glue_before` (salus.torch's counters at the start) every block PyTorch got must have been
    freed first: what is still allocated then is Salus's leak, not a tensor the test kept."""
    gc.collect()
    if glue_before is not None:
        glue = salus_torch.counters()
        kept = (glue["allocations"] - glue_before["allocations"]) - (
            glue["frees"] - glue_before["frees"])
        assert kept == 0, f"{context}: the test still holds {kept} tensors' blocks"
    stats = rt.device_stats(0)
    assert stats.allocated == 0, f"{context}: {stats.allocated} bytes still allocated (leaked)"
    fresh = rt.add_job("fresh")
    try:
        ptr = fresh.allocate(stats.limit)
    except salus.OutOfMemory as e:
        pytest.fail(f"{context}: a fresh job cannot get the whole device: {e}")
    fresh.deallocate(ptr)
    fresh.leave()


@pytest.mark.parametrize("policy", POLICIES)
def test_training_survives_cancels_and_leaves_racing_it(policy: str) -> None:
    seed = seed_of_run()
    context = f"policy {policy}, SALUS_TEST_SEED={seed}"
    survivor_kinds = ["cnn", "lstm"]
    expected = {k: reference_losses(k, seed % 1000) for k in survivor_kinds}
    rt = salus.Runtime("sim", memory=DEVICE, policy=policy)
    salus_torch.enable(rt)
    glue_before = salus_torch.counters()
    try:
        victims, answers, stop = Victims(), Answers(), threading.Event()
        results: dict[str, list[float]] = {}
        # Built here, before any thread: make() seeds PyTorch's global generator, which the
        # victims' make() would race.
        survivor_jobs = {k: rt.add_job(f"survivor-{k}") for k in survivor_kinds}
        survivor_work = {}
        for kind, job in survivor_jobs.items():
            with job:
                survivor_work[kind] = make(kind, seed % 1000)
        workers = [threading.Thread(target=victim_loop, daemon=True,
                                    args=(rt, slot, seed, victims, answers, stop))
                   for slot in range(4)]
        survivors = [threading.Thread(target=survivor, daemon=True,
                                      args=(survivor_jobs[k], survivor_work[k], k, results))
                     for k in survivor_kinds]
        deadline = time.monotonic() + 40.0
        ending = threading.Thread(target=canceller, daemon=True, args=(
            victims, answers, random.Random(seed), survivors, deadline))
        for t in [*workers, *survivors, ending]:
            t.start()
        ending.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
        stop.set()
        for t in [*workers, *survivors, ending]:
            t.join(timeout=JOIN_SECONDS)
            assert not t.is_alive(), f"{context}: a thread hangs"
        assert not answers.problems, f"{context}: {answers.problems[:5]}"
        assert answers.unknown == 0
        assert answers.cancelled + answers.after_leave > 0, f"{context}: no job was ended"
        for kind in survivor_kinds:
            assert results.get(kind) == expected[kind], f"{context}: survivor {kind} is wrong"
        del survivor_work
        assert_nothing_left(rt, context, glue_before)
    finally:
        salus_torch.disable()
        rt.close()


def racing_allocator(job: salus.Job, rt: salus.Runtime, rng: random.Random, outlive: bool,
                     answers: Answers, start: threading.Barrier) -> None:
    """Allocates and frees on `job` until its end answers; with blocks_outlive_job then frees
    what it still holds (the blocks stay valid until their holder frees them)."""
    held: list[tuple[int, int]] = []
    start.wait()
    try:
        while True:
            nbytes = rng.randrange(512, 1 << 20)
            held.append((job.allocate(nbytes), nbytes))
            if len(held) > 4:
                ptr, _ = held.pop(rng.randrange(len(held)))
                job.deallocate(ptr)
    except salus.OutOfMemory:
        answers.problems.append(f"{job.name}: out of memory (a leak of earlier rounds?)")
    except salus.Error as e:
        answers.heard(job, e)
    if outlive:
        for ptr, nbytes in held:
            rt.deallocate(ptr, nbytes)


@pytest.mark.parametrize("outlive", [True, False], ids=["outlive", "release"])
def test_allocations_racing_a_cancel_leak_nothing(outlive: bool) -> None:
    """Six threads allocate on one job while another thread cancels it (issue 19's leak: an
    allocation that lost the race answered with an error, yet its block stayed allocated)."""
    seed = seed_of_run()
    rng = random.Random(seed)
    rt = salus.Runtime("sim", memory="64MiB", policy="fair")
    try:
        answers = Answers()
        for round_ in range(40):
            context = f"round {round_}, SALUS_TEST_SEED={seed}"
            job = rt.add_job(f"race{round_}", blocks_outlive_job=outlive)
            start = threading.Barrier(7)
            threads = [threading.Thread(target=racing_allocator, daemon=True, args=(
                job, rt, random.Random(rng.random()), outlive, answers, start))
                for _ in range(6)]
            for t in threads:
                t.start()
            start.wait()
            time.sleep(rng.uniform(0.0, 0.01))
            answers.end(job, rng)
            for t in threads:
                t.join(timeout=JOIN_SECONDS)
                assert not t.is_alive(), f"{context}: a racing thread hangs"
            job.leave()
            assert not answers.problems, f"{context}: {answers.problems[:5]}"
            allocated = rt.device_stats(0).allocated
            assert allocated == 0, f"{context}: {allocated} bytes leaked by allocations that lost"
        assert answers.unknown == 0
        assert_nothing_left(rt, f"SALUS_TEST_SEED={seed}")
    finally:
        rt.close()
