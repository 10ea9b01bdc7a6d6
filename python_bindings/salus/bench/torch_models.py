"""Small seeded PyTorch models for ``torch`` mode: a CNN on images, a transformer encoder and an
LSTM language model on tokens. Imported only when that mode runs (it imports torch)."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

VOCAB = 128
Batch = Callable[[], tuple[torch.Tensor, torch.Tensor]]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(32 * 8 * 8, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class TinyTransformer(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=128, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


class LstmLm(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.lstm = nn.LSTM(dim, dim, num_layers=2, batch_first=True)
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.head(out)


def make_model(kind: str, gen: torch.Generator, *,
               inference: bool) -> tuple[nn.Module, Batch, Loss]:
    """The model (in eval mode for inference), a batch source drawing from ``gen``, its loss.
    Inference batches are smaller, as a served request's are."""
    batch_size = 4 if inference else 16

    def images() -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(batch_size, 3, 32, 32, generator=gen),
                torch.randint(0, 10, (batch_size,), generator=gen))

    def tokens() -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.randint(0, VOCAB, (max(1, batch_size // 2), 33), generator=gen)
        return seq[:, :-1], seq[:, 1:]

    def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                           targets.reshape(-1))

    model: nn.Module
    if kind == "cnn":
        model, batch, loss = SmallCnn(), images, nn.functional.cross_entropy
    elif kind == "transformer":
        model, batch, loss = TinyTransformer(), tokens, lm_loss
    elif kind == "lstm":
        model, batch, loss = LstmLm(), tokens, lm_loss
    else:
        raise ValueError(f"unknown torch model {kind!r}")
    return (model.eval() if inference else model), batch, loss


__all__ = ["make_model", "SmallCnn", "TinyTransformer", "LstmLm"]
