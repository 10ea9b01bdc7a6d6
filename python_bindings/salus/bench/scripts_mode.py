"""``scripts`` mode: unmodified PyTorch training scripts, as processes, on one simulated GPU.

The scripts of ``[[scripts.script]]`` (``benchmarks/scripts``: they know nothing of Salus) run
the ways a user would run them, each arm on a salusd of its own:

1. **one at a time** (the baseline): each alone, one after the other;
2. **all at once, no Salus**: started together with no turns, each keeping the memory it
   allocated until it exits (``salusd --reclaim never``, the scripts resident jobs of
   ``salus run --kind inference``), as processes sharing a GPU without Salus keep what their
   caching allocators reserved: the sum of their peaks must fit, or a script fails;
3. **salusd POLICY**: started together under ``salus run``, taking turns at their optimizer
   steps under the daemon's policy, memory moving between them at turns.

The GPU is salusd's simulated one (``[cluster] gpu_memory``), so that every arm's memory is
counted by the same pages. Its compute is the CPUs of ``[scripts] cpus``: the scripts run
there, one thread each, while this harness and the daemon run on the other CPUs. JCT is from
the moment every script was submitted (time 0) to its process's exit, its start-up (importing
PyTorch) included, as a user waits for it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import Error
from ..policies import BUILTIN_POLICIES
from .errors import InputError, ModeNotSupported
from .experiment import Experiment, Variant
from .results import DeviceResult, JobResult, Timeline, VariantResult, trace_name

MiB = 1 << 20
ONE_AT_A_TIME = "one at a time"
NO_SALUS = "all at once, no Salus"
_BASELINE, _NO_SALUS, _SALUS = "baseline", "no-salus", "compare"
_SAMPLE_SECONDS = 0.1


@dataclass(frozen=True)
class Script:
    name: str
    path: Path
    args: tuple[str, ...]


@dataclass(frozen=True)
class ScriptsPlan:
    """The ``[scripts]`` table, checked: the files exist and the CPUs are this process's."""

    scripts: tuple[Script, ...]
    gpu_memory: int
    steps: Optional[int]
    cpus: tuple[int, ...]
    timeout: float

    @classmethod
    def of(cls, exp: Experiment) -> "ScriptsPlan":
        cfg = exp.section("scripts")
        folder = exp.path.parent / str(cfg.get("folder", "."))
        scripts = []
        for i, raw in enumerate(cfg["script"]):
            path = (folder / raw["path"]).resolve()
            if not path.is_file():
                raise exp.error(("scripts", "script", str(i), "path"), f"no such file: {path}")
            scripts.append(Script(raw["name"], path, tuple(raw.get("args", []))))
        names = [s.name for s in scripts]
        if len(set(names)) != len(names):
            raise exp.error(("scripts", "script"), f"script names repeat: {names}")
        mine = os.sched_getaffinity(0)
        # Not given: the first CPU this process may use (CPU 0 may not be among them).
        cpus = tuple(int(c) for c in cfg.get("cpus", [min(mine)]))
        if not set(cpus) <= mine:
            raise exp.error(("scripts", "cpus"), f"CPUs {sorted(set(cpus) - mine)} are not "
                            f"among this process's ({sorted(mine)})")
        steps = cfg.get("steps")
        return cls(tuple(scripts), exp.gpu_memory, int(steps) if steps else None, cpus,
                   float(cfg.get("timeout_seconds", 600.0)))


def script_arms(exp: Experiment, policies: Optional[list[str]] = None) -> list[Variant]:
    """One at a time (the baseline), all at once without Salus, then salusd's policies (the
    file's ``[scripts] policies`` or ``--policies``)."""
    chosen = policies if policies is not None else list(
        exp.section("scripts").get("policies", ["fair", "pack", "memory_aware"]))
    for policy in chosen:
        if policy not in BUILTIN_POLICIES:
            raise InputError("<command line>", None, "--policies",
                             f"{policy!r} is not a built-in policy: salusd knows only those "
                             f"({', '.join(BUILTIN_POLICIES)})")
    arms = [Variant(ONE_AT_A_TIME, "-", "alone, in turn", 1, 1, group=_BASELINE),
            Variant(NO_SALUS, "none", "all at once, memory kept", 1, 1, group=_NO_SALUS)]
    return arms + [Variant(f"salusd {p}", p, "salus run", 1, 1, group=_SALUS) for p in chosen]


