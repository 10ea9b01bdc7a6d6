#!/usr/bin/env python3
"""A plain PyTorch training script (a small CNN on synthetic images). The two lines marked
"salus" make it one process of salusd, sharing the GPU with the other script of this folder."""

import torch
from torch import nn

import salus.torch  # salus (1/2)

salus.torch.share("cnn")  # salus (2/2): connect, route memory, turns at optimizer steps

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Flatten(), nn.Linear(32 * 8 * 8, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
images, labels = torch.randn(64, 3, 32, 32, device=device), torch.randint(0, 10, (64,), device=device)
for step in range(30):
    loss = nn.functional.cross_entropy(model(images), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"cnn step {step}: loss {loss.item():.3f}", flush=True)
print("cnn done", flush=True)
