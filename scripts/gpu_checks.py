#!/usr/bin/env python3
"""What a first run on a real GPU must show, one summary line per check (scripts/gpu_check.sh).

Each check runs in a fresh interpreter: ``salus.torch.enable`` must come before PyTorch
initializes CUDA, which a process does once. A check passes when its code exits 0 and prints
its detail line; it fails with the last line of its error. Checks that need what the machine
lacks (a second GPU) are skipped, and say so.

Usage: gpu_checks.py [NAME ...]   (default: every check). Exits 1 if any check failed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass

PRELUDE = """
import threading
import torch
import salus, salus.torch
"""


@dataclass(frozen=True)
class Check:
    name: str
    code: str
    needs_gpus: int = 1


# The training script of the two_processes check: alone (argv[1] "alone") or a process of the
# salusd at the socket argv[1]. Prints its weights' digest and its iterations' spans.
TWO_PROCESS_TRAINER = """
import hashlib, sys, time, torch
from torch import nn
import salus, salus.torch
mode, steps = sys.argv[1], 12
if mode != "alone":
    rt = salus.connect(mode)
    salus.torch.enable(rt)
    job = rt.add_job("trainer")
torch.manual_seed(0)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Flatten(),
                      nn.Linear(16 * 32 * 32, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
g = torch.Generator().manual_seed(1)
x = torch.randn(32, 3, 32, 32, generator=g).cuda()
y = torch.randint(0, 10, (32,), generator=g).cuda()
spans = []
for _ in range(steps):
    it = job.iteration() if mode != "alone" else None
    if it is not None:
        it.__enter__()
    t0 = time.monotonic()
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    torch.cuda.current_stream().synchronize()
    spans.append((t0, time.monotonic()))
    if it is not None:
        it.__exit__(None, None, None)
d = hashlib.sha256()
for p in model.parameters():
    d.update(p.detach().cpu().numpy().tobytes())
print(d.hexdigest(), ";".join(f"{a:.6f},{b:.6f}" for a, b in spans))
"""


CHECKS = [
    Check("kernels", """
        # PyTorch kernels write and read Salus memory; results match the CPU's.
        rt = salus.Runtime("cuda", policy="fair")
        salus.torch.enable(rt)
        job = rt.add_job("j")
        g = torch.Generator().manual_seed(0)
        a_cpu = torch.randn(512, 512, generator=g)
        with job:
            a = a_cpu.cuda()
        for _ in range(3):
            with job.iteration():
                b = torch.relu(a @ a.T) + 1.0
                s = b.sum()
        ref = (torch.relu(a_cpu @ a_cpu.T) + 1.0).sum()
        got = float(s.cpu())
        assert abs(got - float(ref)) <= 1e-3 * abs(float(ref)), (got, float(ref))
        assert rt.job_stats()[0].memory.persistent.in_use >= a.numel() * 4
        print(f"matmul+relu over Salus memory matches the CPU ({got:.6g})")
        job.leave()
    """),
    Check("spill", """
        # Two jobs whose persistent tensors do not fit the device together: pages go to the host
        # and come back with their data.
        rt = salus.Runtime("cuda", policy="fair", spill="host_only", device_limits=["1GiB"])
        salus.torch.enable(rt)
        jobs = [rt.add_job(f"j{i}") for i in range(2)]
        tensors = []
        for i, job in enumerate(jobs):
            with job:
                tensors.append(torch.full((150 << 20,), float(i + 1), device="cuda"))  # 600 MiB
        def work(i):
            for _ in range(3):
                with jobs[i].iteration():
                    total = float(tensors[i].sum())
                    assert total == (i + 1) * (150 << 20), (i, total)
        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads: t.start()
        for t in threads: t.join()
        s = rt.device_stats(0)
        assert s.borrowed_host > 0 or s.pages_moved > 0, s
        print(f"2 x 600 MiB on a 1 GiB budget: data intact; pages moved {s.pages_moved}, "
              f"host-borrowed {s.borrowed_host} bytes")
        for job in jobs: job.leave()
    """),
    Check("out_of_memory", """
        # Beyond the budget: salus.OutOfMemory with its fields, and the process goes on.
        rt = salus.Runtime("cuda", policy="fair", device_limits=["256MiB"])
        salus.torch.enable(rt)
        job = rt.add_job("big")
        try:
            with job.iteration():
                x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
        except salus.OutOfMemory as e:
            assert e.requested >= 512 << 20 and e.device == 0, e
            detail = f"salus.OutOfMemory: requested {e.requested}, limit {e.device_limit}"
        else:
            raise AssertionError("512 MiB on a 256 MiB budget was granted")
        with job.iteration():
            assert float(torch.ones(1024, device="cuda").sum()) == 1024.0
        print(detail + "; the job goes on")
        job.leave()
    """),
    Check("record_stream", """
        # A block used on a side stream is not reused before that stream's work.
        rt = salus.Runtime("cuda", policy="fair")
        salus.torch.enable(rt)
        side = torch.cuda.Stream()
        x = torch.ones(1 << 20, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)  # long work ahead of x's use
            y = x * 2
        x.record_stream(side)
        del x
        z = torch.full((1 << 20,), 7.0, device="cuda")  # may take x's block: after side's work
        torch.cuda.synchronize()
        assert float(y.sum()) == 2.0 * (1 << 20), float(y.sum())
        assert float(z.sum()) == 7.0 * (1 << 20)
        print("the side stream read x's values, not the reuse's")
    """),
    Check("cudnn_benchmark", """
        # torch.backends.cudnn.benchmark: cuDNN's algorithm search asks the allocator how large a
        # workspace it could get (cacheInfo); the convolution then matches one without Salus.
        rt = salus.Runtime("cuda", policy="fair")
        salus.torch.enable(rt)
        torch.backends.cudnn.benchmark = True
        job = rt.add_job("conv")
        g = torch.Generator().manual_seed(0)
        x_cpu = torch.randn(16, 3, 64, 64, generator=g)
        w_cpu = torch.randn(32, 3, 3, 3, generator=g)
        with job.iteration():
            y = torch.nn.functional.conv2d(x_cpu.cuda(), w_cpu.cuda(), padding=1)
            got = y.double().sum().item()
        ref = torch.nn.functional.conv2d(x_cpu.double(), w_cpu.double(), padding=1).sum().item()
        assert abs(got - ref) <= 1e-2 * max(1.0, abs(ref)), (got, ref)
        largest = torch.cuda.memory.mem_get_info()  # the driver's view, for the summary
        print(f"conv2d under cudnn.benchmark matches the CPU ({got:.6g}); driver free {largest[0]}")
        job.leave()
    """),
    Check("cuda_graph", """
        # CUDA graphs are refused with a clear error; the stream is usable afterwards.
        rt = salus.Runtime("cuda", policy="fair")
        salus.torch.enable(rt)
        x = torch.ones(16, device="cuda")
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                y = x * 2
        except RuntimeError as e:
            assert "CUDA graphs are not supported" in str(e), str(e)
        else:
            raise AssertionError("capture was accepted")
        assert float((x * 2).sum()) == 32.0
        print("capture refused: " + "not supported (clear error); stream usable after")
    """),
    Check("memory_stats", """
        # PyTorch's memory calls answer from Salus's statistics; empty_cache trims.
        rt = salus.Runtime("cuda", policy="fair")
        salus.torch.enable(rt)
        x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
        s = rt.device_stats(0)
        assert torch.cuda.memory_allocated(0) == s.allocated, (torch.cuda.memory_allocated(0), s)
        assert torch.cuda.memory_reserved(0) == s.reserved
        assert torch.cuda.max_memory_allocated(0) == s.peak_allocated
        stats = torch.cuda.memory_stats(0)
        assert stats["allocated_bytes.all.current"] == s.allocated
        del x
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(0)
        assert torch.cuda.max_memory_allocated(0) == rt.device_stats(0).allocated
        torch.cuda.empty_cache()
        assert rt.device_stats(0).mapped == 0, rt.device_stats(0)
        print(f"memory_allocated {s.allocated} == Salus's; empty_cache unmapped everything")
    """),
    Check("two_processes", """
        # Two processes share the GPU through salusd (SALUSD, else the salusd beside this Python):
        # their CUDA tensors live in pages the daemon exported to them, they take turns, and each
        # trains to the same weights, bit for bit, as the same script alone without Salus.
        import os, shutil, subprocess, sys, sysconfig, tempfile, time
        salusd = (os.environ.get("SALUSD") or shutil.which("salusd", path=sysconfig.get_path("scripts"))
                  or shutil.which("salusd"))
        assert salusd, "no salusd binary: set SALUSD or pip install ."
        train = TWO_PROCESS_TRAINER
        tmp = tempfile.mkdtemp()
        sock = os.path.join(tmp, "salusd.sock")
        log = open(os.path.join(tmp, "salusd.log"), "w")
        daemon = subprocess.Popen([salusd, "--socket", sock, "--backend", "cuda", "--memory",
                                   "1GiB", "--policy", "fair", "--log-level", "warn"],
                                  stdout=log, stderr=log)
        try:
            for _ in range(200):
                if os.path.exists(sock): break
                time.sleep(0.05)
            alone = subprocess.run([sys.executable, "-c", train, "alone"], capture_output=True,
                                   text=True, timeout=120)
            assert alone.returncode == 0, alone.stderr
            procs = [subprocess.Popen([sys.executable, "-c", train, sock], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True) for _ in range(2)]
            outs = [p.communicate(timeout=180) for p in procs]
            for p, (out, err) in zip(procs, outs):
                assert p.returncode == 0, err
            want = alone.stdout.split()[0]
            got = [out.split()[0] for out, _ in outs]
            assert got == [want, want], (want, got)
            spans = sorted(tuple(map(float, s.split(","))) for out, _ in outs
                           for s in out.split()[1].split(";"))
            for a, b in zip(spans, spans[1:]):
                assert a[1] <= b[0], "two processes ran iterations at once"
        finally:
            daemon.terminate()
            assert daemon.wait(timeout=20) == 0, open(os.path.join(tmp, "salusd.log")).read()
        print("2 processes through salusd on the GPU: turns exclusive, weights equal to alone "
              f"({want[:12]})")
    """.replace("TWO_PROCESS_TRAINER", repr(TWO_PROCESS_TRAINER))),
    Check("two_gpus", """
        # Salus memory on GPU 0 read by GPU 1 (peer access grants) and copied back.
        rt = salus.Runtime("cuda", policy="fair", devices=2)
        salus.torch.enable(rt)
        a = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
        b = a.to("cuda:1")
        c = (b * 2).to("cuda:0")
        assert torch.equal(c, a * 2)
        peer = torch.cuda.can_device_access_peer(1, 0)
        print(f"GPU 0 -> 1 -> 0 copies exact (peer access {'yes' if peer else 'no'})")
    """, needs_gpus=2),
]


def run_check(check: Check, gpus: int) -> tuple[str, str]:
    """Returns (PASS|FAIL|SKIP, detail)."""
    if gpus < check.needs_gpus:
        return "SKIP", f"needs {check.needs_gpus} GPUs, {gpus} here"
    code = PRELUDE + textwrap.dedent(check.code)
    env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=300, env=env)
    except subprocess.TimeoutExpired:
        return "FAIL", "timed out after 300 s"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or [f"rc {proc.returncode}"]
        sys.stderr.write(proc.stdout + proc.stderr)
        return "FAIL", lines[-1]
    lines = proc.stdout.strip().splitlines()
    return "PASS", lines[-1] if lines else "ok"


def main(argv: list[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        print("[gpu-check] SKIP all: PyTorch sees no CUDA GPU")
        return 0
    gpus = torch.cuda.device_count()
    wanted = set(argv) or {c.name for c in CHECKS}
    unknown = wanted - {c.name for c in CHECKS}
    if unknown:
        print(f"unknown checks: {sorted(unknown)}; known: {[c.name for c in CHECKS]}")
        return 2
    failed = 0
    for check in (c for c in CHECKS if c.name in wanted):
        start = time.monotonic()
        verdict, detail = run_check(check, gpus)
        failed += verdict == "FAIL"
        print(f"[gpu-check] {verdict} {check.name} ({time.monotonic() - start:.1f} s): {detail}",
              flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
