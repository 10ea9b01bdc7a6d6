#!/usr/bin/env python3
"""Record the allocation trace of a small PyTorch training loop (issue 10).

The loop runs on the CPU, seeded, with one intra-op thread, under
``torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True)``.
Each step is wrapped in ``torch.profiler.record_function("iteration")``.  The
profiler's Chrome trace holds one ``[memory]`` instant event per allocation or
free of the CPU allocator (``args["Addr"]``, ``args["Bytes"]``; a negative
``Bytes`` is a free), which this script turns into a compact text trace that
``benchmarks/trace_replay.cpp`` replays through ``salus::MemoryManager``.

Trace format (``.trace``, text, one event per line)::

    # comment lines start with '#'; the header names the model and the settings
    a <id> <bytes>    allocation of <bytes> bytes (> 0) that gets the id <id>
    f <id>            free of the allocation <id>
    i                 end of one training iteration (one line per iteration)
    s                 end of the setup (only with --setup; at most one, before any 'i')

Ids are dense integers 0, 1, 2, ... in allocation order; an address that is
reused after a free gets a new id.  Only events inside an iteration are kept,
and with ``--setup`` also those of the setup (building the model, its data and
optimizer, wrapped in ``record_function("setup")``): they come before the 's'
line and happen outside any iteration, so a replay makes them persistent, as a
job's weights are.  A free whose allocation was not seen (without ``--setup``:
memory allocated before the loop, such as the model's weights) is dropped, and
so is its pair; an allocation that is never freed lives to the end of the
trace.  Zero-byte allocations are dropped.

Examples::

    .venv/bin/python benchmarks/traces/record_alloc_trace.py --model lstm --steps 5
    .venv/bin/python benchmarks/traces/record_alloc_trace.py --model lstm_lm --steps 8 --setup
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

# The toy models of issue 10, then models at realistic training sizes (issue 19).
MODELS = (
    "cnn",
    "transformer",
    "lstm",
    "mlp",
    "lstm_lm",
    "lstm_lm_large",
    "resnet18",
    "vgg11",
    "gpt2",
)
ITERATION_LABEL = "iteration"
SETUP_LABEL = "setup"
VOCAB = 1000
LM_VOCAB = 10000  # the realistic language models' vocabulary (Penn Treebank's size)


@dataclass
class Workload:
    """A model, its optimizer, and a function that runs one training step."""

    model: nn.Module
    step: Callable[[], None]


class SmallCnn(nn.Module):
    """Two conv blocks and a classifier for 3x32x32 images."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Linear(64 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class TinyTransformer(nn.Module):
    """A two-layer nn.TransformerEncoder language model."""

    def __init__(self, d_model: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead=4, dim_feedforward=4 * d_model, dropout=0.1, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=layers)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


class LstmLm(nn.Module):
    """A two-layer LSTM language model (recurrent)."""

    def __init__(
        self, embed: int = 128, hidden: int = 256, layers: int = 2, vocab: int = VOCAB
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


DEFAULT_BATCH = {
    "cnn": 32,
    "transformer": 16,
    "lstm": 20,
    "mlp": 64,
    "lstm_lm": 32,
    "lstm_lm_large": 64,
    "resnet18": 32,
    "vgg11": 32,
    "gpt2": 16,
}
# Tokens per sample of the language models.
SEQ = {"transformer": 64, "lstm": 35, "lstm_lm": 35, "lstm_lm_large": 64, "gpt2": 128}
IMAGE = 64  # side of the realistic CNNs' images: small, so that recording stays quick


Logits = Callable[[nn.Module, torch.Tensor], torch.Tensor]


def language_model(name: str) -> tuple[nn.Module, int, Logits]:
    """A language model, its vocabulary, and how it turns tokens into logits."""
    if name == "transformer":
        return TinyTransformer(), VOCAB, lambda m, x: m(x)
    if name == "lstm":
        return LstmLm(), VOCAB, lambda m, x: m(x)
    if name == "lstm_lm":
        # A Penn Treebank-style word model, 2 x 512 (between Zaremba et al.'s small and medium).
        return LstmLm(embed=256, hidden=512, layers=2, vocab=LM_VOCAB), LM_VOCAB, lambda m, x: m(x)
    if name == "lstm_lm_large":
        return LstmLm(embed=512, hidden=1024, layers=2, vocab=LM_VOCAB), LM_VOCAB, lambda m, x: m(x)
    # gpt2: a 4-layer GPT-2 (d_model 512, 8 heads) from transformers, random weights.
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=LM_VOCAB,
        n_positions=SEQ["gpt2"],
        n_embd=512,
        n_layer=4,
        n_head=8,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config), LM_VOCAB, lambda m, x: m(input_ids=x).logits


