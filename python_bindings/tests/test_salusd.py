"""salusd with real Python processes: PyTorch training scripts connected with salus.connect take
turns on one simulated GPU and end where they end alone; errors are typed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from typing import Iterator

import pytest

import salus

CLIENT = Path(__file__).with_name("daemon_client.py")


def salusd_binary() -> str:
    """The salusd that `pip install .` put beside this Python (the wheel's scripts)."""
    found = shutil.which("salusd", path=sysconfig.get_path("scripts")) or shutil.which("salusd")
    if found is None:
        pytest.fail("salusd is not installed beside this Python: the wheel must ship it")
    return found


class Daemon:
    def __init__(self, tmp: Path, *args: str) -> None:
        self.socket = str(tmp / "salusd.sock")
        self.log = tmp / "salusd.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [salusd_binary(), "--socket", self.socket, "--backend", "sim", *args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "salusd did not start"
            time.sleep(0.01)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=20)


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path, "--policy", "fair", "--memory", "512MiB")
    yield d
    assert d.stop() == 0, d.log.read_text()


def run_clients(tmp: Path, socket: str | None, names: list[str], *extra: str,
                own: dict[str, list[str]] | None = None) -> list[dict]:
    """Runs the clients to their end; several start their iterations together, once every one
    has added its job (whatever importing torch cost each). ``own``: arguments of one client."""
    procs = []
    ready = tmp / "ready"
    for name in names:
        cmd = [sys.executable, str(CLIENT), "--name", name, "--out", str(tmp / f"{name}.json"),
               *extra]
        if socket:
            cmd += ["--socket", socket]
        if len(names) > 1:
            cmd += ["--joined", str(tmp / f"{name}.joined"), "--wait-for", str(ready)]
        cmd += (own or {}).get(name, [])  # last: a client's own arguments override the others
        procs.append(subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
    if len(names) > 1:
        deadline = time.monotonic() + 120
        while not all((tmp / f"{name}.joined").exists() for name in names):
            assert all(p.poll() is None for p in procs), "a client ended early"
            assert time.monotonic() < deadline, "the clients did not all add their jobs"
            time.sleep(0.01)
        ready.touch()
    errs = [p.communicate(timeout=180)[1] for p in procs]
    # Every client's standard error, whichever failed: one's failure is often the other's doing.
    report = "\n".join(f"--- {n} (exit {p.returncode}):\n{e}" for n, p, e in zip(names, procs, errs))
    assert all(p.returncode == 0 for p in procs), report
    return [json.loads((tmp / f"{name}.json").read_text()) for name in names]


def test_two_torch_processes_take_turns_and_train_as_alone(daemon: Daemon, tmp_path: Path) -> None:
    # b starts once a holds its first turn, and a's first iteration lasts until b waits for its
    # turn, so that fair must alternate them (else b, on a busy machine, could run all its
    # iterations before a asks for its first: nothing would then be shared).
    begun = str(tmp_path / "a.begun")
    shared = run_clients(tmp_path, daemon.socket, ["a", "b"], "--iterations", "6",
                         own={"a": ["--first-holds-for", "b", "--begun", begun],
                              "b": ["--wait-for", begun]})
    alone = run_clients(tmp_path, None, ["alone"], "--iterations", "6")[0]
    for r in shared:
        assert r["error"] is None, r
        assert len(r["spans"]) == 6
        assert r["weights"] == alone["weights"]  # bitwise: the same training, shared or not
    spans = sorted((s[0], s[1], i) for i, r in enumerate(shared) for s in r["spans"])
    for (b0, e0, p0), (b1, e1, p1) in zip(spans, spans[1:]):
        assert e0 <= b1, f"processes {p0} and {p1} ran iterations at once"
    # Turns alternate rather than one process running to the end first.
    first_a, last_a = shared[0]["spans"][0][0], shared[0]["spans"][-1][0]
    first_b, last_b = shared[1]["spans"][0][0], shared[1]["spans"][-1][0]
    assert first_a < last_b and first_b < last_a


def test_four_torch_processes_under_priority(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "--policy", "priority", "--memory", "512MiB")
    try:
        procs = []
        for name, priority in [("p0", 0), ("p1", 0), ("p2", 0), ("urgent", 10)]:
            procs.append(subprocess.Popen(
                [sys.executable, str(CLIENT), "--name", name, "--out", str(tmp_path / f"{name}.json"),
                 "--socket", d.socket, "--iterations", "6", "--priority", str(priority)],
                stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate(timeout=180)
            assert p.returncode == 0, err
        results = {n: json.loads((tmp_path / f"{n}.json").read_text())
                   for n in ("p0", "p1", "p2", "urgent")}
    finally:
        assert d.stop() == 0, d.log.read_text()
    weights = {r["weights"] for r in results.values()}
    assert len(weights) == 1 and None not in weights  # every one trained as it would alone
    spans = sorted((s[0], s[1], n) for n, r in results.items() for s in r["spans"])
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        assert e0 <= b1, f"{n0} and {n1} ran iterations at once"
    # Whenever the urgent one waits, it goes next: between its first and last iteration the
    # others get at most the turn that was running each time it asked again.
    urgent = results["urgent"]["spans"]
    others = sum(1 for n, r in results.items() if n != "urgent" for b, _ in r["spans"]
                 if urgent[0][0] < b < urgent[-1][0])
    assert others <= len(urgent), f"the urgent process waited behind {others} iterations"


def daemon_status(daemon: Daemon) -> str:
    return subprocess.run([salusd_binary(), "--socket", daemon.socket, "--status"],
                          capture_output=True, text=True, timeout=10).stdout


def test_a_killed_torch_process_costs_the_others_nothing(daemon: Daemon, tmp_path: Path) -> None:
    def start(name: str, iterations: int) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(CLIENT), "--name", name, "--out", str(tmp_path / f"{name}.json"),
             "--socket", daemon.socket, "--iterations", str(iterations)],
            stderr=subprocess.PIPE, text=True)

    victim = start("victim", 100000)
    survivors = [start("a", 30), start("b", 30)]
    # Killed once it takes turns with the others: inside an iteration or waiting for a turn.
    deadline = time.monotonic() + 60
    while not any(line.startswith("victim") and int(line.split()[3]) >= 2
                  for line in daemon_status(daemon).splitlines()):
        assert time.monotonic() < deadline, daemon_status(daemon)
        time.sleep(0.05)
    victim.kill()
    assert victim.wait(timeout=20) == -signal.SIGKILL
    for p in survivors:
        _, err = p.communicate(timeout=180)
        assert p.returncode == 0, err
    alone = run_clients(tmp_path, None, ["alone"], "--iterations", "30")[0]
    for name in ("a", "b"):
        r = json.loads((tmp_path / f"{name}.json").read_text())
        assert r["error"] is None, r
        assert len(r["spans"]) == 30
        assert r["weights"] == alone["weights"]  # as if the victim had never been there
    # Every page the victim held comes back.
    deadline = time.monotonic() + 15
    while True:
        status = daemon_status(daemon)
        granted = int(next(line for line in status.splitlines() if line.startswith("0 ")).split()[1])
        if granted == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert granted == 0, status


def test_connect_without_a_daemon_is_a_device_error(tmp_path: Path) -> None:
    with pytest.raises(salus.DeviceError) as info:
        salus.connect(tmp_path / "nobody.sock")
    assert info.value.call == "connect"
    assert "is salusd running?" in str(info.value)


def test_a_dead_daemon_is_a_device_error_not_a_hang(tmp_path: Path) -> None:
    d = Daemon(tmp_path, "--memory", "64MiB")
    rt = salus.connect(d.socket)
    job = rt.add_job("j")
    with job.iteration():
        pass
    d.proc.kill()
    d.proc.wait(timeout=10)
    started = time.monotonic()
    with pytest.raises(salus.DeviceError) as info:
        with job.iteration():
            pass
    assert time.monotonic() - started < 5
    assert info.value.status == "SALUSD_GONE"
    job.leave()
    rt.close()


@pytest.mark.parametrize("size", ["96MiB", "96 mib", "96M", "100663296", "0.09375GiB",
                                  "100MB", "100 mb", "0.1GB"])
def test_salusd_reads_a_size_as_python_does(tmp_path: Path, size: str) -> None:
    # One size grammar at every door: the daemon hands out what salus.parse_size says.
    d = Daemon(tmp_path, "--memory", size)
    try:
        table = daemon_status(d)
        capacity_mib = float(next(line.split()[4] for line in table.splitlines()
                                  if line.startswith("0 ")))
        expected = salus.parse_size(size, "--memory")
        page = 2 << 20
        assert capacity_mib * (1 << 20) == expected // page * page, table
    finally:
        d.stop()


@pytest.mark.parametrize("size", ["lots", "12XB", "-1GiB", "1e3GiBs"])
def test_salusd_refuses_a_bad_size_naming_its_flag_and_value(tmp_path: Path, size: str) -> None:
    done = subprocess.run([salusd_binary(), "--socket", str(tmp_path / "s.sock"), "--backend",
                           "sim", "--memory", size], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0
    assert "--memory" in done.stderr and f"'{size}'" in done.stderr, done.stderr
    with pytest.raises(salus.InvalidArgument):
        salus.parse_size(size, "--memory")
