"""What the GPU benchmark's driver and its arms share (benchmarks/gpu/gpu_bench.py).

The driver never imports torch nor touches CUDA: every measurement runs in an arm, a fresh
process (``salus.torch.enable`` must come before PyTorch initializes CUDA, which a process does
once, and an arm that crashes or hangs must not take the others with it). An arm is a part
module run as a script; it prints one line ``BENCH_RESULT <json>`` and exits 0, or exits
non-zero with its error on stderr.

This module imports nothing heavy: the arms import torch themselves, inside their functions.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

RESULT_TAG = "BENCH_RESULT "
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class BenchError(RuntimeError):
    """A measurement could not be made (named by what was missing or what failed)."""


# --- rows, skips and failures --------------------------------------------------------------------

@dataclass
class Row:
    """One line of the table: a measured value against a reference measured in the same run."""

    part: str
    name: str
    unit: str
    value: Optional[float]
    reference: Optional[float]
    reference_label: str
    # "lower" (a time: the ratio should be small) or "higher" (a rate: it should be large).
    better: str = "lower"
    target: Optional[float] = None  # the ratio to meet (<= for lower, >= for higher)
    note: str = ""

    @property
    def ratio(self) -> Optional[float]:
        if self.value is None or self.reference is None or self.reference == 0:
            return None
        return self.value / self.reference

    def verdict(self, dry_run: bool) -> str:
        """Whether the ratio meets the target; targets are for a GPU, not the simulator."""
        if self.target is None:
            return "-"
        if dry_run:
            return "n/a (dry run)"
        ratio = self.ratio
        if ratio is None or math.isnan(ratio):
            return "no ratio"
        ok = ratio <= self.target if self.better == "lower" else ratio >= self.target
        return "yes" if ok else "MISSED"

    def to_json(self, dry_run: bool) -> dict[str, Any]:
        out = asdict(self)
        out["ratio"] = self.ratio
        out["meets_target"] = self.verdict(dry_run)
        return out


@dataclass
class Skip:
    part: str
    reason: str


@dataclass
class Failure:
    part: str
    arm: str
    error: str
    log: str


# --- the driver's context ------------------------------------------------------------------------

@dataclass
class ArmOutcome:
    """What one arm process left: its result (None on failure) and its wall time."""

    name: str
    result: Optional[dict[str, Any]]
    seconds: float
    error: str = ""


@dataclass
class Context:
    """The run as the parts see it: where things go, how long is left, what was measured."""

    python: str
    out: Path
    dry_run: bool
    deadline: float  # time.monotonic() by which the whole run must be done
    env: dict[str, str]
    rows: list[Row] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)  # environment the arms report
    nvidia_smi: Optional[str] = None  # its path where it lists a GPU
    part: str = ""
    part_deadline: float = 0.0

    @property
    def logs(self) -> Path:
        return self.out / "logs"

    @property
    def backend(self) -> str:
        return "sim" if self.dry_run else "cuda"

    def remaining(self) -> float:
        return min(self.deadline, self.part_deadline) - time.monotonic()

    def script(self, module: str) -> str:
        return str(HERE / f"{module}.py")

    def add_row(self, row: Row) -> None:
        self.rows.append(row)
        ratio = row.ratio
        print(f"[gpu-bench]   {row.part} {row.name}: {_fmt(row.value)} {row.unit} vs "
              f"{_fmt(row.reference)} ({row.reference_label}), ratio "
              f"{'-' if ratio is None else f'{ratio:.3f}'}", flush=True)

    def skip(self, reason: str, part: Optional[str] = None) -> None:
        name = part or self.part
        self.skips.append(Skip(name, reason))
        print(f"SKIP {name}: {reason}", flush=True)

    def fail(self, arm: str, error: str, log: Path | str = "") -> None:
        self.failures.append(Failure(self.part, arm, error, str(log)))
        print(f"[gpu-bench] FAILED {self.part}/{arm}: {error}"
              + (f" (log: {log})" if log else ""), file=sys.stderr, flush=True)

    def note_facts(self, result: dict[str, Any]) -> None:
        """Keeps the environment an arm reported (torch version, GPU name) for the JSON."""
        for key in ("torch", "torch_cuda", "gpu_name", "salus"):
            if result.get(key) and key not in self.facts:
                self.facts[key] = result[key]

    # --- arms ---
    def run_arm(self, arm: str, argv: Sequence[str], timeout: Optional[float] = None,
                env: Optional[dict[str, str]] = None) -> Optional[dict[str, Any]]:
        """Runs one arm to its end; its result, or None (the failure recorded)."""
        outcomes = self.run_together([(arm, argv)], timeout=timeout, env=env)
        return outcomes[0].result

    def run_together(self, arms: Sequence[tuple[str, Sequence[str]]],
                     timeout: Optional[float] = None, env: Optional[dict[str, str]] = None,
                     barrier: Optional["Barrier"] = None) -> list[ArmOutcome]:
        """Runs several arm processes at once (one process each) and waits for all of them.

        With ``barrier``, the arms make a file each once set up and wait for the barrier's go file,
        which is made once all of them are ready: processes that share the GPU then start their
        measured work together, whatever importing torch cost each of them.
        """
        limit = self._arm_limit(timeout)
        if limit is None:
            names = ", ".join(a for a, _ in arms)
            self.skip(f"{names}: the part's time budget is spent")
            return [ArmOutcome(a, None, 0.0, "time budget spent") for a, _ in arms]
        self.logs.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        procs = [_ArmProcess(name, list(argv), self.logs / f"{self.part}_{name}.log",
                             {**self.env, **(env or {})}) for name, argv in arms]
        try:
            if barrier is not None:
                barrier.release_when_ready(procs, started + limit)
            for proc in procs:
                proc.wait_until(started + limit)
        finally:
            for proc in procs:
                proc.kill_if_running()
        outcomes = []
        for proc in procs:
            outcome = proc.outcome(time.monotonic() - started)
            if outcome.result is None:
                self.fail(proc.name, outcome.error, proc.log)
            else:
                self.note_facts(outcome.result)
            outcomes.append(outcome)
        return outcomes

    def _arm_limit(self, timeout: Optional[float]) -> Optional[float]:
        """Seconds an arm may run: its own timeout within what is left of the part and the run;
        None when too little is left to start a process that imports torch."""
        left = self.remaining()
        if left < 3.0:
            return None
        return left if timeout is None else min(timeout, left)


class _ArmProcess:
    """One arm's process: its output to a log file, killed (its process group) on timeout."""

    def __init__(self, name: str, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.name = name
        self.log = log
        self.timed_out = False
        self._file = open(log, "w")
        self._file.write("$ " + " ".join(argv) + "\n")
        self._file.flush()
        # A session of its own: a timeout then ends the arm and whatever it started (a `salus run`
        # script's children), by this process's group id, which only this arm holds.
        self.proc = subprocess.Popen(argv, stdout=self._file, stderr=subprocess.STDOUT, env=env,
                                     cwd=ROOT, start_new_session=True)

    def wait_until(self, deadline: float) -> None:
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.kill_if_running()

    def kill_if_running(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if not self._file.closed:
            self._file.close()

    def outcome(self, seconds: float) -> ArmOutcome:
        text = self.log.read_text(errors="replace")
        result = None
        for line in text.splitlines():
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
        if self.timed_out:
            return ArmOutcome(self.name, None, seconds, f"timed out after {seconds:.0f} s")
        if self.proc.returncode != 0 or result is None:
            return ArmOutcome(self.name, None, seconds,
                              f"exit status {self.proc.returncode}: {error_line(text)}")
        return ArmOutcome(self.name, result, seconds)


# The line that names an arm's error: Python's last exception line, or `salus run`'s own message.
# Salus may log after it (blocks still live at exit), so the log's last line is not always it.
_ERROR_LINE = re.compile(r"^([\w.]+(Error|Exception|Exit|OutOfMemory|Cancelled)\b|salus run:)")


def error_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines()[1:] if ln.strip()]  # [0] is the command
    named = [ln for ln in lines if _ERROR_LINE.match(ln)]
    if named:
        return named[-1]
    return lines[-1] if lines else "no output"


class Barrier:
    """Files that line up processes: each arm makes ``ready-<name>`` once set up, then waits for
    ``go``, which the driver makes once every arm is ready (or gives up at the deadline)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        shutil.rmtree(directory, ignore_errors=True)  # an old run's go file would start no one
        directory.mkdir(parents=True)

    def args(self, name: str) -> list[str]:
        return ["--ready", str(self.directory / f"ready-{name}"),
                "--go", str(self.directory / "go")]

    def release_when_ready(self, procs: Sequence[_ArmProcess], deadline: float) -> None:
        while time.monotonic() < deadline:
            if all((self.directory / f"ready-{p.name}").exists() for p in procs):
                break
            if any(p.proc.poll() is not None for p in procs):
                break  # one died during set-up: the others must not wait for ever
            time.sleep(0.01)
        (self.directory / "go").touch()


# --- salusd --------------------------------------------------------------------------------------

def salusd_binary(python: str) -> str:
    """``$SALUSD``, else the salusd beside the Python (``pip install .`` puts it there), else
    one on PATH; the same rule as ``salus.cli.salusd_binary``."""
    if os.environ.get("SALUSD"):
        return os.environ["SALUSD"]
    beside = Path(python).parent / "salusd"
    if beside.exists():
        return str(beside)
    found = shutil.which("salusd")
    if found is None:
        raise BenchError("no salusd: set SALUSD or install the salus package beside the Python")
    return found


class Daemon:
    """A salusd of the benchmark's own, on a socket in a fresh directory, stopped by its pid."""

    def __init__(self, ctx: Context, name: str, backend: str, memory: str, policy: str,
                 extra: Sequence[str] = ()) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix=f"salus-bench-{name}-"))
        self.socket = str(self.directory / "salusd.sock")
        ctx.logs.mkdir(parents=True, exist_ok=True)
        self.log = ctx.logs / f"{ctx.part}_salusd_{name}.log"
        argv = [salusd_binary(ctx.python), "--socket", self.socket, "--backend", backend,
                "--memory", memory, "--policy", policy, "--log-level", "warn", *extra]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         env=ctx.env, start_new_session=True)
        deadline = time.monotonic() + 15
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None:
                raise BenchError(f"salusd exited with {self.proc.returncode} at start: "
                                 f"{_tail(self.log)}")
            if time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"salusd did not make its socket within 15 s: {_tail(self.log)}")
            time.sleep(0.01)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
        return int(self.proc.returncode)

    def __enter__(self) -> "Daemon":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def salus_run(ctx: Context, daemon: Daemon, name: str, command: Sequence[str],
              extra: Sequence[str] = ()) -> list[str]:
    """The argv of ``salus run`` (through this Python's ``salus.cli``) for ``command`` as the job
    ``name`` of ``daemon``."""
    return [ctx.python, "-m", "salus.cli", "run", "--socket", daemon.socket, "--name", name,
            *extra, "--", *command]


