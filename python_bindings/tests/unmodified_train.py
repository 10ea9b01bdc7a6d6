"""A PyTorch training script that knows nothing of Salus (the `salus run` tests run it as it is):
one of three small models on synthetic data from a fixed seed, ``--steps`` optimizer steps, then
a checksum of the final weights in ``--out`` (JSON)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
from torch import nn


def model_named(name: str) -> nn.Module:
    if name == "cnn":
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    return nn.Sequential(nn.Conv2d(3, 4, 5, stride=2), nn.Tanh(), nn.Flatten(),
                         nn.Linear(4 * 14 * 14, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["cnn", "mlp", "small"], default="cnn")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)
    parser.add_argument("--wait-for", help="start training once this file exists (the data is "
                                           "ready): lets a test start several scripts together")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    model = model_named(args.model).to(args.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.randn(16, 3, 32, 32).to(args.device)
    labels = torch.randint(0, 10, (16,)).to(args.device)
    while args.wait_for and not os.path.exists(args.wait_for):
        time.sleep(0.01)
    for _ in range(args.steps):
        time.sleep(0.01)  # the next batch "loads"
        loss = nn.functional.cross_entropy(model(data), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().numpy().tobytes())
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    with open(args.out, "w") as f:
        json.dump({"weights": digest.hexdigest(), "param_bytes": params}, f)


if __name__ == "__main__":
    main()
