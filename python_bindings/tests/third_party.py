"""Models the project did not write: torchvision, timm and Hugging Face transformers.

Each is built from a small configuration with random weights (nothing is downloaded), trained with
AdamW on a seeded batch source of its own, with every dropout off: jobs in threads share torch's
global generator, so a model that drew from it would not repeat bitwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from models import Workload

BATCH = 8
MODELS = ("mobilenet", "gpt2", "vit")


@dataclass
class ThirdPartyJob(Workload):
    """A workload of models.py, named, trained with AdamW in training mode."""

    name: str = ""

    def __post_init__(self) -> None:
        self.model.train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)


def _images(gen: torch.Generator, size: int,
            classes: int) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(BATCH, 3, size, size, generator=gen),
                torch.randint(0, classes, (BATCH,), generator=gen))
    return batch


class _Gpt2Lm(nn.Module):
    """GPT-2 (transformers) returning logits only."""

    def __init__(self) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=2048, n_positions=64, n_embd=128, n_layer=3, n_head=4,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0)
        self.gpt2 = GPT2LMHeadModel(config)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.gpt2(input_ids=tokens).logits


def _lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make(name: str, seed: int) -> ThirdPartyJob:
    """Builds `name` deterministically from `seed` (call it where its memory should live)."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    if name == "mobilenet":
        import torchvision

        model = torchvision.models.mobilenet_v3_small(num_classes=10, dropout=0.0)
        return ThirdPartyJob(model, _images(gen, 64, 10), nn.functional.cross_entropy, name=name)
    if name == "vit":
        import timm

        model = timm.models.vision_transformer.VisionTransformer(
            img_size=32, patch_size=4, embed_dim=128, depth=4, num_heads=4, num_classes=10)
        return ThirdPartyJob(model, _images(gen, 32, 10), nn.functional.cross_entropy, name=name)
    if name == "gpt2":
        def tokens() -> tuple[torch.Tensor, torch.Tensor]:
            seq = torch.randint(0, 2048, (BATCH, 49), generator=gen)
            return seq[:, :-1], seq[:, 1:]
        return ThirdPartyJob(_Gpt2Lm(), tokens, _lm_loss, name=name)
    raise ValueError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