# --- arm side ------------------------------------------------------------------------------------

def emit(result: dict[str, Any]) -> None:
    """The arm's result, for the driver; the environment it saw goes with it."""
    result = {**environment_of_arm(), **result}
    print(RESULT_TAG + json.dumps(result), flush=True)


def environment_of_arm() -> dict[str, Any]:
    """torch's and salus's versions and the GPU's name, as this arm sees them (where it imported
    them)."""
    salus = sys.modules.get("salus")
    out: dict[str, Any] = {"salus": getattr(salus, "__version__", None)} if salus else {}
    torch = sys.modules.get("torch")
    if torch is None:
        return out
    out.update({"torch": torch.__version__, "torch_cuda": torch.version.cuda})
    try:
        if torch.cuda.is_initialized():
            out["gpu_name"] = torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001: a fact for the report, never a reason to fail the arm
        pass
    return out


def wait_for_go(ready: Optional[str], go: Optional[str], limit_s: float = 300.0) -> None:
    """The arm's side of :class:`Barrier`: says it is ready, waits for the go."""
    if ready:
        Path(ready).touch()
    deadline = time.monotonic() + limit_s
    while go and not os.path.exists(go):
        if time.monotonic() > deadline:
            raise BenchError(f"no go file {go} within {limit_s:.0f} s")
        time.sleep(0.001)


