"""A training script that cannot fit: its step's activations alone are ``--bytes`` (more than
the device holds). Under `salus run` beside others it must fail alone, with salus.OutOfMemory."""

from __future__ import annotations

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Linear(256, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rows = max(1, args.bytes // (256 * 4))
    for _ in range(args.steps):
        out = model(torch.randn(rows, 256))  # the step's activations: --bytes of them
        optimizer.zero_grad()
        out.square().mean().backward()
        optimizer.step()


if __name__ == "__main__":
    main()
