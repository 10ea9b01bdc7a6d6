"""The GIL while a PyTorch allocation waits in Salus (issue 20, item 12).

An allocation may wait for memory that another job's iteration holds; that iteration is a Python
thread, which needs the GIL to finish. PyTorch allocates holding the GIL in places (here
``torch.tensor(list)``), so the glue must release it around the wait, whatever the policy.
The scenario runs in a child process: when the GIL is held, the process deadlocks, and the
timeout turns that into a failure instead of a hung test run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent("""
    import threading, time
    import torch
    import salus, salus.torch as salus_torch

    torch.set_num_threads(1)
    rt = salus.Runtime("sim", memory="32MiB", policy="pack")  # a C++ policy: no Python in it
    salus_torch.enable(rt)
    # Hints that understate the needs: the two jobs get lanes of their own and meet on memory.
    hints = {"persistent": "1MiB", "ephemeral_peak": "2MiB"}
    holder = rt.add_job("holder", hints=hints)
    waiter = rt.add_job("waiter", hints=hints)
    holding = threading.Event()
    released = threading.Event()

    def hold() -> None:
        with holder.iteration():
            x = torch.empty(20 << 20, dtype=torch.uint8)
            holding.set()
            time.sleep(0.2)  # the waiter is waiting by now; going on takes the GIL
            del x
        released.set()

    t = threading.Thread(target=hold)
    t.start()
    assert holding.wait(30)
    with waiter.iteration():
        # 16 MiB, allocated holding the GIL, more than the holder leaves free.
        y = torch.tensor([1.0] * (4 << 20), dtype=torch.float32)
        assert released.is_set(), "the allocation did not wait for the holder's memory"
        assert float(y[-1]) == 1.0
    t.join(30)
    salus_torch.disable()
    print("ok", flush=True)
""")


def test_an_allocation_waiting_for_memory_lets_other_python_threads_run() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True,
                              text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("deadlock: the waiting allocation held the GIL that the thread "
                             "holding the memory needed") from None
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok", (done.stdout, done.stderr)
