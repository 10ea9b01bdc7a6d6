"""A small CNN on synthetic images: a PyTorch training script that knows nothing of Salus.

salus-bench's ``unmodified_scripts`` experiment runs it (with its two siblings) as a user would,
alone, beside the others, and under ``salus run``. It logs what any training script logs: when
each step began and ended, the losses, and a digest of the final weights, here as JSON in
``--log``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(2 * width * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


def batch(gen: torch.Generator, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.randint(0, 10, (size,), generator=gen)
    offsets = torch.stack([(labels % 3).float(), (labels // 3 % 2).float(),
                           (labels // 6).float()], dim=1)
    return torch.randn(size, 3, 32, 32, generator=gen) + offsets[:, :, None, None], labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--load-ms", type=float, default=0.0,
                        help="milliseconds each batch takes to load (an input pipeline that "
                             "reads from storage, in the training loop's thread)")
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model = SmallCNN(args.width)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    steps, losses = [], []
    for _ in range(args.steps):
        began = time.time()
        time.sleep(args.load_ms / 1000.0)
        images, labels = batch(gen, args.batch)
        loss = loss_fn(model(images), labels)
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