def make_workload(name: str, batch: int) -> Workload:
    """Builds the model, synthetic data (`batch` samples) and optimizer of one workload."""
    loss_fn = nn.CrossEntropyLoss()
    if name == "cnn":
        model: nn.Module = SmallCnn()
        inputs = torch.randn(batch, 3, 32, 32)
        targets = torch.randint(0, 10, (batch,))
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=0.01, momentum=0.9
        )

        def loss() -> torch.Tensor:
            return loss_fn(model(inputs), targets)

    elif name == "mlp":
        model = nn.Sequential(
            nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10)
        )
        inputs = torch.randn(batch, 784)
        targets = torch.randint(0, 10, (batch,))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def loss() -> torch.Tensor:
            return loss_fn(model(inputs), targets)

    elif name in ("resnet18", "vgg11"):
        import torchvision

        model = getattr(torchvision.models, name)(num_classes=10)
        inputs = torch.randn(batch, 3, IMAGE, IMAGE)
        targets = torch.randint(0, 10, (batch,))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def loss() -> torch.Tensor:
            return loss_fn(model(inputs), targets)

    elif name in SEQ:
        model, vocab, logits = language_model(name)
        tokens = torch.randint(0, vocab, (batch, SEQ[name] + 1))
        inputs, targets = tokens[:, :-1], tokens[:, 1:].reshape(-1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

        def loss() -> torch.Tensor:
            return loss_fn(logits(model, inputs).reshape(-1, vocab), targets)

    else:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")

    model.train()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        value = loss()
        value.backward()
        optimizer.step()

    return Workload(model=model, step=step)


def profile_loop(build: Callable[[], Workload], steps: int, setup: bool) -> list[dict]:
    """Runs `steps` training steps under the profiler; returns the Chrome trace's events.

    With `setup`, building the workload is profiled too (inside a "setup" span)."""
    workload = None if setup else build()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if workload is None:
            with record_function(SETUP_LABEL):
                workload = build()
        for _ in range(steps):
            with record_function(ITERATION_LABEL):
                workload.step()
    fd, path = tempfile.mkstemp(suffix=".json", prefix="salus_alloc_trace_")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    finally:
        os.unlink(path)
    return data["traceEvents"] if isinstance(data, dict) else data


def spans(events: list[dict], label: str) -> list[tuple[float, float]]:
    """The (start, end) times of the profiler's `label` spans, in order."""
    return sorted(
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("name") == label and e.get("ph") == "X"
    )


def to_trace(events: Iterable[dict]) -> tuple[list[str], dict[str, int]]:
    """Converts profiler events to trace lines; also returns counts of what was dropped.

    Events of a "setup" span, when there is one, come first, ended by an 's' line."""
    events = list(events)
    iterations = spans(events, ITERATION_LABEL)
    setup = spans(events, SETUP_LABEL)
    memory = sorted(
        (e for e in events if e.get("name") == "[memory]"),
        key=lambda e: (float(e["ts"]), int(e["args"].get("Ev Idx", 0))),
    )
    stats = {"unmatched_frees": 0, "zero_byte": 0, "outside": 0, "readdressed": 0}
    # Pass 1: pair allocations with frees, inside the iterations only.
    records: list[tuple[int, str, int, int]] = []  # (iteration, kind, key, bytes)
    live_at: dict[int, int] = {}  # address -> key of the allocation live there
    next_key = 0
    it = 0
    for event in memory:
        ts = float(event["ts"])
        while it < len(iterations) and ts > iterations[it][1]:
            it += 1
        if setup and setup[0][0] <= ts <= setup[0][1]:
            phase = -1  # the setup: before the first iteration
        elif it == len(iterations) or ts < iterations[it][0]:
            stats["outside"] += 1
            continue
        else:
            phase = it
        addr = int(event["args"]["Addr"])
        size = int(event["args"]["Bytes"])
        if size > 0:
            if addr in live_at:  # not freed as far as the profiler saw: leave it live
                stats["readdressed"] += 1
            live_at[addr] = next_key
            records.append((phase, "a", next_key, size))
            next_key += 1
        elif size < 0:
            key = live_at.pop(addr, None)
            if key is None:
                stats["unmatched_frees"] += 1
                continue
            records.append((phase, "f", key, -size))
        else:
            stats["zero_byte"] += 1
    # Pass 2: dense ids in allocation order, iteration ends as 'i' lines.
    lines: list[str] = []
    ids: dict[int, int] = {}
    current = -1 if setup else 0
    for iteration, kind, key, size in records:
        if current == -1 and iteration >= 0:
            lines.append("s")
            current = 0
        while current < iteration:
            lines.append("i")
            current += 1
        if kind == "a":
            ids[key] = len(ids)
            lines.append(f"a {ids[key]} {size}")
        else:
            lines.append(f"f {ids[key]}")
    if current == -1:
        lines.append("s")
        current = 0
    while current < len(iterations):
        lines.append("i")
        current += 1
    return lines, stats


def peak_live(lines: Iterable[str]) -> int:
    """Peak of the sum of requested bytes live at once."""
    sizes: dict[str, int] = {}
    live = peak = 0
    for line in lines:
        parts = line.split()
        if parts[0] == "a":
            sizes[parts[1]] = int(parts[2])
            live += int(parts[2])
            peak = max(peak, live)
        elif parts[0] == "f":
            live -= sizes.pop(parts[1])
    return peak


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--steps", type=int, default=5, help="training steps to record")
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        help="samples per step (default: "
        + ", ".join(f"{m} {b}" for m, b in DEFAULT_BATCH.items())
        + ")",
    )
    parser.add_argument(
        "--setup",
        action="store_true",
        help="also record building the model, data and optimizer, before an 's' line "
        "(persistent in a replay, as a job's weights are)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="trace file (default: benchmarks/traces/<model>.trace next to this script)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.batch is None:
        args.batch = DEFAULT_BATCH[args.model]
    elif args.batch < 1:
        parser.error("--batch must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # one thread: a deterministic, single-stream event order
    events = profile_loop(lambda: make_workload(args.model, args.batch), args.steps, args.setup)
    lines, stats = to_trace(events)
    output = args.output or Path(__file__).resolve().parent / f"{args.model}.trace"
    allocations = sum(1 for line in lines if line.startswith("a "))
    frees = sum(1 for line in lines if line.startswith("f "))
    header = [
        "# salus allocation trace v1 (benchmarks/traces/record_alloc_trace.py)",
        "# format: 'a <id> <bytes>' allocate, 'f <id>' free, 'i' end of iteration"
        + (", 's' end of setup" if args.setup else ""),
        f"# model={args.model} batch={args.batch} steps={args.steps} seed={args.seed} "
        + ("setup=1 " if args.setup else "")
        + f"torch={torch.__version__} device=cpu threads=1",
        f"# allocations={allocations} frees={frees} peak_live_bytes={peak_live(lines)}",
        f"# dropped: unmatched_frees={stats['unmatched_frees']} "
        f"zero_byte={stats['zero_byte']} outside_iterations={stats['outside']} "
        f"readdressed={stats['readdressed']}",
    ]
    output.write_text("\n".join(header + lines) + "\n", encoding="utf-8")
    print(
        f"{output}: {allocations} allocations, {frees} frees, {args.steps} iterations, "
        f"peak live {peak_live(lines)} B, {output.stat().st_size} bytes on disk"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
