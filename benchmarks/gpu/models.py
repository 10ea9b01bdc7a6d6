"""The models the benchmark trains: random weights (no download: the GPU machine has no network),
synthetic batches from a fixed seed, built on the arm's device.

``build(name, size, device)`` returns the module and a function computing one batch's loss.
Sizes: "full" (the issue's: ResNet-18 at 224x224 batch 64, GPT-2 small at sequence 512 batch 8)
and "tiny" (the dry run's, on the CPU: ResNet-18 at 64x64 batch 4, GPT-2 with 2 layers of width 128
at sequence 64), as benchmarks/python/step_cost.py sizes them for the CPU.
"""
from __future__ import annotations

from typing import Any, Callable

from bench_common import BenchError

Loss = Callable[[], Any]


def build(name: str, size: str, device: str) -> tuple[Any, Loss, str]:
    """(module, loss of one batch, a description of the configuration)."""
    import torch

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    builders = {"resnet18": _torchvision, "resnet34": _torchvision, "mobilenet_v2": _torchvision,
                "gpt2": _gpt2, "cnn": _cnn}
    if name not in builders:
        raise BenchError(f"unknown model {name!r} (known: {', '.join(builders)})")
    return builders[name](name, size, device, gen)


def _torchvision(name: str, size: str, device: str, gen: Any) -> tuple[Any, Loss, str]:
    import torch
    import torchvision

    image, batch, classes = (224, 64, 1000) if size == "full" else (64, 4, 10)
    net = getattr(torchvision.models, name)(weights=None, num_classes=classes).to(device)
    x = torch.randn(batch, 3, image, image, generator=gen).to(device)
    y = torch.randint(0, classes, (batch,), generator=gen).to(device)
    return net, lambda: torch.nn.functional.cross_entropy(net(x), y), \
        f"{name} {image}x{image} batch {batch}"


def _gpt2(name: str, size: str, device: str, gen: Any) -> tuple[Any, Loss, str]:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    if size == "full":
        config = transformers.GPT2Config()  # GPT-2 small: 12 layers, width 768, 12 heads
        seq, batch = 512, 8
    else:
        config = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, n_positions=64,
                                         vocab_size=1000, bos_token_id=0, eos_token_id=0)
        seq, batch = 64, 4
    net: Any = transformers.GPT2LMHeadModel(config)
    net.to(device)  # a module moves in place
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
    return net, lambda: net(ids, labels=ids).loss, \
        f"GPT-2 {config.n_layer} layers width {config.n_embd}, seq {seq} batch {batch}"


def _cnn(name: str, size: str, device: str, gen: Any) -> tuple[Any, Loss, str]:
    """A small CNN on 32x32 images (the dry run's sharing jobs: torch alone, quick to import)."""
    import torch
    from torch import nn

    batch = 64 if size == "full" else 8
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(32 * 16 * 16, 10)).to(device)
    x = torch.randn(batch, 3, 32, 32, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    return net, lambda: nn.functional.cross_entropy(net(x), y), f"small CNN 32x32 batch {batch}"
