#!/usr/bin/env python3
"""Real PyTorch jobs sharing one GPU through Salus.

Three training jobs (a small CNN on synthetic images, a small transformer encoder, an LSTM
language model) and one inference service (a CNN in eval mode) run in their own threads and share
one GPU at iteration granularity, under the scheduling policy given on the command line::

    python examples/pytorch_sharing.py --policy priority --iterations 40

The only changes a training loop needs: build the model inside ``with job:`` (its weights and
optimizer state are the job's persistent memory), and run each step inside
``with job.iteration():`` (it waits for the job's turn; what it allocates is ephemeral).

Where there is no GPU the device is simulated: ``salus.torch.enable`` makes CPU tensors live in
Salus's simulated GPU memory, so scheduling and memory accounting are those of a GPU while the
arithmetic runs on the CPU. Where there is one (backend "auto"), the models and batches move to
CUDA, and PyTorch's CUDA allocations go through Salus.

It prints, per job, what it got (GPU time, time spent waiting for turns) and what it needed
(persistent bytes, ephemeral peak): the memory each job would need on a GPU of its own, against
the peak the shared GPU actually held. The Perfetto trace (https://ui.perfetto.dev) shows every
job's iterations on the GPU's lane.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

import salus
import salus.torch

POLICIES = ("fair", "priority", "fifo", "pack", "srtf", "memory_aware")
VOCAB = 256


# --- models ---------------------------------------------------------------------------------------

class SmallCNN(nn.Module):
    """Two convolutions and a classifier, for 3x32x32 images in 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(32 * 8 * 8, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class SmallTransformer(nn.Module):
    """A two-layer transformer encoder that classifies token sequences."""

    def __init__(self, d_model: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=4, dim_feedforward=128,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


class LstmLanguageModel(nn.Module):
    """Next-token prediction with one LSTM layer."""

    def __init__(self, embed: int = 64, hidden: int = 128) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, embed)
        self.lstm = nn.LSTM(embed, hidden, batch_first=True)
        self.out = nn.Linear(hidden, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.out(hidden)


# --- synthetic data (learnable, so the losses go down) --------------------------------------------

def image_batch(gen: torch.Generator, batch: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Noise plus a class-dependent brightness per channel."""
    labels = torch.randint(0, 10, (batch,), generator=gen)
    offsets = torch.stack([(labels % 3).float(), (labels // 3 % 2).float(), (labels // 6).float()],
                          dim=1)
    images = torch.randn(batch, 3, 32, 32, generator=gen) + offsets[:, :, None, None]
    return images, labels


def sequence_batch(gen: torch.Generator, batch: int = 16,
                   length: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens; the class is which quarter of the vocabulary is most frequent."""
    labels = torch.randint(0, 4, (batch,), generator=gen)
    tokens = torch.randint(0, VOCAB, (batch, length), generator=gen)
    biased = torch.randint(0, VOCAB // 4, (batch, length // 2), generator=gen)
    tokens[:, : length // 2] = biased + (labels * (VOCAB // 4))[:, None]
    return tokens, labels


def counting_batch(gen: torch.Generator, batch: int = 16, length: int = 35) -> torch.Tensor:
    """Sequences that count up by a per-sequence step: the next token is predictable."""
    start = torch.randint(0, VOCAB, (batch, 1), generator=gen)
    step = torch.randint(1, 4, (batch, 1), generator=gen)
    return (start + step * torch.arange(length + 1)) % VOCAB


# --- jobs -----------------------------------------------------------------------------------------

@dataclass
class Outcome:
    name: str
    first_loss: Optional[float] = None
    last_loss: Optional[float] = None
    requests: int = 0
    error: Optional[BaseException] = None
    losses: list[float] = field(default_factory=list)


StepFn = Callable[[torch.Generator], torch.Tensor]


def make_trainer(name: str, device: torch.device) -> tuple[nn.Module, StepFn, float]:
    """The model, one training step (returns the loss) and the learning rate for the job called
    ``name``."""
    loss_fn = nn.CrossEntropyLoss()
    lr = 1e-3
    if name == "cnn":
        model = SmallCNN().to(device)

        def step(gen: torch.Generator) -> torch.Tensor:
            images, labels = image_batch(gen)
            return loss_fn(model(images.to(device)), labels.to(device))
    elif name == "transformer":
        model = SmallTransformer().to(device)

        def step(gen: torch.Generator) -> torch.Tensor:
            tokens, labels = sequence_batch(gen)
            return loss_fn(model(tokens.to(device)), labels.to(device))
    elif name == "lstm-lm":
        model = LstmLanguageModel().to(device)
        lr = 1e-2

        def step(gen: torch.Generator) -> torch.Tensor:
            seq = counting_batch(gen).to(device)
            logits = model(seq[:, :-1])
            return loss_fn(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
    else:
        raise ValueError(f"unknown training job {name!r}")
    return model, step, lr


# On the simulated backend the arithmetic runs on the CPU, in the job's thread, and takes no GPU
# time. Each step therefore also enqueues a simulated kernel standing for its GPU work: seconds
# alone and occupancy (the share of the GPU it keeps busy), plausible magnitudes for these small
# models at these batch sizes on a data-center GPU, not measurements. Kernels of jobs that run at
# once share the simulated GPU as its contention model says (processor sharing), so the GPU time
# printed below is the same quantity the C++ demo and salus-bench report.
SIMULATED_STEP = {
    "cnn": (0.006, 0.5),
    "transformer": (0.010, 0.7),
    "lstm-lm": (0.008, 0.4),
    "cnn-serve": (0.002, 0.3),
}


def simulate_gpu_work(job: salus.Job, device: torch.device) -> None:
    """On the simulated GPU: the step's GPU work, waited for (as reading a result waits)."""
    if device.type == "cpu":
        job.sim_kernel(*SIMULATED_STEP[job.name])
        job.synchronize()


class Crew:
    """What the job threads share: a start line, and how many trainers are still at work."""

    def __init__(self, trainers: int) -> None:
        # Building the models takes a while (and the GIL): the jobs start iterating together, or
        # the first one ready gets a head start (and under "fair", waits for the others later).
        self.start = threading.Barrier(trainers + 1)
        # torch.manual_seed seeds one generator for the whole process: models are built one at a
        # time, so that each job's initial weights depend on its seed only.
        self.build = threading.Lock()
        self._lock = threading.Lock()
        self._trainers = trainers

    def trainer_done(self) -> None:
        with self._lock:
            self._trainers -= 1

    def training(self) -> bool:
        with self._lock:
            return self._trainers > 0


def train(job: salus.Job, device: torch.device, iterations: int, seed: int, crew: Crew,
          outcome: Outcome) -> None:
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(seed)
        with job, crew.build:  # the weights and the optimizer are persistent
            torch.manual_seed(seed)
            model, step, lr = make_trainer(job.name, device)
            optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        if device.type == "cuda":
            torch.cuda.synchronize()  # the weights are ready before the job's stream reads them
        model.train()
        crew.start.wait()
        for _ in range(iterations):
            with job.iteration():  # waits for the job's turn; allocations here are ephemeral
                loss = step(gen)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                value = loss.item()  # waits for the GPU: the iteration covers the job's work
                simulate_gpu_work(job, device)
            outcome.losses.append(value)
        outcome.first_loss, outcome.last_loss = outcome.losses[0], outcome.losses[-1]
    except BaseException as e:  # noqa: BLE001 (reported by main)
        crew.start.abort()
        outcome.error = e
    finally:
        job.leave()  # frees the job's memory, lets the others use the room
        crew.trainer_done()


def serve(job: salus.Job, device: torch.device, seed: int, interval: float, max_requests: int,
          crew: Crew, outcome: Outcome) -> None:
    """Answers a request every ``interval`` seconds while training jobs remain, at most
    ``max_requests`` (under a run-to-completion policy such as fifo, the trainers queued behind
    the service only start once it leaves)."""
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(seed)
        with job, crew.build:
            torch.manual_seed(seed)
            model = SmallCNN().to(device).eval()
        if device.type == "cuda":
            torch.cuda.synchronize()
        crew.start.wait()
        while outcome.requests < max_requests and crew.training():
            images, _ = image_batch(gen, batch=8)
            with job.iteration(), torch.no_grad():
                model(images.to(device)).argmax(dim=1).cpu()  # the answer goes back to the host
                simulate_gpu_work(job, device)
            outcome.requests += 1
            time.sleep(interval)
    except BaseException as e:  # noqa: BLE001
        crew.start.abort()
        outcome.error = e
    finally:
        job.leave()


# --- report ---------------------------------------------------------------------------------------

def mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.2f}"


def print_report(rt: salus.Runtime, outcomes: dict[str, Outcome], wall: float) -> None:
    header = (f"{'job':<12} {'kind':<9} {'iters':>5} {'GPU s':>7} {'wait s':>7} {'max wait':>8} "
              f"{'persist MiB':>11} {'eph peak MiB':>12} {'own GPU MiB':>11}  loss")
    print(header)
    print("-" * len(header))
    own_total = 0
    for s in rt.job_stats():
        # What the job would need on a GPU of its own: its weights and optimizer state plus the
        # peak of one iteration's temporaries (or its measured peak, if higher: the first
        # iteration also creates the optimizer state).
        own = max(s.persistent_bytes + s.ephemeral_peak_bytes, s.memory.peak)
        own_total += own
        o = outcomes.get(s.name)
        if o is not None and o.first_loss is not None:
            loss = f"{o.first_loss:.3f} -> {o.last_loss:.3f}"
        elif o is not None and o.requests:
            loss = f"({o.requests} request{'s' if o.requests != 1 else ''})"
        else:
            loss = ""
        print(f"{s.name:<12} {s.kind:<9} {s.iterations:>5} {s.attained_seconds:>7.2f} "
              f"{s.waiting_seconds:>7.2f} {s.max_wait_seconds:>8.3f} {mib(s.persistent_bytes):>11} "
              f"{mib(s.ephemeral_peak_bytes):>12} {mib(own):>11}  {loss}")
    dev = rt.device_stats(0)
    print()
    print(f"Each job on a GPU of its own would need {mib(own_total)} MiB in all; sharing one, "
          f"the GPU's peak was {mib(dev.peak_allocated)} MiB allocated "
          f"({mib(dev.peak_reserved)} MiB reserved).")
    print(f"Wall time {wall:.1f} s.")


# --- main -----------------------------------------------------------------------------------------

def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Three PyTorch training jobs and an inference service sharing one GPU "
                    "through Salus.")
    parser.add_argument("--policy", choices=POLICIES, default="fair",
                        help="scheduling policy (default: fair)")
    parser.add_argument("--iterations", type=int, default=30,
                        help="training iterations per training job (default: 30)")
    parser.add_argument("--trace", default="salus_pytorch_trace.json",
                        help="Perfetto trace output (default: salus_pytorch_trace.json)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument("--backend", choices=("auto", "sim", "cuda"), default="auto",
                        help="auto: a real GPU where there is one, else a simulated one")
    parser.add_argument("--memory", default="2GiB",
                        help="memory of the simulated GPU (default: 2GiB)")
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error("--iterations must be at least 1")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    # Before any CUDA work: on a GPU, PyTorch's CUDA allocator must be Salus from the start.
    rt = salus.Runtime(args.backend, memory=args.memory, policy=args.policy)
    salus.torch.enable(rt)
    device = torch.device("cuda", 0) if rt.backend_name == "cuda" else torch.device("cpu")
    print(f"Salus: policy {rt.policy} on the {rt.backend_name} backend "
          f"({'GPU 0' if device.type == 'cuda' else 'simulated GPU, compute on the CPU'}), "
          f"{args.iterations} iterations per training job")

    trainers = ("cnn", "transformer", "lstm-lm")
    crew = Crew(len(trainers))
    outcomes: dict[str, Outcome] = {}
    threads: list[threading.Thread] = []
    for i, name in enumerate(trainers):
        job = rt.add_job(name, kind="training", expected_iterations=args.iterations)
        outcomes[name] = Outcome(name)
        threads.append(threading.Thread(
            target=train, name=name,
            args=(job, device, args.iterations, args.seed + i, crew, outcomes[name])))
    service = rt.add_job("cnn-serve", kind="inference", priority=10)
    outcomes["cnn-serve"] = Outcome("cnn-serve")
    threads.append(threading.Thread(
        target=serve, name="cnn-serve",
        args=(service, device, args.seed + 100, 0.01, 4 * args.iterations, crew,
              outcomes["cnn-serve"])))

    start = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - start
        failed = [o for o in outcomes.values() if o.error is not None]
        for o in failed:
            print(f"job {o.name} failed: {type(o.error).__name__}: {o.error}", file=sys.stderr)
        print()
        print_report(rt, outcomes, wall)
        rt.write_trace(args.trace)
        print(f"Trace: {args.trace} (open it in https://ui.perfetto.dev)")
        return 1 if failed else 0
    finally:
        gc.collect()  # tensors held in reference cycles go back to Salus before it closes
        salus.torch.disable()
        rt.close()


if __name__ == "__main__":
    sys.exit(main())
