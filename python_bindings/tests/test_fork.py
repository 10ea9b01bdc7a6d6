"""fork(): a child of a process that uses Salus gets a clear error from the parent's runtime
(never a hang, at interpreter exit included), can make a runtime of its own, and the parent goes
on unaffected. Under ``salus.torch.enable`` a child's CPU tensors come from PyTorch's own
allocator, so DataLoader workers (forked by default on Linux) work. Every case runs a script in
a subprocess under a time limit, so that a regression fails instead of hanging."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Waits for a forked child with a time limit and reports its exit code (or kills it).
PRELUDE = textwrap.dedent("""
    import os, sys, time

    def wait_child(pid, limit=30.0):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status)
            time.sleep(0.01)
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        return "hung"
""")


def run(body: str, timeout: float = 120.0) -> list[str]:
    """Runs PRELUDE + body in a fresh interpreter; returns the words it printed (exit code 0),
    log lines ("[time] [level] ...") left out."""
    try:
        done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(
            f"the script hung; stdout: {e.stdout!r}; stderr: {e.stderr!r}") from None
    assert done.returncode == 0, f"stdout: {done.stdout}\nstderr: {done.stderr}"
    return [word for line in done.stdout.splitlines() if not line.startswith("[")
            for word in line.split()]


def test_a_child_gets_not_supported_from_the_parents_runtime_and_exits_cleanly() -> None:
    out = run("""
        import salus
        rt = salus.Runtime("sim", memory="1GiB")
        job = rt.add_job("trainer")
        with job.iteration() as it:
            rt.sim_kernel(it.stream, 0.01)
        job.synchronize()
        pid = os.fork()
        if pid == 0:
            # The child: every use of the parent's runtime says why it cannot work here.
            failures = 0
            for call in (job.synchronize, job.begin_iteration, lambda: rt.add_job("x"),
                         lambda: rt.allocate("1MiB"), lambda: job.allocate("1MiB")):
                try:
                    call()
                except salus.NotSupported as e:
                    failures += "fork" in str(e)
            print("CHILD", failures, flush=True)
            sys.exit(0)  # interpreter exit: the runtime and job wrappers go, without hanging
        print("CHILD_EXIT", wait_child(pid), flush=True)
        with job.iteration() as it:  # the parent goes on
            rt.sim_kernel(it.stream, 0.01)
        job.synchronize()
        print("PARENT", job.stats().iterations)
    """)
    assert out == ["CHILD", "5", "CHILD_EXIT", "0", "PARENT", "2"]


def test_a_child_makes_a_runtime_of_its_own_and_the_default_is_new_there() -> None:
    out = run("""
        import salus
        parent_default = salus.default_runtime()
        job = parent_default.add_job("parent")
        with job.iteration():
            pass
        pid = os.fork()
        if pid == 0:
            rt = salus.Runtime("sim", memory="256MiB", policy="fifo")
            a = rt.add_job("a")
            for _ in range(3):
                with a.iteration() as it:
                    rt.sim_kernel(it.stream, 0.001)
            a.synchronize()
            fresh = salus.default_runtime()
            b = fresh.add_job("b")
            with b.iteration() as it:
                fresh.sim_kernel(it.stream, 0.001)
            b.synchronize()
            print("CHILD", a.stats().iterations, b.stats().iterations,
                  fresh is not parent_default, flush=True)
            sys.exit(0)  # destroys the child's own runtimes normally
        print("CHILD_EXIT", wait_child(pid), flush=True)
        with job.iteration():
            pass
        print("PARENT", job.stats().iterations, salus.default_runtime() is parent_default)
    """)
    assert out == ["CHILD", "3", "1", "True", "CHILD_EXIT", "0", "PARENT", "2", "True"]


def test_under_the_torch_glue_a_child_uses_pytorchs_allocator_and_may_enable_its_own() -> None:
    pytest.importorskip("torch")
    out = run("""
        import torch, salus, salus.torch as st
        rt = salus.Runtime("sim", memory="1GiB")
        st.enable(rt)
        inherited = torch.arange(1000, dtype=torch.float32)  # in the parent's simulated memory
        before = st.counters()
        pid = os.fork()
        if pid == 0:
            ok = not st.enabled()
            ok &= float(inherited.sum()) == 499500.0  # readable in the child
            fresh = torch.ones(1000) * 2  # PyTorch's own allocator: not counted by the glue
            ok &= float(fresh.sum()) == 2000.0 and st.counters() == before
            del inherited  # the parent's block: left to the parent, no error
            ok &= st.counters()["failed_frees"] == before["failed_frees"]
            own = salus.Runtime("sim", memory="256MiB")
            st.enable(own)  # the child's own runtime
            job = own.add_job("child")
            with job.iteration():
                x = torch.ones(4096) + 1
                ok &= float(x.sum()) == 8192.0
            del x
            ok &= st.counters()["allocations"] > before["allocations"]
            st.disable()
            print("CHILD", ok, flush=True)
            sys.exit(0)
        print("CHILD_EXIT", wait_child(pid), flush=True)
        y = torch.ones(10)
        print("PARENT", st.enabled(), st.counters()["allocations"] > before["allocations"],
              float(inherited.sum()) == 499500.0, st.counters()["failed_frees"])
    """)
    assert out == ["CHILD", "True", "CHILD_EXIT", "0", "PARENT", "True", "True", "True", "0"]


def test_dataloader_workers_under_the_torch_glue() -> None:
    pytest.importorskip("torch")
    out = run("""
        import time, torch, salus, salus.torch as st
        from torch.utils.data import DataLoader, Dataset

        class Squares(Dataset):
            # Items are made in the workers (PyTorch's own allocator there), from a table made
            # in the parent under the glue (the parent's simulated memory, read in the child).
            def __init__(self, n):
                self.table = torch.arange(n, dtype=torch.float64)
            def __len__(self):
                return len(self.table)
            def __getitem__(self, i):
                item = torch.full((256,), float(self.table[i]))
                time.sleep(0.001)  # other workers allocate meanwhile
                assert bool((item == i).all()), "another process wrote into this item"
                return item * item[0]

        rt = salus.Runtime("sim", memory="1GiB")
        st.enable(rt)
        job = rt.add_job("trainer")
        loader = DataLoader(Squares(64), batch_size=8, num_workers=2)
        total = 0.0
        for epoch in range(2):  # a new pair of workers each epoch
            for batch in loader:
                with job.iteration():
                    total += float((batch * 1.0).sum())
        expected = 2 * 256 * sum(i * i for i in range(64))
        print("TOTAL", total == expected, job.stats().iterations, st.counters()["failed_frees"])
        st.disable()
    """)
    assert out == ["TOTAL", "True", "16", "0"]
