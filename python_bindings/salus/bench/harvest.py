"""The harvesting experiment (after HUVM/memHarvester, ATC'22) in ``run`` mode: the C++ study.

``benchmarks/harvest_study.cpp`` (the ``salus_harvest_study`` binary) measures what spilling
costs by making an iteration's time depend on where its pages live: each layer copies its
buffers, page by page, into a scratch page on GPU 0, on the job's stream, and the simulated
backend times each copy by the link the page sits behind (NVLink to a peer, PCIe to the host),
with the links slowed by a scale factor. Those pieces (throttled copies, per-link bandwidths, the
move observer, the activation counters) are C++ only, so rather than re-creating the study in
Python with iteration times that would not depend on the tiers, this mode runs the binary and
turns its JSON into the harness's usual files.

The binary is ``$SALUS_HARVEST_STUDY``, else ``build/benchmarks/salus_harvest_study`` of the
checkout (found as the experiments are: next to the experiment file, the working directory or
this package). ``[harvest]`` gives its ``--iterations``, ``--warmup``, ``--gpu-mib`` (from
``gpu_memory``) and ``--configs``; what the binary fixes (the policy, the four-GPU NVLink mesh,
the two jobs' shapes) is checked against the file, so a summary never describes a study that
did not run. Its ``--json`` goes into the output folder (``harvest_study.json``) and its traces
too (``--trace <folder>/trace-``, so they are the ``trace-<config>.json`` every mode writes).
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import Error
from .errors import ModeNotSupported
from .experiment import Experiment, Paper, Variant
from .results import DeviceResult, JobResult, VariantResult, trace_name

BINARY_ENV = "SALUS_HARVEST_STUDY"
BINARY_NAME = "salus_harvest_study"
BUILD_COMMAND = "cmake -S . -B build && cmake --build build --target salus_harvest_study"
STUDY_JSON = "harvest_study.json"
ITERATIONS_CSV = "iterations.csv"
PLOT = "harvest_bars.png"
# A study that hangs (a job never admitted again waits forever) must not hang the harness; the
# full scale takes about half a minute, so this is far beyond any run that is making progress.
TIMEOUT_SECONDS = 1800.0
STDERR_TAIL_LINES = 20

# What salus_harvest_study fixes (no option changes it): the experiment file must say the same.
FIXED = {"policy": "fair", "gpus": 4, "topology": "nvlink_mesh"}
# --gpu-mib's range in the binary (CLI::Range(64, 4096)).
GPU_MIB_RANGE = (64, 4096)
# The [harvest] keys passed on when present, for when the schema lets the file set them (the
# binary's defaults otherwise; summary notes report the values the study used, from its JSON).
OPTIONAL_FLAGS = {"scale": "--scale", "compute_scale": "--compute-scale"}

MiB = 1 << 20
# Page-move routes as the study names them (tiers seen from GPU 0), in the order shown.
ROUTE_ORDER = ("local->host", "host->local", "local->peer", "peer->local", "peer->host",
               "host->peer")

_NOT_SUPPORTED = {
    "simulate": "the discrete-event simulator has no memory tiers: it cannot spill to peer GPUs "
                "or the host",
    "torch": "PyTorch jobs would not exercise spilling: the study needs page-level control of "
             "where a job's buffers live and copies timed by the link they cross",
}


class StudyFailed(Error, RuntimeError):
    """``salus_harvest_study`` did not finish or wrote no usable JSON. Fields: ``command`` (the
    argument list), ``returncode`` (``None`` when it was killed for taking too long) and
    ``stderr_tail`` (its last lines of output, stderr first, where the cause usually is)."""

    command: list[str]
    returncode: Optional[int]
    stderr_tail: str

    def __init__(self, command: list[str], returncode: Optional[int], stderr_tail: str,
                 reason: str = "") -> None:
        what = reason or (f"exited with status {returncode}" if returncode is not None
                          else "was stopped")
        tail = f"; its output ended with:\n{stderr_tail}" if stderr_tail else ""
        super().__init__(f"{BINARY_NAME} {what} (command: {' '.join(command)}){tail}",
                         command=list(command), returncode=returncode, stderr_tail=stderr_tail)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.command, self.returncode, self.stderr_tail))


# --- before the run -----------------------------------------------------------------------------

def check_harvest(exp: Experiment, mode: str) -> None:
    """Says before any output is written whether the study can run: raises ModeNotSupported in
    ``simulate`` and ``torch`` modes and when the binary is not built, InputError when the file
    asks for something the binary does not do."""
    if mode != "run":
        raise ModeNotSupported(exp.name, mode, _NOT_SUPPORTED.get(mode, "run mode only"))
    _check_fixed(exp)
    gpu_mib(exp)
    find_binary(exp)


def find_binary(exp: Experiment) -> Path:
    """``$SALUS_HARVEST_STUDY`` when set (and then only it: a wrong path is a mistake to report,
    not a reason to pick another binary), else the checkout's ``build/benchmarks/``."""
    env = os.environ.get(BINARY_ENV)
    if env:
        path = Path(env)
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
        raise ModeNotSupported(exp.name, "run", f"${BINARY_ENV} is {env}, which is not an "
                               f"executable file; build the study in the checkout with "
                               f"`{BUILD_COMMAND}` and point ${BINARY_ENV} at "
                               f"build/benchmarks/{BINARY_NAME} (or unset it)")
    looked: list[Path] = []
    for base in _checkout_candidates(exp):
        candidate = base / "build" / "benchmarks" / BINARY_NAME
        if candidate in looked:
            continue
        looked.append(candidate)
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate.resolve()
    where = ", ".join(str(p) for p in looked[:3]) + (", ..." if len(looked) > 3 else "")
    raise ModeNotSupported(exp.name, "run", f"the harvesting study runs the C++ binary "
                           f"{BINARY_NAME}, which is not built (looked for {where}); build it "
                           f"in the checkout with `{BUILD_COMMAND}`, or set ${BINARY_ENV} to "
                           "its path")