def need_cuda() -> Any:
    """torch, having checked that it sees a CUDA GPU (a CPU-only wheel is named as such)."""
    import torch

    if not torch.cuda.is_available():
        raise BenchError(f"torch {torch.__version__} sees no CUDA GPU "
                         f"(CUDA build: {torch.version.cuda or 'none, a CPU-only wheel'})")
    return torch


# --- numbers -------------------------------------------------------------------------------------

def median(values: Iterable[float]) -> Optional[float]:
    values = list(values)
    return statistics.median(values) if values else None


def percentile(values: Sequence[float], q: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_loop(body: Callable[[], None], count: int) -> float:
    """Seconds per call of ``body`` over ``count`` calls."""
    start = time.perf_counter()
    for _ in range(count):
        body()
    return (time.perf_counter() - start) / count


def _fmt(value: Optional[float]) -> str:
    if value is None:
        return "-"
    if value == 0 or 0.01 <= abs(value) < 100000:
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return f"{value:.3e}"


def fmt(value: Optional[float]) -> str:
    return _fmt(value)


def _tail(path: Path, chars: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return "(no log)"


# --- arm side: Salus and devices -----------------------------------------------------------------

def torch_device(backend: str) -> str:
    """Where the arm's tensors live: the GPU, or (simulated backend) the CPU, whose allocations
    salus.torch routes into the simulated GPU's memory."""
    return "cuda" if backend == "cuda" else "cpu"


def prepare_torch(backend: str) -> Any:
    """torch, set up for the backend: on the simulator one intra-op thread (two-CPU machines:
    the arms' timings must not fight over cores), on CUDA a checked GPU."""
    if backend == "cuda":
        return need_cuda()
    import torch

    torch.set_num_threads(1)
    return torch


def salus_runtime(backend: str, enable_torch: bool = True, **options: Any) -> Any:
    """An in-process Salus runtime on ``backend``; PyTorch's allocations routed through it
    (before any CUDA work, as salus.torch requires) unless ``enable_torch`` is false."""
    import salus

    options.setdefault("policy", "fair")
    if backend == "sim":
        options.setdefault("memory", "4GiB")
    runtime = salus.Runtime(backend, **options)
    if enable_torch:
        import salus.torch as salus_torch

        salus_torch.enable(runtime)
    return runtime


def shared_runtime() -> Any:
    """Under ``salus run``: the runtime and job it set up before this script."""
    import salus.torch as salus_torch

    state = salus_torch._shared  # noqa: SLF001: the benchmark reads what salus run made
    if state is None:
        raise BenchError("this arm must run under 'salus run' (no shared job in this process)")
    return state.runtime, state.job


def arm_parser(description: str) -> Any:
    """The options every arm takes: which arm, the backend, and the barrier's files."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--backend", choices=["sim", "cuda"], default="sim")
    parser.add_argument("--ready", help="made once the arm is set up (Barrier)")
    parser.add_argument("--go", help="the arm starts measuring once this file exists")
    return parser
