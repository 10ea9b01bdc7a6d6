"""The CUDA half of salus.torch around an iteration, checked without a GPU: torch.cuda's stream
calls are stood in for, and the test looks at what the glue asks of them (issue 20, item 7)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch")

import salus.torch as salus_torch  # noqa: E402


class FakeStream:
    def __init__(self, name: str) -> None:
        self.name = name
        self.waited_for: list[str] = []

    def wait_stream(self, other: "FakeStream") -> None:
        self.waited_for.append(other.name)


def test_the_job_stream_and_the_previous_one_wait_for_each_other(monkeypatch) -> None:
    previous = FakeStream("previous")
    job_stream = FakeStream("job")
    switches: list[tuple[str, str]] = []

    class StreamContext:
        def __init__(self, stream: FakeStream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            switches.append(("enter", self.stream.name))

        def __exit__(self, *exc: object) -> None:
            switches.append(("exit", self.stream.name))

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: previous)
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device=None: job_stream)
    monkeypatch.setattr(torch.cuda, "stream", StreamContext)
    monkeypatch.setattr(salus_torch, "_mode", "cuda")
    it = types.SimpleNamespace(stream=0x1234, _job=types.SimpleNamespace(device=0))
    hooks = salus_torch._TorchHooks()  # what salus.torch installs into the core

    hooks.enter_iteration(it)
    assert switches == [("enter", "job")]
    assert job_stream.waited_for == ["previous"], "the iteration may read inputs still in flight"
    assert previous.waited_for == []

    hooks.exit_iteration(it)
    assert switches == [("enter", "job"), ("exit", "job")]
    assert previous.waited_for == ["job"], "work after the iteration may read unfinished results"
    hooks.exit_iteration(it)  # a second exit does nothing
    assert previous.waited_for == ["job"]