def _checkout_candidates(exp: Experiment) -> list[Path]:
    """Where a checkout may be, in the order experiments are looked up: around the experiment
    file, the working directory, then this package (an editable or in-tree install)."""
    bases = [exp.path.parent, *exp.path.parents, Path.cwd(), *Path.cwd().resolve().parents,
             *Path(__file__).resolve().parents]
    return [b for b in bases if (b / "benchmarks").is_dir()]


def _check_fixed(exp: Experiment) -> None:
    harvest = exp.section("harvest")
    for key, value in FIXED.items():
        if key in harvest and harvest[key] != value:
            raise exp.error(("harvest", key), f"{BINARY_NAME} runs {key} = {value!r} only "
                            f"(benchmarks/harvest_study.cpp fixes it), not {harvest[key]!r}")


def gpu_mib(exp: Experiment) -> int:
    """GPU 0's memory in the spilling runs, in MiB: ``[harvest] gpu_memory``, else the cluster's
    (they must agree: the summary reports the cluster's)."""
    harvest = exp.section("harvest")
    key = ("harvest", "gpu_memory") if "gpu_memory" in harvest else ("cluster", "gpu_memory")
    size = int(harvest.get("gpu_memory", exp.gpu_memory))
    if size != exp.gpu_memory:
        raise exp.error(key, f"must equal [cluster] gpu_memory ({exp.gpu_memory} bytes), which "
                        "the summary reports")
    low, high = GPU_MIB_RANGE
    if size % MiB or not low <= size // MiB <= high:
        raise exp.error(key, f"{BINARY_NAME} takes a whole number of MiB from {low} to {high} "
                        f"(--gpu-mib), got {size} bytes")
    return size // MiB


def study_command(exp: Experiment, binary: Path, folder: Path,
                  configs: list[str]) -> list[str]:
    """The binary's argument list; --configs last, as it takes every word up to the end."""
    harvest = exp.section("harvest")
    command = [str(binary), "--iterations", str(int(harvest.get("iterations", 10))),
               "--warmup", str(int(harvest.get("warmup", 2))), "--gpu-mib", str(gpu_mib(exp))]
    for key, flag in OPTIONAL_FLAGS.items():
        if key in harvest:
            command += [flag, f"{float(harvest[key]):g}"]
    command += ["--json", str(folder / STUDY_JSON), "--trace", str(folder / "trace-"),
                "--configs", *configs]
    return command


