"""Pre-flight (at most 15 s): what the GPU is, and what CUDA does with interprocess events.

Salus hands pages between processes behind interprocess events (README, "Memory moves between
processes at turns"), and that path has run only against the fake driver. The probe asks the real
driver the two questions that path depends on, and prints what each call returned:

  (0) control: a child process opens the handle of a live event of this process;
  (1) this process opens the handle it exported itself (CUDA documents that this fails);
  (2) a child process opens a handle whose event this process has destroyed.

Run as a script (``preflight.py probe``) it is the probe's parent process, through ctypes against
libcuda (no PyTorch: the probe must be fast and must not depend on torch's CUDA build).
"""
from __future__ import annotations

import ctypes
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from bench_common import Context
from cuda_driver import (CU_EVENT_DISABLE_TIMING, CU_EVENT_INTERPROCESS, CUipcEventHandle,
                         Driver, DriverError)

LIMIT_S = 15.0
CHILD = str(Path(__file__).with_name("cuda_driver.py"))


def run(ctx: Context, nvidia_smi: Optional[str]) -> None:
    """Prints nvidia-smi's table and the probe's answers; keeps both in the run's facts."""
    deadline = time.monotonic() + LIMIT_S
    if nvidia_smi is None:
        print("[gpu-bench] nvidia-smi: not found (dry run on the simulated backend)", flush=True)
        ctx.skip("interprocess-event probe: no GPU (dry run)", part="preflight")
        return
    smi = _run([nvidia_smi], deadline, 8.0)
    print(smi.rstrip(), flush=True)
    ctx.facts["nvidia_smi"] = smi
    ctx.facts.update(_gpu_facts(nvidia_smi, deadline))
    if ctx.dry_run:
        ctx.skip("interprocess-event probe: dry run", part="preflight")
        return
    answer = _run([ctx.python, __file__, "probe"], deadline, max(1.0, deadline - time.monotonic()))
    print(answer.rstrip(), flush=True)
    ctx.facts["ipc_event_probe"] = answer


def _gpu_facts(nvidia_smi: str, deadline: float) -> dict[str, str]:
    query = _run([nvidia_smi, "--query-gpu=name,driver_version,memory.total",
                  "--format=csv,noheader"], deadline, 5.0)
    first = query.strip().splitlines()[0] if query.strip() else ""
    parts = [p.strip() for p in first.split(",")]
    if len(parts) < 3:
        return {"gpu_query": query.strip()}
    return {"gpu_name": parts[0], "driver": parts[1], "gpu_memory": parts[2]}


def _run(argv: list[str], deadline: float, limit: float) -> str:
    """A command's output within the pre-flight's time; a timeout or failure is said, not raised
    (the pre-flight informs, it does not gate)."""
    limit = min(limit, deadline - time.monotonic())
    if limit <= 0.2:
        return f"{argv[0]}: not run (the pre-flight's {LIMIT_S:.0f} s are spent)"
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as e:
        partial = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else ""
        return partial + f"{' '.join(argv)}: timed out after {limit:.1f} s"
    except OSError as e:
        return f"{argv[0]}: {e}"
    return done.stdout + (done.stderr if done.returncode else "")


# --- the probe's parent --------------------------------------------------------------------------

def probe() -> list[str]:
    lines = []
    driver = Driver()
    driver.primary_context()
    lines.append(f"driver API version {driver.version()}")
    event = ctypes.c_void_p()
    driver.check("cuEventCreate", ctypes.byref(event),
                 CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)
    driver.check("cuEventRecord", event, None)  # a recorded event, as Salus's fences are
    handle = CUipcEventHandle()
    driver.check("cuIpcGetEventHandle", ctypes.byref(handle), event)
    # string_at, not handle.reserved: a c_char array reads as bytes cut at the first NUL.
    hex_handle = ctypes.string_at(ctypes.addressof(handle), ctypes.sizeof(handle)).hex()
    lines.append("(0) child opens a live event's handle: " + _child(hex_handle))
    opened = ctypes.c_void_p()
    _, name = driver.call("cuIpcOpenEventHandle", ctypes.byref(opened), handle)
    lines.append(f"(1) the exporting process opens its own handle: cuIpcOpenEventHandle -> {name}")
    if opened.value:
        driver.call("cuEventDestroy", opened)
    _, destroyed = driver.call("cuEventDestroy", event)
    lines.append(f"    the source event destroyed in the parent: cuEventDestroy -> {destroyed}")
    lines.append("(2) child opens the handle after that: " + _child(hex_handle))
    return lines


def _child(hex_handle: str) -> str:
    try:
        done = subprocess.run([sys.executable, CHILD, "open-ipc-event", hex_handle],
                              capture_output=True, text=True, timeout=5.0)
    except subprocess.TimeoutExpired:
        return "the child timed out after 5 s"
    out = done.stdout.strip().splitlines() or done.stderr.strip().splitlines()
    return out[-1] if out else f"no output (exit status {done.returncode})"


def main() -> int:
    try:
        for line in probe():
            print(f"[probe] {line}", flush=True)
    except DriverError as e:
        print(f"[probe] could not run: {e}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["probe"]:
        sys.exit("usage: preflight.py probe")
    sys.exit(main())