def check_scripts(exp: Experiment) -> None:
    """ModeNotSupported, before any output, when the scripts cannot run here."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise ModeNotSupported(exp.name, "scripts", f"PyTorch is not installed ({e})") from None
    from ..cli import salusd_binary

    salusd_binary()  # DeviceError naming where it looked
    ScriptsPlan.of(exp)


# --- one arm -------------------------------------------------------------------------------

@dataclass
class ScriptRun:
    """One script's process in an arm: when it started and exited, what it wrote."""

    script: Script
    started: float
    exited: float
    code: int
    log: Optional[dict[str, Any]]  # its --log (None: it did not get to write it)
    stats: Optional[dict[str, Any]]  # salus run --stats
    error: str


class _Daemon:
    """A salusd of this arm's own, in a temporary folder (a socket path must be short)."""

    def __init__(self, args: list[str]) -> None:
        from ..cli import ensure_daemon

        self.folder = tempfile.mkdtemp(prefix="salus-bench-")
        self.socket = os.path.join(self.folder, "salusd.sock")
        ensure_daemon(self.socket, args)

    def device_bytes(self) -> tuple[int, int]:
        """Device 0's granted and peak bytes."""
        from ..cli import device_use

        use = device_use(self.socket)[0]
        return use.granted, use.peak

    def stop(self) -> None:
        from ..cli import stop_daemon

        stop_daemon(self.socket)
        shutil.rmtree(self.folder, ignore_errors=True)


def _cpu_busy(cpus: tuple[int, ...]) -> float:
    """Seconds the CPUs have spent busy since boot (``/proc/stat``), summed."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[:7])
                total += (user + nice + system + irq + softirq) / tick
    return total


class _Sampler(threading.Thread):
    """Every 0.1 s: the daemon's granted bytes and the scripts' CPUs' busy share."""

    def __init__(self, daemon: _Daemon, cpus: tuple[int, ...]) -> None:
        super().__init__(daemon=True)
        self._daemon, self._cpus = daemon, cpus
        self._halt = threading.Event()
        self.samples: list[tuple[float, float, float]] = []  # time, busy share, bytes

    def run(self) -> None:
        last_t, last_busy = time.time(), _cpu_busy(self._cpus)
        while not self._halt.wait(_SAMPLE_SECONDS):
            t, busy = time.time(), _cpu_busy(self._cpus)
            try:
                granted, _ = self._daemon.device_bytes()
            except (Error, subprocess.TimeoutExpired):
                return  # the daemon is gone: the arm is ending, or failed (its caller says)
            share = (busy - last_busy) / max(1e-9, (t - last_t) * len(self._cpus))
            self.samples.append((t, min(1.0, share), float(granted)))
            last_t, last_busy = t, busy

    def finish(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()


def _daemon_args(plan: ScriptsPlan, variant: Variant, trace: Path) -> list[str]:
    args = ["--backend", "sim", "--memory", f"{plan.gpu_memory}B", "--log-level", "warn",
            "--trace", str(trace)]
    if variant.group == _NO_SALUS:
        return args + ["--policy", "fifo", "--reclaim", "never"]
    return args + ["--policy", "fifo" if variant.group == _BASELINE else variant.policy]


def _launch(plan: ScriptsPlan, script: Script, variant: Variant, socket: str,
            files: Path) -> subprocess.Popen[bytes]:
    """``salus run`` of the script, on the scripts' CPUs, one thread of PyTorch's."""
    kind = "inference" if variant.group == _NO_SALUS else "training"
    stats, log = files / f"{script.name}.stats", files / f"{script.name}.json"
    command = [sys.executable, "-m", "salus.cli", "run", "--socket", socket,
               "--name", script.name, "--kind", kind, "--stats", str(stats),
               "--", sys.executable, str(script.path), "--log", str(log),
               *(["--steps", str(plan.steps)] if plan.steps else []), *script.args]
    taskset = shutil.which("taskset")
    if taskset:
        command = [taskset, "-c", ",".join(str(c) for c in plan.cpus), *command]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    err = open(files / f"{script.name}.err", "wb")
    with err:
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env,
                                preexec_fn=None if taskset else
                                (lambda: os.sched_setaffinity(0, plan.cpus)))