# --- the run ------------------------------------------------------------------------------------

def run_harvest(exp: Experiment, mode: str, folder: Path,
                progress: Callable[[str], None]) -> tuple[list[VariantResult], list[str]]:
    """Runs the study once for every variant (configuration) and returns one VariantResult per
    configuration, plus notes: the harvesting table, the simulation's assumptions, the files."""
    check_harvest(exp, mode)
    folder = Path(folder).resolve()
    variants = exp.variants()
    configs = [v.spill for v in variants]
    # Stale outputs of an earlier run in the same folder must not pass for this run's.
    for stale in [folder / STUDY_JSON, *(folder / trace_name(v) for v in variants)]:
        stale.unlink(missing_ok=True)
    command = study_command(exp, find_binary(exp), folder, configs)
    _run_study(command, configs, progress)
    data = _load_study(command, folder / STUDY_JSON, configs)
    _check_jobs(exp, data)
    results = study_results(variants, data, folder)
    write_iterations_csv(folder / ITERATIONS_CSV, data)
    plotted = write_harvest_plot(folder / PLOT, data, exp.paper, exp.name)
    return results, study_notes(exp, data, plotted)


def _run_study(command: list[str], configs: list[str],
               progress: Callable[[str], None]) -> None:
    """Runs the binary (no shell), advancing the progress bar as it reports each configuration
    done; raises StudyFailed on a non-zero exit or after TIMEOUT_SECONDS."""
    pending = list(configs)
    progress(pending[0])
    stdout_lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, text=True,
                                errors="replace")
        fired = threading.Event()

        def stop() -> None:
            fired.set()
            proc.kill()

        timer = threading.Timer(TIMEOUT_SECONDS, stop)
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                stdout_lines.append(line.rstrip("\n"))
                # "ran <config> in 1.4 s": the next configuration starts.
                words = line.split()
                if len(words) >= 2 and words[0] == "ran" and words[1] in pending:
                    pending.remove(words[1])
                    if pending:
                        progress(pending[0])
            returncode = proc.wait()
        except BaseException:  # KeyboardInterrupt included: leave no study running
            proc.kill()
            proc.wait()
            raise
        finally:
            timer.cancel()
        err.seek(0)
        stderr_lines = err.read().splitlines()
    if returncode != 0:
        tail = _tail(stderr_lines, stdout_lines)
        if fired.is_set():
            raise StudyFailed(command, None, tail, f"took longer than {TIMEOUT_SECONDS:g} s "
                              "and was stopped")
        raise StudyFailed(command, returncode, tail)


