"""Overhead of Salus under PyTorch, side by side in one run (pytest-benchmark).

    .venv/bin/python -m pytest benchmarks/python --benchmark-only --benchmark-group-by=group

* ``cnn_step``: one training step of a small CNN (batch 32, 3x32x32, Adam) with PyTorch's own CPU
  allocator, then through Salus on the simulated backend (every tensor a Salus block, the step
  inside ``with job.iteration()``), then the same in a process connected to a ``salusd`` of its
  own (``salus.connect``: every iteration asks the daemon for its turn; pages come from the
  daemon). The ratios of medians are the overheads.
* ``iteration``: the Python cost of one empty ``with job.iteration()`` with no contention.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

torch = pytest.importorskip("torch")
import salus  # noqa: E402
import salus.torch as salus_torch  # noqa: E402
from salus.cli import ensure_daemon, salusd_binary, stop_daemon  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_bindings" / "tests"))
from models import make  # noqa: E402

torch.set_num_threads(1)


def cnn_batch32() -> Any:
    w = make("cnn", seed=0)
    gen = torch.Generator().manual_seed(1)
    w.batch = lambda: (torch.randn(32, 3, 32, 32, generator=gen),  # type: ignore[method-assign]
                       torch.randint(0, 10, (32,), generator=gen))
    return w


@contextmanager
def bench_job(rt: salus.Runtime) -> Iterator[salus.Job]:
    """A job of ``rt`` with PyTorch's memory routed through it; undone after."""
    salus_torch.enable(rt)
    job = rt.add_job("bench")
    try:
        yield job
    finally:
        job.leave()
        salus_torch.disable()
        rt.close()


@pytest.fixture
def salus_job() -> Iterator[salus.Job]:
    with bench_job(salus.Runtime("sim", memory="2GiB", policy="fair")) as job:
        yield job


@pytest.mark.benchmark(group="cnn_step")
def test_cnn_step_pytorch_allocator(benchmark: Any) -> None:
    w = cnn_batch32()
    for _ in range(3):
        w.step()
    benchmark.pedantic(w.step, rounds=60, warmup_rounds=5)


def bench_steps_of(benchmark: Any, job: salus.Job) -> None:
    """Times the CNN step as an iteration of ``job`` (its weights the job's persistent memory)."""
    with job:
        w = cnn_batch32()

    def step() -> None:
        with job.iteration():
            w.step()

    for _ in range(3):
        step()
    benchmark.pedantic(step, rounds=60, warmup_rounds=5)
    assert salus_torch.counters()["allocations"] > 0


@pytest.mark.benchmark(group="cnn_step")
def test_cnn_step_through_salus(benchmark: Any, salus_job: salus.Job) -> None:
    bench_steps_of(benchmark, salus_job)


@pytest.fixture
def client_job() -> Iterator[salus.Job]:
    """A job of this process as a client of a salusd of its own (simulated, 2 GiB)."""
    try:
        salusd_binary()
    except salus.DeviceError:
        pytest.skip("salusd is not installed beside this Python")
    tmp = tempfile.mkdtemp()
    socket = os.path.join(tmp, "salusd.sock")
    ensure_daemon(socket, ["--backend", "sim", "--memory", "2GiB", "--policy", "fair",
                           "--log-level", "warn"])
    try:
        with bench_job(salus.connect(socket)) as job:
            yield job
    finally:
        stop_daemon(socket)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.benchmark(group="cnn_step")
def test_cnn_step_in_a_salusd_client(benchmark: Any, client_job: salus.Job) -> None:
    bench_steps_of(benchmark, client_job)


@pytest.mark.benchmark(group="iteration")
def test_empty_iteration(benchmark: Any) -> None:
    rt = salus.Runtime("sim", memory="256MiB", policy="fair")
    job = rt.add_job("empty")

    def iteration() -> None:
        with job.iteration():
            pass

    benchmark(iteration)
    job.leave()
    rt.close()
