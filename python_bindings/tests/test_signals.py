"""Ctrl-C while Python waits in Salus: ``KeyboardInterrupt`` comes at once (well under a second),
and the wait is withdrawn, not the job: it is idle, queued nowhere, holds no turn, and can run an
iteration later. Each case runs a small script in a subprocess and sends it SIGINT."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import IO, Iterator

import pytest

# The script: a holder job takes the device (it runs an iteration until told to stop, never
# yields, or is merely present with memory that leaves no room for the waiter); the main thread
# then waits for the waiter's turn, and the test interrupts that wait.
WAIT_SCRIPT = textwrap.dedent("""
    import json, signal, sys, threading, time
    import salus

    signal.signal(signal.SIGINT, signal.default_int_handler)  # whatever the parent ignores
    policy, holder_mode = sys.argv[1], sys.argv[2]
    rt = salus.Runtime("sim", memory="1GiB", policy=policy)
    if holder_mode == "unadmitted":
        holder = rt.add_job("holder", hints={"persistent": "700MiB"})
        waiter = rt.add_job("waiter", hints={"persistent": "600MiB"})
    else:
        holder = rt.add_job("holder")
        waiter = rt.add_job("waiter")
    release = threading.Event()

    def hold():
        with holder.iteration():
            inside.set()
            release.wait()  # "never": nobody sets it
        if policy == "fifo":
            holder.leave()  # fifo keeps the device for a job until it leaves

    inside = threading.Event()
    if holder_mode == "unadmitted":
        inside.set()
    else:
        threading.Thread(target=hold, daemon=True).start()
    inside.wait()

    def announce():
        while waiter.stats().state != "waiting":
            time.sleep(0.005)
        print("WAITING", flush=True)

    threading.Thread(target=announce, daemon=True).start()

    def states():
        return json.dumps({s.name: s.state for s in rt.job_stats()})

    try:
        with waiter.iteration():
            print("RAN", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED " + states(), flush=True)

    if holder_mode == "turn":
        release.set()
    elif holder_mode == "never":
        holder.cancel()  # it never yields: only a cancel frees the device
    else:
        holder.leave()  # its memory goes: the waiter is admitted
    with waiter.iteration() as it:
        rt.sim_kernel(it.stream, 0.001)
    waiter.synchronize()
    print("AGAIN " + states(), flush=True)
""")

# The main thread waits for a long simulated kernel; the test interrupts the wait. (The kernel
# runs on: destroying the runtime at exit drains its streams, so it is not longer than needed.)
SYNC_SCRIPT = textwrap.dedent("""
    import signal, sys
    import salus

    signal.signal(signal.SIGINT, signal.default_int_handler)
    rt = salus.Runtime("sim", memory="1GiB")
    job = rt.add_job("trainer")
    try:
        with job.iteration() as it:
            rt.sim_kernel(it.stream, 6.0)
            print("WAITING", flush=True)
            if sys.argv[1] == "job":
                job.synchronize()
            else:
                rt.synchronize(it.stream)
    except KeyboardInterrupt:
        print("INTERRUPTED " + job.stats().state, flush=True)
    with job.iteration() as it:
        pass
    print("AGAIN %d" % job.stats().iterations, flush=True)
""")


class Script:
    """A script in a subprocess whose stdout lines are read with deadlines."""

    def __init__(self, source: str, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", source, *args], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self._lines: "queue.Queue[str]" = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line.rstrip("\n"))

    def line(self, timeout: float) -> str:
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no output within {timeout} s; stderr so far: "
                                 f"{self._stderr_if_dead()}") from None

    def _stderr_if_dead(self) -> str:
        return self.proc.stderr.read() if self.proc.poll() is not None else "(still running)"

    def interrupt(self) -> float:
        """Sends SIGINT; returns when."""
        self.proc.send_signal(signal.SIGINT)
        return time.monotonic()

    def finish(self, timeout: float = 20.0) -> None:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the script did not exit within {timeout} s") from None
        assert code == 0, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def scripts() -> Iterator[list[Script]]:
    started: list[Script] = []
    yield started
    for s in started:
        s.kill()  # a regression must not leave a process waiting for ever


def interrupted_within_a_second(script: Script) -> str:
    assert script.line(timeout=30) == "WAITING"
    time.sleep(0.2)  # well inside the wait
    sent = script.interrupt()
    line = script.line(timeout=5)
    elapsed = time.monotonic() - sent
    assert line.startswith("INTERRUPTED"), line
    assert elapsed < 1.0, f"KeyboardInterrupt came {elapsed:.2f} s after SIGINT"
    return line.split(" ", 1)[1]


@pytest.mark.parametrize("policy,holder_mode", [
    ("fifo", "turn"),         # behind another job's running iteration
    ("fair", "turn"),
    ("fair", "never"),        # behind a holder that never yields
    ("fifo", "never"),
    ("fair", "unadmitted"),   # not admitted: the holder's memory leaves no room
])
def test_ctrl_c_ends_a_wait_for_a_turn_and_the_job_can_run_later(
        scripts: list[Script], policy: str, holder_mode: str) -> None:
    script = Script(WAIT_SCRIPT, policy, holder_mode)
    scripts.append(script)
    after_interrupt = json.loads(interrupted_within_a_second(script))
    assert after_interrupt["waiter"] == "idle", "the wait is withdrawn: the job is idle"
    assert "waiting" not in after_interrupt.values(), "nothing is left queued"
    again = script.line(timeout=20)
    assert again.startswith("AGAIN"), again
    assert "waiting" not in json.loads(again.split(" ", 1)[1]).values()
    script.finish()


@pytest.mark.parametrize("which", ["job", "runtime"])
def test_ctrl_c_ends_a_synchronize(scripts: list[Script], which: str) -> None:
    script = Script(SYNC_SCRIPT, which)
    scripts.append(script)
    # The iteration's end ran as the exception left the with-block.
    assert interrupted_within_a_second(script) == "idle"
    assert script.line(timeout=20) == "AGAIN 2"
    script.finish()


def test_a_wait_in_another_thread_goes_on_after_a_signal_the_main_thread_handles() -> None:
    """Only the main thread runs signal handlers: a job thread's wait is not disturbed by a
    handler that raises nothing."""
    import salus

    rt = salus.Runtime("sim", memory="1GiB")
    holder = rt.add_job("holder")
    waiter = rt.add_job("waiter")
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: got.append("handled"))
    try:
        holder.begin_iteration()

        def wait() -> None:
            with waiter.iteration():
                got.append("ran")

        t = threading.Thread(target=wait)
        t.start()
        while waiter.stats().state != "waiting":
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.2)
        assert got == ["handled"]
        holder.end_iteration()
        t.join(timeout=10)
        assert not t.is_alive()
        assert got == ["handled", "ran"]
    finally:
        signal.signal(signal.SIGUSR1, previous)
        rt.close()
