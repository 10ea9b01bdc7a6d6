"""A script for `salus run` that knows of Salus: it marks its own iterations. ``--mode``:
``training`` marks each step with ``salus.iteration()`` (its marks replace the optimizer steps');
``requests`` is an inference script that marks each request; ``long`` is an inference script that
marks nothing."""

from __future__ import annotations

import argparse

import torch
from torch import nn

import salus


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["training", "requests", "long"], required=True)
    parser.add_argument("--count", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    data = torch.randn(8, 64)
    if args.mode == "training":
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(args.count):
            with salus.iteration():
                opt.zero_grad()
                model(data).sum().backward()
                opt.step()
        return
    with torch.no_grad():
        for _ in range(args.count):
            if args.mode == "requests":
                with salus.iteration():
                    model(data)
            else:
                model(data)


if __name__ == "__main__":
    main()