def _tail(stderr_lines: list[str], stdout_lines: list[str]) -> str:
    """The last lines of stderr, then of stdout: the study reports a failed configuration on
    stderr but corrupted weights on stdout (its report table), and either may explain it."""
    parts = []
    if stderr_lines:
        parts.append("\n".join(stderr_lines[-STDERR_TAIL_LINES:]))
    if stdout_lines:
        parts.append("[stdout] " + "\n".join(stdout_lines[-STDERR_TAIL_LINES // 2:]))
    return "\n".join(parts)


def _load_study(command: list[str], path: Path, configs: list[str]) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise StudyFailed(command, 0, "", f"exited normally but its JSON ({path}) cannot be "
                          f"read: {e}") from None
    ran = [c.get("name") for c in data.get("configs", [])]
    missing = [c for c in configs if c not in ran]
    if missing or "jobs" not in data or "options" not in data:
        raise StudyFailed(command, 0, "", f"wrote JSON without configurations {missing} or its "
                          "jobs and options: is the binary older than this package?")
    return data


def _check_jobs(exp: Experiment, data: dict[str, Any]) -> None:
    """The [[harvest.job]] tables must be the jobs the binary ran (its shapes are fixed)."""
    written = exp.section("harvest").get("job", [])
    ran = data["jobs"]
    compute_scale = float(data["options"].get("compute_scale", 1.0))
    if len(written) != len(ran):
        raise exp.error(("harvest", "job"), f"{BINARY_NAME} runs {len(ran)} jobs "
                        f"({', '.join(j['name'] for j in ran)}), the file has {len(written)}")
    fields = (("name", "name", 1.0), ("persistent", "persistent_fraction", 1.0),
              ("ephemeral", "ephemeral_fraction", 1.0), ("layers", "layers", 1.0),
              ("forward_ms", "forward_ms_per_layer", compute_scale))
    for i, (mine, theirs) in enumerate(zip(written, ran)):
        for key, field, factor in fields:
            ours = mine[key] if key == "name" else float(mine[key]) * factor
            same = ours == theirs[field] if key == "name" else \
                math.isclose(ours, float(theirs[field]), rel_tol=1e-6)
            if not same:
                raise exp.error(("harvest", "job", str(i), key),
                                f"{BINARY_NAME} runs job {theirs['name']} with {field} = "
                                f"{theirs[field]!r} (benchmarks/harvest_study.cpp fixes the jobs)")


# --- the study's JSON in the harness's shapes ---------------------------------------------------

def _configs(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in data["configs"]}


def _round_seconds(config: dict[str, Any]) -> float:
    """One turn of every job: the sum of the jobs' mean iteration times."""
    return sum(float(j["mean_ms"]) for j in config["jobs"]) / 1e3


def _route_key(route: str) -> str:
    return route.replace("->", "_to_")


def _routes(data: dict[str, Any]) -> list[str]:
    seen = {r for c in data["configs"] for r in c.get("moves", {})}
    return [r for r in ROUTE_ORDER if r in seen] + sorted(seen - set(ROUTE_ORDER))


def study_results(variants: list[Variant], data: dict[str, Any],
                  folder: Path) -> list[VariantResult]:
    """One VariantResult per configuration. The study has no arrivals or completions: both jobs
    run until each has done ``iterations`` inside the measurement window, so a job's "JCT" and
    the makespan are that window, ``attained`` is the job's turns on GPU 0's lane and ``work``
    the same iterations at no-spill pace (the time they take with room enough). The harvesting
    numbers proper are in ``extra`` (so in summary.json's metrics): seconds and bytes."""
    by_name = _configs(data)
    base = by_name.get("no-spill")
    host = by_name.get("host-only")
    results = []
    for variant in variants:
        config = by_name[variant.spill]
        window = float(config["window_seconds"])
        jobs = []
        extra: dict[str, float] = {}
        for k, job in enumerate(config["jobs"]):
            name = job["name"]
            times = [t / 1e3 for t in job["iteration_ms"]]
            base_mean = float(base["jobs"][k]["mean_ms"]) / 1e3 if base else math.nan
            attained = sum(times)
            jobs.append(JobResult(
                name=name,
                workload=f"{job['persistent_mib']:.0f} MiB persistent + "
                         f"{job['ephemeral_peak_mib']:.0f} MiB activations",
                kind="training", device=0, arrival=0.0, first_start=0.0, finish=window,
                attained=attained, work=base_mean * len(times),
                waiting=max(window - attained, 0.0), max_wait=math.nan,
                iterations=len(times)))
            extra[f"iteration_time_{name}"] = float(job["mean_ms"]) / 1e3
            extra[f"iteration_sd_{name}"] = float(job["stddev_ms"]) / 1e3
            if job.get("ratio_to_no_spill") is not None:
                extra[f"slowdown_{name}"] = float(job["ratio_to_no_spill"])
            if host is not None:
                extra[f"speedup_over_host_only_{name}"] = \
                    float(host["jobs"][k]["mean_ms"]) / float(job["mean_ms"])
            if job.get("prefetch_hit_rate") is not None:
                extra[f"prefetch_hit_rate_{name}"] = float(job["prefetch_hit_rate"])
        extra["round_time"] = _round_seconds(config)
        if base is not None:
            extra["slowdown"] = extra["round_time"] / _round_seconds(base)
        if host is not None:
            extra["speedup_over_host_only"] = _round_seconds(host) / extra["round_time"]
        for route, moved in config.get("moves", {}).items():
            extra[f"moved_bytes_{_route_key(route)}"] = float(moved["bytes"])
        busy = min(sum(j.attained for j in jobs), window)
        trace = trace_name(variant)
        results.append(VariantResult(
            variant=variant, makespan=window,
            throughput=sum(j.iterations for j in jobs) / window if window > 0 else 0.0,
            jobs=jobs,
            devices=[DeviceResult(device=0, busy=busy, utilization=busy,
                                  work=sum(j.work for j in jobs),
                                  peak_memory=_gpu0_peak(config), jobs=len(jobs))],
            trace=trace if (folder / trace).is_file() else None, extra=extra))
    return results


def _gpu0_peak(config: dict[str, Any]) -> int:
    """An estimate of GPU 0's peak (the study measures each job's own bytes only): a job's
    local bytes at the end of its forward pass, plus the others' persistent bytes (between turns
    they hold nothing else), at most Salus's limit on GPU 0."""
    jobs = config["jobs"]
    persistent = sum(float(j["persistent_mib"]) for j in jobs)
    peak = max((float(j["live_mib_at_forward_end_by_tier"]["local"]) + persistent
                - float(j["persistent_mib"]) for j in jobs), default=0.0)
    return int(min(peak, float(config["gpu0_limit_mib"])) * MiB)


def write_iterations_csv(path: Path, data: dict[str, Any]) -> None:
    """Every measured iteration (jobs.csv has one row per job): for distributions and checks."""
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(("config", "spill", "job", "iteration", "iteration_seconds"))
        for config in data["configs"]:
            for job in config["jobs"]:
                for i, ms in enumerate(job["iteration_ms"]):
                    writer.writerow((config["name"], config["spill"], job["name"], i,
                                     f"{ms / 1e3:.6f}"))


# --- notes, table and plot ----------------------------------------------------------------------

def _x(value: Optional[float]) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _pct(value: Optional[float]) -> str:
    return "–" if value is None else f"{value * 100:.0f}%"


def harvest_table(data: dict[str, Any], paper: Optional[Paper]) -> str:
    """The study's comparison in Markdown: per configuration, each job's mean iteration time
    (± standard deviation, and its slowdown vs no-spill), one round of all jobs, its slowdown
    and speedup over host-only (the paper's number beside peer-first's), the prefetch hit rate
    per job where there were moves, then the bytes moved per route."""
    by_name = _configs(data)
    base, host = by_name.get("no-spill"), by_name.get("host-only")
    names = [j["name"] for j in data["jobs"]]
    rates = any(j.get("prefetch_hit_rate") is not None for c in data["configs"] for j in c["jobs"])
    head = ["config"] + [f"{n} iteration" for n in names] + \
        ["round (" + " + ".join(names) + ")", "slowdown vs no-spill", "speedup over host-only"]
    if rates:
        head.append("prefetch hit rate (" + " / ".join(names) + ")")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for config in data["configs"]:
        cells = [config["name"]]
        for job in config["jobs"]:
            ratio = job.get("ratio_to_no_spill")
            cells.append(f"{job['mean_ms']:.0f} ± {job['stddev_ms']:.0f} ms"
                         + (f" ({ratio:.2f}x)" if ratio is not None else ""))
        round_s = _round_seconds(config)
        cells.append(f"{round_s * 1e3:.0f} ms")
        cells.append(_x(round_s / _round_seconds(base)) if base else "–")
        speedup = _x(_round_seconds(host) / round_s) if host else "–"
        if paper is not None and paper.variant == config["name"]:
            speedup += f" (paper: up to {paper.value:g}x)"
        cells.append(speedup)
        if rates:
            cells.append(" / ".join(_pct(j.get("prefetch_hit_rate")) for j in config["jobs"]))
        lines.append("| " + " | ".join(cells) + " |")
    routes = _routes(data)
    if routes:
        lines += ["", "Page moves inside the window, by route (tiers seen from GPU 0): MiB "
                  "moved, and by reason:", ""]
        lines += ["| config | " + " | ".join(r.replace("->", " → ") for r in routes) + " |",
                  "|" + "---|" * (len(routes) + 1)]
        for config in data["configs"]:
            moves = config.get("moves", {})
            cells = [config["name"]]
            for route in routes:
                moved = moves.get(route)
                if moved is None:
                    cells.append("0")
                    continue
                reasons = ", ".join(f"{r} {b / MiB:.0f}"
                                    for r, b in sorted(moved["bytes_by_reason"].items()))
                cells.append(f"{moved['bytes'] / MiB:.0f} ({reasons})")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def study_notes(exp: Experiment, data: dict[str, Any], plotted: bool) -> list[str]:
    """The table first (summary.md has no column for the study's numbers, so it goes in the
    notes, after a blank line so that it renders as a table), then how to read the numbers."""
    opts = data["options"]
    jobs = ", ".join(f"{j['name']} {j['layers']} layers x {j['forward_ms_per_layer']:g} ms"
                     for j in data["jobs"])
    files = [STUDY_JSON, ITERATIONS_CSV] + ([PLOT] if plotted else [])
    notes = [
        f"**Harvesting study** ({BINARY_NAME}: {opts['iterations']} iterations of each job "
        f"inside the measurement window after {opts['warmup']} warm-up; an iteration's time is "
        "its turn on GPU 0's lane, waiting for its pages included):\n\n"
        + harvest_table(data, exp.paper) + "\n",
        "This is a simulation, and the ratios depend on its assumptions: link bandwidths are "
        f"the real ones divided by {opts['scale']:g} (NVLink "
        f"{opts['nvlink_gbps_simulated']:.3g} GB/s, host link "
        f"{opts['host_link_gbps_simulated']:.3g} GB/s; local copies run at this machine's "
        "memcpy speed), so that the simulator's throttle and not the host sets copy times; "
        f"compute is a fixed sleep per layer ({jobs} forward, twice that backward; compute "
        f"scale {opts['compute_scale']:g}), so more compute per byte moved would shrink both "
        "the slowdowns and peer-first's gain, and a different NVLink-to-host bandwidth ratio "
        "would change the gain. Times are wall-clock on this machine and vary from run to run.",
        "The generic columns: makespan (and every job's JCT) is the measurement window, "
        "iterations/s counts both jobs' iterations in it; GPU utilization and busy are GPU "
        "0's lane (the share of the window some job had its turn); peak memory is an estimate "
        "(a job's local bytes at its forward end plus the others' persistent bytes, at most "
        "GPU 0's limit). Only GPU 0 is listed: GPUs 1-3 run nothing and lend their memory "
        "(the peer routes above).",
        "Files of the study: " + ", ".join(f"`{f}`" for f in files) + " (the binary's JSON, "
        "every iteration's time" + (", bar plot of iteration times" if plotted else "")
        + "); `trace-<config>.json` are its Perfetto traces.",
    ]
    if not plotted:
        notes.append(f"no {PLOT}: matplotlib is not installed")
    return notes


def write_harvest_plot(path: Path, data: dict[str, Any], paper: Optional[Paper],
                       title: str) -> bool:
    """Bars: each job's mean iteration time per configuration (± sd), and each configuration's
    speedup over host-only with the paper's "up to" line. False when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = data["configs"]
    names = [j["name"] for j in data["jobs"]]
    width = 0.8 / max(len(configs), 1)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4),
                                      gridspec_kw={"width_ratios": [2, 1]})
    for c, config in enumerate(configs):
        xs = [i + (c - (len(configs) - 1) / 2) * width for i in range(len(names))]
        left.bar(xs, [j["mean_ms"] for j in config["jobs"]], width,
                 yerr=[j["stddev_ms"] for j in config["jobs"]], capsize=3, label=config["name"])
    left.set_xticks(range(len(names)))
    left.set_xticklabels([f"job {n}" for n in names])
    left.set_ylabel("mean iteration time (ms)")
    left.legend(fontsize=8)
    host = _configs(data).get("host-only")
    if host is not None:
        labels = [c["name"] for c in configs]
        right.bar(labels, [_round_seconds(host) / _round_seconds(c) for c in configs],
                  color=[f"C{i}" for i in range(len(configs))])
        if paper is not None:
            right.axhline(paper.value, color="black", linestyle="--", linewidth=1,
                          label=f"paper: up to {paper.value:g}x")
            right.legend(fontsize=8, loc="upper right")
        right.set_ylabel("speedup over host-only (round of all jobs)")
        right.tick_params(axis="x", rotation=30, labelsize=8)
    else:
        right.set_visible(False)
    for ax in (left, right):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title}: iteration time by spill configuration (simulated links)")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return True
