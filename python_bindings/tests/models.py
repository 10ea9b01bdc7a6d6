"""Small seeded PyTorch workloads for the tests: a CNN, a transformer encoder, an LSTM LM."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

# The models are the harness's (salus-bench torch mode): one definition of each.
from salus.bench.torch_models import LstmLm, SmallCnn, TinyTransformer


@dataclass
class Workload:
    """A model, its optimizer and a seeded batch source; step() runs one training step."""

    model: nn.Module
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: torch.optim.Optimizer = field(init=False)
    losses: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)

    def step(self) -> float:
        inputs, targets = self.batch()
        loss = self.loss_fn(self.model(inputs), targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        value = float(loss.item())
        self.losses.append(value)
        return value

    def parameters(self) -> list[torch.Tensor]:
        return [p.detach().clone() for p in self.model.parameters()]


def make(kind: str, seed: int) -> Workload:
    """Builds a workload deterministically from `seed` (call where its memory should live)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    if kind == "cnn":
        def batch() -> tuple[torch.Tensor, torch.Tensor]:
            return (torch.randn(16, 3, 32, 32, generator=gen),
                    torch.randint(0, 10, (16,), generator=gen))
        return Workload(SmallCnn(), batch, nn.functional.cross_entropy)

    def tokens() -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.randint(0, 128, (8, 33), generator=gen)
        return seq[:, :-1], seq[:, 1:]

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1))

    if kind == "transformer":
        return Workload(TinyTransformer(), tokens, lm_loss)
    if kind == "lstm":
        return Workload(LstmLm(), tokens, lm_loss)
    raise ValueError(f"unknown workload {kind!r}")
