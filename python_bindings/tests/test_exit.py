"""A Python program that exits, however it exits, ends with its exit code: a daemon thread whose
Salus call returns while the interpreter is exiting used to be ended by Python inside the GIL
guard's noexcept destructor, and the process died of SIGABRT ("terminate called without an
active exception"). Each case runs its program several times: the call must return during the
interpreter's exit, which a run hits often but not always."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# The daemon thread waits for a simulated kernel that ends after the main thread has begun to
# exit; `how` is how it exits.
PROGRAM = textwrap.dedent("""
    import os, sys, threading, time
    import salus

    how = sys.argv[1]
    rt = salus.Runtime("sim", memory="256MiB")
    job = rt.add_job("a")
    it = job.iteration()
    it.__enter__()
    rt.sim_kernel(it.stream, 0.3)
    threading.Thread(target=lambda: rt.synchronize(it.stream), daemon=True).start()
    time.sleep(0.05)
    if how == "exit":
        sys.exit(3)
    if how == "raise":
        raise RuntimeError("the script's own error")
    # "end": falls off the end
""")


@pytest.mark.parametrize("how,code", [("exit", 3), ("raise", 1), ("end", 0)])
def test_a_program_exits_with_its_code_while_a_thread_is_inside_salus(how: str, code: int) -> None:
    for run in range(6):
        done = subprocess.run([sys.executable, "-c", PROGRAM, how], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == code, (run, done.returncode, done.stderr)
        assert "terminate called" not in done.stderr, done.stderr
