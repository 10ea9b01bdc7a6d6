"""Shared fixtures: runtimes on the simulated backend, with PyTorch routed through Salus."""

from __future__ import annotations

from typing import Iterator

import pytest

import salus

torch = pytest.importorskip("torch")
import salus.torch as salus_torch  # noqa: E402

# One intra-op thread: the job threads are the parallelism, and results stay bitwise repeatable.
torch.set_num_threads(1)


@pytest.fixture
def runtime() -> Iterator[salus.Runtime]:
    """A 1 GiB simulated GPU under "fair", no torch glue."""
    rt = salus.Runtime("sim", memory="1GiB", policy="fair")
    yield rt
    rt.close()


def make_torch_runtime(policy: str = "fair", memory: str = "2GiB") -> salus.Runtime:
    rt = salus.Runtime("sim", memory=memory, policy=policy)
    salus_torch.enable(rt)
    return rt


@pytest.fixture
def torch_runtime() -> Iterator[salus.Runtime]:
    """A simulated GPU with PyTorch's CPU allocations going through it."""
    rt = make_torch_runtime()
    try:
        yield rt
    finally:
        salus_torch.disable()
        rt.close()


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local Ray cluster (4 CPUs, no GPU) for one test module, stopped after it."""
    import os

    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # CI machines have no network
    from salus.ray import start_local

    start_local(num_cpus=4, num_gpus=0, include_dashboard=False, log_to_driver=False,
                configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
