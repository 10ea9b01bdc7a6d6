#!/usr/bin/env python3
"""How much memory three third-party models need on one simulated GPU through Salus.

The models of python_bindings/tests/third_party.py (torchvision mobilenet_v3_small, a Hugging
Face GPT-2 and a timm ViT from small configs, batch 8, AdamW, random weights) train in threads,
each its own job, for ``--steps`` iterations. The script reports:

* each model's device peak alone (peak reserved bytes, one job on the device);
* the device peak of all three on one device under ``fair`` (one lane), and the sharing saving:
  the sum of the solo peaks over that shared peak;
* per policy, the smallest capacity (in whole 2 MiB pages) at which all three complete without an
  error, found by bisection between the largest solo peak and ``--ceiling``. Completion is assumed
  to be monotone in the capacity (more memory never makes a run fail).

It uses only the public Python API, so it runs against older builds of Salus too::

    .venv/bin/python benchmarks/python/third_party_capacity.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import torch

import salus
import salus.torch as salus_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python_bindings" / "tests"))
from third_party import MODELS, make  # noqa: E402

PAGE = 2 << 20
POLICIES = ("fifo", "srtf", "fair", "pack", "priority", "memory_aware")


def run(policy: str, memory: int, names: tuple[str, ...], steps: int) -> dict[str, Any]:
    """Trains `names` in threads on one simulated GPU of `memory` bytes; what happened."""
    rt = salus.Runtime("sim", memory=memory, policy=policy)
    salus_torch.enable(rt)
    errors: dict[str, str] = {}
    started = time.perf_counter()
    try:
        jobs, work = [], []
        for name in names:
            job = rt.add_job(name)
            try:
                with job:
                    work.append(make(name, 11))
            except salus.Error as e:
                errors[name] = f"{type(e).__name__}: {e}"
                job.leave()
                continue
            jobs.append(job)

        def train(job: salus.Job, w: Any) -> None:
            try:
                for _ in range(steps):
                    with job.iteration():
                        w.step()
            except Exception as e:  # noqa: BLE001 (reported)
                errors[job.name] = f"{type(e).__name__}: {e}"
            finally:
                job.leave()

        threads = [threading.Thread(target=train, args=(j, w)) for j, w in zip(jobs, work)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = rt.device_stats(0)
        return {"policy": policy, "memory": memory, "errors": errors,
                "peak_reserved": stats.peak_reserved, "peak_allocated": stats.peak_allocated,
                "seconds": time.perf_counter() - started}
    finally:
        salus_torch.disable()
        rt.close()


def smallest_capacity(policy: str, low: int, high: int, steps: int,
                      log: list[dict[str, Any]]) -> Optional[int]:
    """The least capacity in [low, high] (whole pages) at which every job completes."""
    lo, hi = low // PAGE, high // PAGE  # in pages; `hi` must complete, else None
    top = run(policy, hi * PAGE, MODELS, steps)
    log.append(top)
    if top["errors"]:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        result = run(policy, mid * PAGE, MODELS, steps)
        log.append(result)
        print(f"  {policy:12} {mid * 2:4} MiB: {'ok' if not result['errors'] else 'fails'}",
              file=sys.stderr)
        if result["errors"]:
            lo = mid + 1
        else:
            hi = mid
    return hi * PAGE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--ceiling", type=int, default=256, help="MiB searched up to")
    parser.add_argument("--policies", nargs="*", default=list(POLICIES))
    parser.add_argument("--json", type=Path, help="write everything measured here")
    args = parser.parse_args()
    torch.set_num_threads(1)

    generous = 512 << 20
    solo = {name: run("fair", generous, (name,), args.steps)["peak_reserved"] for name in MODELS}
    shared = run("fair", generous, MODELS, args.steps)
    print(f"salus {getattr(salus, '__version__', '?')}, torch {torch.__version__}")
    for name, peak in solo.items():
        print(f"solo peak {name:10} {peak / 2**20:6.1f} MiB")
    total = sum(solo.values())
    print(f"sum of solo peaks     {total / 2**20:6.1f} MiB")
    print(f"shared peak (fair)    {shared['peak_reserved'] / 2**20:6.1f} MiB"
          f"  saving {total / shared['peak_reserved']:.2f}x")
    log: list[dict[str, Any]] = []
    smallest = {}
    for policy in args.policies:
        found = smallest_capacity(policy, max(solo.values()), args.ceiling << 20, args.steps, log)
        smallest[policy] = found
        shown = f"{found >> 20} MiB" if found else f"none up to {args.ceiling} MiB"
        print(f"smallest capacity {policy:12} {shown}")
    if args.json:
        args.json.write_text(json.dumps({"solo": solo, "shared": shared, "smallest": smallest,
                                         "runs": log}, indent=1))


if __name__ == "__main__":
    main()
