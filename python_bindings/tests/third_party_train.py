"""A training script of models the project did not write (torchvision's MobileNetV3, a timm
ViT, Hugging Face GPT-2; small configurations, random weights, nothing downloaded) that knows
nothing of Salus: the `salus run` tests run it as it is. ``--steps`` AdamW steps on seeded
synthetic batches with every dropout off, then a digest of the final weights in ``--out``."""

from __future__ import annotations

import argparse
import hashlib
import json

import torch
from torch import nn

BATCH = 8


class Gpt2Lm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=2048, n_positions=64, n_embd=128, n_layer=3, n_head=4,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0)
        self.gpt2 = GPT2LMHeadModel(config)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.gpt2(input_ids=tokens).logits


def build(name: str) -> tuple[nn.Module, int]:
    """The model and its input size (0: tokens)."""
    if name == "mobilenet":
        import torchvision

        return torchvision.models.mobilenet_v3_small(num_classes=10, dropout=0.0), 64
    if name == "vit":
        import timm

        return timm.models.vision_transformer.VisionTransformer(
            img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4, num_classes=10), 32
    return Gpt2Lm(), 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=["mobilenet", "vit", "gpt2"], required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    model, size = build(args.model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(args.steps):
        if size:
            inputs = torch.randn(BATCH, 3, size, size, generator=gen)
            targets = torch.randint(0, 10, (BATCH,), generator=gen)
            loss = nn.functional.cross_entropy(model(inputs), targets)
        else:
            seq = torch.randint(0, 2048, (BATCH, 49), generator=gen)
            logits = model(seq[:, :-1])
            loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                               seq[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    with open(args.out, "w") as f:
        json.dump({"weights": digest.hexdigest(), "loss": loss.item()}, f)


if __name__ == "__main__":
    main()