def _wait(procs: dict[str, subprocess.Popen[bytes]], deadline: float) -> dict[str, float]:
    """Exit times (``time.time()``); kills what is still running at the deadline."""
    exited: dict[str, float] = {}
    while len(exited) < len(procs):
        for name, proc in procs.items():
            if name not in exited and proc.poll() is not None:
                exited[name] = time.time()
        if time.time() > deadline:
            for name, proc in procs.items():
                if name not in exited:
                    proc.kill()
                    proc.wait()
                    exited[name] = time.time()
            break
        time.sleep(0.01)
    return exited


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _error_of(code: int, err: Path, timed_out: bool) -> str:
    if code == 0:
        return ""
    if timed_out:
        return "timed out"
    lines = [ln for ln in err.read_text(errors="replace").splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else f"exit status {code}"
    return last[:400]


@dataclass
class ArmRun:
    t0: float
    runs: list[ScriptRun]
    samples: list[tuple[float, float, float]]
    peak_bytes: int
    busy_seconds: float


def _run_scripts(plan: ScriptsPlan, variant: Variant, socket: str, files: Path,
                 procs: dict[str, subprocess.Popen[bytes]], deadline: float,
                 ) -> tuple[dict[str, float], dict[str, float]]:
    """Starts the scripts (the baseline one after another, the others together) into
    ``procs``; returns when each started and exited."""
    started: dict[str, float] = {}
    exited: dict[str, float] = {}
    for script in plan.scripts:
        started[script.name] = time.time()
        procs[script.name] = _launch(plan, script, variant, socket, files)
        if variant.group == _BASELINE:
            exited.update(_wait({script.name: procs[script.name]}, deadline))
    if variant.group != _BASELINE:
        exited = _wait(procs, deadline)
    return started, exited


def _run_arm(plan: ScriptsPlan, variant: Variant, folder: Path) -> ArmRun:
    files = folder / "scripts" / re.sub(r"[^A-Za-z0-9_.-]+", "_", variant.label)
    files.mkdir(parents=True, exist_ok=True)
    # The daemon and this harness on the other CPUs (where there are any): the scripts' CPUs are
    # the simulated GPU's compute, and only the scripts run there.
    mine = os.sched_getaffinity(0)
    others = mine - set(plan.cpus)
    if others:
        os.sched_setaffinity(0, others)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    daemon: Optional[_Daemon] = None
    sampler: Optional[_Sampler] = None
    try:
        daemon = _Daemon(_daemon_args(plan, variant, folder / trace_name(variant)))
        sampler = _Sampler(daemon, plan.cpus)
        t0, busy0 = time.time(), _cpu_busy(plan.cpus)
        sampler.start()
        deadline = t0 + plan.timeout
        started, exited = _run_scripts(plan, variant, daemon.socket, files, procs, deadline)
        busy = _cpu_busy(plan.cpus) - busy0
        sampler.finish()
        _, peak = daemon.device_bytes()
    finally:
        if sampler is not None:
            sampler.finish()
        for proc in procs.values():  # an error or ^C here: no script outlives the arm
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if daemon is not None:
            daemon.stop()
        if others:
            os.sched_setaffinity(0, mine)
    runs = []
    for script in plan.scripts:
        code = procs[script.name].returncode
        timed_out = code is not None and code < 0 and exited[script.name] >= deadline
        runs.append(ScriptRun(script, started[script.name], exited[script.name], code,
                              _read_json(files / f"{script.name}.json"),
                              _read_json(files / f"{script.name}.stats"),
                              _error_of(code, files / f"{script.name}.err", timed_out)))
    return ArmRun(t0, runs, sampler.samples, peak, busy / len(plan.cpus))


# --- results -------------------------------------------------------------------------------

def _training_seconds(run: ScriptRun) -> float:
    """From its first step's start to its last step's end, as the script logged them."""
    steps = run.log["steps"] if run.log else []
    return float(steps[-1][1] - steps[0][0]) if steps else 0.0


def _job_result(run: ScriptRun, t0: float, alone: dict[str, float]) -> JobResult:
    steps = run.log["steps"] if run.log else []
    work = alone.get(run.script.name) or _training_seconds(run)
    first = float(steps[0][0]) - t0 if steps else run.exited - t0
    stats = run.stats or {}
    return JobResult(name=run.script.name, workload=run.script.path.name, kind="training",
                     device=0, arrival=0.0, first_start=first, finish=run.exited - t0,
                     attained=0.0 if run.error else work, work=work,
                     waiting=float(stats.get("waiting_seconds", 0.0)),
                     max_wait=float(stats.get("max_wait_seconds", 0.0)),
                     iterations=len(steps), error=run.error)


def _variant_result(variant: Variant, arm: ArmRun, alone: dict[str, float],
                    alone_jct: dict[str, float], alone_weights: dict[str, str]) -> VariantResult:
    jobs = [_job_result(r, arm.t0, alone) for r in arm.runs]
    makespan = max((j.finish for j in jobs), default=0.0)
    finished = [r for r in arm.runs if not r.error and r.log]
    same = sum(1 for r in finished if alone_weights.get(r.script.name) == r.log["weights"])
    busy = min(arm.busy_seconds, makespan)
    device = DeviceResult(device=0, busy=busy, utilization=busy,
                          work=sum(j.work for j in jobs), peak_memory=arm.peak_bytes,
                          jobs=len(jobs))
    times = [t - arm.t0 for t, _, _ in arm.samples]
    alive = [float(sum(1 for r in arm.runs if r.started <= t + arm.t0 < r.exited))
             for t in times]
    timeline = Timeline(device=0, time=times, utilization=[u for _, u, _ in arm.samples],
                        running=alive, memory=[m for _, _, m in arm.samples],
                        waiting=[0.0] * len(times))  # turns are in the daemon's trace
    steps = sum(j.iterations for j in jobs)
    startup = [float(r.log["steps"][0][0]) - r.started for r in finished if r.log["steps"]]
    # A failed script is run again, alone, after the others: what its failure costs.
    rerun = sum(alone_jct.get(j.name, 0.0) for j in jobs if j.error)
    extra = {"failed_jobs": float(len(jobs) - len(finished)),
             "makespan_with_reruns": makespan + rerun,
             "weights_as_alone": float(same),
             "mean_startup_seconds": sum(startup) / len(startup) if startup else 0.0}
    return VariantResult(variant, makespan, steps / makespan if makespan > 0 else 0.0, jobs,
                         [device], timelines=[timeline], trace=trace_name(variant), extra=extra)


def scripts_variants(exp: Experiment, variants: list[Variant], folder: Path,
                     progress: Callable[[str], None]) -> tuple[list[VariantResult], list[str]]:
    check_scripts(exp)
    plan = ScriptsPlan.of(exp)
    arms: list[tuple[Variant, ArmRun]] = []
    for variant in variants:
        progress(variant.label)
        arms.append((variant, _run_arm(plan, variant, folder)))
    base = next((arm for v, arm in arms if v.group == _BASELINE), None)
    alone: dict[str, float] = {}
    alone_jct: dict[str, float] = {}  # the script's process alone, start-up included
    alone_weights: dict[str, str] = {}
    if base is not None:
        for r in base.runs:
            if not r.error and r.log:
                alone[r.script.name] = _training_seconds(r)
                alone_jct[r.script.name] = r.exited - r.started
                alone_weights[r.script.name] = r.log["weights"]
    results = [_variant_result(v, arm, alone, alone_jct, alone_weights) for v, arm in arms]
    return results, _notes(plan, arms, results, alone)


def _notes(plan: ScriptsPlan, arms: list[tuple[Variant, ArmRun]],
           results: list[VariantResult], alone: dict[str, float]) -> list[str]:
    names = ", ".join(f"{s.name} ({s.path.name} {' '.join(s.args)})".replace(" )", ")")
                      for s in plan.scripts)
    per_arm = []
    for r in results:
        done = len(r.jobs) - int(r.extra["failed_jobs"])
        per_arm.append(f"{r.variant.label}: {done} of {len(r.jobs)} finished, "
                       f"{r.extra['weights_as_alone']:.0f} with weights bitwise equal to the "
                       f"script alone; start-up {r.extra['mean_startup_seconds']:.1f} s a script")
    notes = [
        f"scripts mode: {len(plan.scripts)} unmodified PyTorch scripts ({names}"
        + (f", --steps {plan.steps}" if plan.steps else "") + ") on one simulated GPU of "
        f"{plan.gpu_memory / MiB:g} MiB (salusd --backend sim); their compute is CPU "
        f"{','.join(str(c) for c in plan.cpus)} (one PyTorch thread each), the daemon and the "
        "harness run on the other CPUs",
        "per arm: " + "; ".join(per_arm),
        "training time alone (the baseline's, from each script's first step to its last): "
        + ", ".join(f"{n} {s:.2f} s" for n, s in alone.items()),
        "utilization: the share of the makespan the scripts' CPUs (the GPU's compute) were "
        "busy, from /proc/stat, whatever with (PyTorch's import and failed scripts' work "
        "included), as nvidia-smi's utilization counts a GPU busy; makespan_with_reruns: the "
        "makespan plus each failed script's time alone, as if it ran again afterwards",
        "JCT: from time 0 (every script submitted; one at a time queues them) to the script's "
        "exit, PyTorch's import included; peak memory: the most pages the daemon had granted "
        "at once",
        "no Salus: each process keeps every page it was given until it exits (salusd "
        "--reclaim never, one page per ask) and takes no turns; PyTorch's caching allocator "
        "also keeps what it reserved, in segments of 2 to 20 MiB where Salus takes 2 MiB pages, "
        "and its processes would each hold a CUDA context too (not modelled: every arm would pay "
        "it)",
        "model, and where it differs from a GPU: the arithmetic is on a CPU, so scripts running "
        "at once share it as the OS schedules threads (time slices of milliseconds), where a "
        "GPU time-slices between processes' contexts or, with MPS, runs their kernels side by "
        "side; a script's host work (Python, PyTorch's dispatch) runs on the same CPU as its "
        "'GPU' work and counts as such",
    ]
    return notes
