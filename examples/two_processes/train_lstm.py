#!/usr/bin/env python3
"""A plain PyTorch training script (an LSTM language model on random tokens). The two lines
marked "salus" make it one process of salusd, sharing the GPU with the other script here."""

import torch
from torch import nn

import salus.torch  # salus (1/2)

salus.torch.share("lstm")  # salus (2/2): connect, route memory, turns at optimizer steps

torch.manual_seed(1)
device = "cuda" if torch.cuda.is_available() else "cpu"


class LanguageModel(nn.Module):
    def __init__(self, vocab: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 64)
        self.lstm = nn.LSTM(64, 128, batch_first=True)
        self.head = nn.Linear(128, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0])


model = LanguageModel().to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
tokens = torch.randint(0, 256, (16, 33), device=device)
for step in range(30):
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 256), tokens[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(f"lstm step {step}: loss {loss.item():.3f}", flush=True)
print("lstm done", flush=True)
