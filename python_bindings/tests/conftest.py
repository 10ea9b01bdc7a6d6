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
