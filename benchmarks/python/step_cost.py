"""One arm of the real-model step benchmark (scripts/bench.sh runs every arm, alternating).

    python benchmarks/python/step_cost.py --model gpt2 --arm inprocess [--socket PATH]

Trains one model with random weights and prints one JSON line: the median step time of
``--steps`` steps after ``--warmup``, and what the timed steps cost the system, per step:

* ``futex``: futex system calls of the whole process (every thread), counted by the kernel's
  ``syscalls:sys_enter_futex`` tracepoint through ``perf_event_open``; null where the kernel
  refuses the counter (no tracefs, or perf_event_paranoid too high);
* ``syscalls``: every system call, the same way (``raw_syscalls:sys_enter``);
* ``voluntary_switches``: times a thread of the process blocked (``getrusage``), a count of
  sleeps and with them wake-ups;
* ``minor_faults``: pages the kernel had to fault in (``getrusage``);
* ``allocations``: blocks the Salus glue made (0 for the plain arm).

The arms: ``plain`` (PyTorch's own CPU allocator), ``inprocess`` (``salus.torch`` over a simulated
GPU of this process: every tensor a Salus block, each step one iteration of one job) and
``connected`` (the same, the runtime a client of the ``salusd`` at ``--socket``). The counters
open before anything is imported, so every thread the arm starts later is counted.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import struct
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Optional

_PERF_TYPE_TRACEPOINT = 2
_SYS_PERF_EVENT_OPEN = 298  # x86_64
_TRACEFS = "/sys/kernel/tracing/events"


class TracepointCounter:
    """A kernel tracepoint counted over this process and the threads it starts from now on."""

    def __init__(self, event: str) -> None:
        self.fd: Optional[int] = None
        try:
            with open(f"{_TRACEFS}/{event}/id") as f:
                config = int(f.read())
        except OSError:
            return
        # struct perf_event_attr (size 112): type, size, config, then the flag bits at offset 40:
        # disabled=0, inherit (bit 1), exclude_kernel/hv left 0 (tracepoints fire in the kernel).
        attr = bytearray(112)
        struct.pack_into("IIQ", attr, 0, _PERF_TYPE_TRACEPOINT, 112, config)
        struct.pack_into("Q", attr, 40, 1 << 1)
        libc = ctypes.CDLL(None, use_errno=True)
        buf = ctypes.create_string_buffer(bytes(attr), 112)
        fd = libc.syscall(_SYS_PERF_EVENT_OPEN, buf, 0, -1, -1, 0)
        if fd >= 0:
            self.fd = fd

    def read(self) -> Optional[int]:
        if self.fd is None:
            return None
        return struct.unpack("Q", os.read(self.fd, 8))[0]


# Opened before torch and salus start any thread (inherit counts only threads made later).
_FUTEX = TracepointCounter("syscalls/sys_enter_futex")
_SYSCALLS = TracepointCounter("raw_syscalls/sys_enter")

import torch  # noqa: E402

torch.set_num_threads(1)


def build(model: str) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    """The model (random weights) and a function computing one batch's loss with it."""
    gen = torch.Generator().manual_seed(1)
    if model == "resnet18":
        import torchvision
        net = torchvision.models.resnet18(num_classes=10)
        x = torch.randn(16, 3, 64, 64, generator=gen)
        y = torch.randint(0, 10, (16,), generator=gen)
        return net, lambda m: torch.nn.functional.cross_entropy(m(x), y)
    if model == "gpt2":
        import transformers
        transformers.logging.set_verbosity_error()
        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64,
                                         vocab_size=1000, bos_token_id=0, eos_token_id=0)
        net = transformers.GPT2LMHeadModel(config)
        ids = torch.randint(0, 1000, (8, 64), generator=gen)
        return net, lambda m: m(ids, labels=ids).loss
    if model == "vit":
        import timm
        net = timm.create_model("vit_tiny_patch16_224", img_size=64, num_classes=10)
        x = torch.randn(8, 3, 64, 64, generator=gen)
        y = torch.randint(0, 10, (8,), generator=gen)
        return net, lambda m: torch.nn.functional.cross_entropy(m(x), y)
    raise SystemExit(f"unknown model '{model}' (resnet18, gpt2, vit)")


def run(model: str, arm: str, steps: int, warmup: int, socket: Optional[str]) -> dict[str, Any]:
    torch.manual_seed(0)
    runtime: Any = None
    job: Any = None
    if arm != "plain":
        import salus
        import salus.torch as salus_torch
        runtime = salus.connect(socket) if arm == "connected" else salus.Runtime(
            "sim", memory="4GiB")
        salus_torch.enable(runtime)
        job = runtime.add_job(f"{model}-step")
    with job if job is not None else nullcontext():
        net, loss_of = build(model)
        optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3)

    def iteration() -> ContextManager[Any]:
        return job.iteration() if job is not None else nullcontext()

    def step() -> None:
        with iteration():
            optimizer.zero_grad(set_to_none=True)
            loss_of(net).backward()
            optimizer.step()

    for _ in range(warmup):
        step()
    allocations = _allocations(arm)
    futex, syscalls = _FUTEX.read(), _SYSCALLS.read()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    after = resource.getrusage(resource.RUSAGE_SELF)
    futex_after, syscalls_after = _FUTEX.read(), _SYSCALLS.read()

    def per_step(before: Optional[int], now: Optional[int]) -> Optional[float]:
        return None if before is None or now is None else (now - before) / steps

    out = {
        "model": model,
        "arm": arm,
        "median_ms": statistics.median(times) * 1e3,
        "futex": per_step(futex, futex_after),
        "syscalls": per_step(syscalls, syscalls_after),
        "voluntary_switches": (after.ru_nvcsw - usage.ru_nvcsw) / steps,
        "minor_faults": (after.ru_minflt - usage.ru_minflt) / steps,
        "allocations": (_allocations(arm) - allocations) / steps,
    }
    if job is not None:
        job.leave()
        import salus.torch as salus_torch
        salus_torch.disable()
        runtime.close()
    return out


def _allocations(arm: str) -> int:
    if arm == "plain":
        return 0
    import salus.torch as salus_torch
    return int(salus_torch.counters()["allocations"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, choices=["resnet18", "gpt2", "vit"])
    parser.add_argument("--arm", required=True, choices=["plain", "inprocess", "connected"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--socket", help="the salusd of the connected arm")
    args = parser.parse_args()
    if args.arm == "connected" and not args.socket:
        parser.error("--arm connected needs --socket")
    print(json.dumps(run(args.model, args.arm, args.steps, args.warmup, args.socket)), flush=True)


if __name__ == "__main__":
    main()
