"""An LSTM language model on counting sequences: a PyTorch training script that knows nothing of
Salus (see train_cnn.py for how salus-bench runs it and what ``--log`` holds)."""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
from torch import nn

VOCAB = 256


class LstmLanguageModel(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.lstm = nn.LSTM(width, 2 * width, batch_first=True)
        self.out = nn.Linear(2 * width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(tokens))
        return self.out(hidden)


def batch(gen: torch.Generator, size: int, length: int) -> torch.Tensor:
    """Sequences that count up by a step of their own: the next token is predictable."""
    start = torch.randint(0, VOCAB, (size, 1), generator=gen)
    step = torch.randint(1, 4, (size, 1), generator=gen)
    return (start + step * torch.arange(length + 1)) % VOCAB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=35)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--load-ms", type=float, default=0.0,
                        help="milliseconds each batch takes to load (an input pipeline that "
                             "reads from storage, in the training loop's thread)")
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = LstmLanguageModel(args.width)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    steps, losses = [], []
    for _ in range(args.steps):
        began = time.time()
        time.sleep(args.load_ms / 1000.0)
        seq = batch(gen, args.batch, args.length)
        logits = model(seq[:, :-1])
        loss = loss_fn(logits.reshape(-1, VOCAB), seq[:, 1:].reshape(-1))
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
