"""A PyTorch training script for the salusd tests: a small CNN on synthetic images, trained for
``--iterations`` steps from a fixed seed, in one of two modes: ``--socket PATH`` (a process of
salusd, with ``salus.connect``) or in-process (``salus.Runtime``). Writes a JSON file with when
each iteration ran and a checksum of the final weights, so that the test can check turns and that
training under salusd ends bitwise where it ends alone."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import time

import torch
from torch import nn

import salus
import salus.torch


def wait_until_waiting(socket: str, name: str) -> None:
    """Until salusd's status lists job ``name`` as waiting for its turn."""
    from salus.cli import salusd_binary
    deadline = time.monotonic() + 120
    while True:
        table = subprocess.run([salusd_binary(), "--socket", socket, "--status"],
                               capture_output=True, text=True, check=True).stdout
        if any(line.split()[:1] == [name] and "waiting" in line.split()
               for line in table.splitlines()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {name} never waited for a turn:\n{table}")
        time.sleep(0.005)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket")
    parser.add_argument("--name", default="cnn")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--priority", type=int, default=0)
    parser.add_argument("--out", required=True)
    parser.add_argument("--joined", help="a file made once the job is added")
    parser.add_argument("--wait-for", help="a file whose making starts the iterations")
    parser.add_argument("--begun", help="a file made once the first iteration has its turn")
    parser.add_argument("--first-holds-for",
                        help="a job whose turn the first iteration waits to be asked for "
                             "(the daemon's status says it waits), so that turns must alternate")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)

    runtime = salus.connect(args.socket) if args.socket else salus.Runtime("sim", memory="1GiB")
    salus.torch.enable(runtime)
    job = runtime.add_job(args.name, priority=args.priority)
    if args.joined:
        open(args.joined, "w").close()
    spans = []
    try:
        with job:
            model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                  nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        data = torch.randn(16, 3, 32, 32)
        labels = torch.randint(0, 10, (16,))
        while args.wait_for and not os.path.exists(args.wait_for):
            time.sleep(0.001)
        for i in range(args.iterations):
            with job.iteration():
                begun = time.monotonic()
                if i == 0 and args.begun:
                    open(args.begun, "w").close()
                if i == 0 and args.first_holds_for:
                    wait_until_waiting(args.socket, args.first_holds_for)
                loss = nn.functional.cross_entropy(model(data), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
                time.sleep(0.01)  # long enough for the other process to ask for its turn
                spans.append([begun, time.monotonic()])
        digest = hashlib.sha256()
        for p in model.parameters():
            digest.update(p.detach().numpy().tobytes())
        result = {"spans": spans, "weights": digest.hexdigest(), "error": None}
    except salus.Error as e:
        result = {"spans": spans, "weights": None, "error": type(e).__name__, "message": str(e)}
    with open(args.out, "w") as f:
        json.dump(result, f)
    salus.torch.disable()
    job.leave()
    runtime.close()


if __name__ == "__main__":
    main()
