"""A small transformer encoder classifying token sequences: a PyTorch training script that knows
nothing of Salus (see train_cnn.py for how salus-bench runs it and what ``--log`` holds)."""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
from torch import nn

VOCAB = 256


class SmallTransformer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        layer = nn.TransformerEncoderLayer(width, nhead=4, dim_feedforward=2 * width,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(width, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


def batch(gen: torch.Generator, size: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The class is the quarter of the vocabulary the first half of the sequence is drawn from."""
    labels = torch.randint(0, 4, (size,), generator=gen)
    tokens = torch.randint(0, VOCAB, (size, length), generator=gen)
    biased = torch.randint(0, VOCAB // 4, (size, length // 2), generator=gen)
    tokens[:, : length // 2] = biased + (labels * (VOCAB // 4))[:, None]
    return tokens, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--load-ms", type=float, default=0.0,
                        help="milliseconds each batch takes to load (an input pipeline that "
                             "reads from storage, in the training loop's thread)")
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = SmallTransformer(args.width)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    steps, losses = [], []
    for _ in range(args.steps):
        began = time.time()
        time.sleep(args.load_ms / 1000.0)
        tokens, labels = batch(gen, args.batch, args.length)
        loss = loss_fn(model(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        steps.append((began, time.time()))
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    with open(args.log, "w") as f:
        json.dump({"steps": steps, "losses": losses, "weights": digest.hexdigest()}, f)


if __name__ == "__main__":
    main()
