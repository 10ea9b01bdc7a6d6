"""Experiments: small TOML files that say what to compare, on which workload, at which scale.

An experiment names the policies (and placements, GPU counts) compared side by side in one run,
where its jobs come from (a workload CSV and a generator), the cluster, the contention model,
and the number the paper reported, so that every summary can put ours beside theirs. A
``[scale.small]`` table overrides any of it for CI and tests (``--scale small``).

Experiments are looked up by name in ``benchmarks/experiments/`` of the checkout (found from
``$SALUS_BENCH_EXPERIMENTS``, the working directory and its parents, or the checkout the package
was installed from); a path to any ``.toml`` works too, and paths inside it (the workload CSV)
are relative to the file. Every key is checked; a mistake is one InputError naming the line.

The keys (all tables optional unless said)::

    name, description           required strings
    assumptions = [...]         sentences added to every summary
    [modes]                     simulate / run / torch / ray = true, or a string: why not
    [paper]                     name, value, metric (a metric or ratio of the summary, e.g.
                                avg_jct_speedup, utilization_gain), source, variant, note
    [workload]                  csv (default: benchmarks/data/salus_workloads.csv),
                                include / exclude (fnmatch patterns of workload names),
                                persistent_fraction (0.3), forward_fraction (0.6)
    [workload.occupancy]        default (required), by_batch = {"25" = 0.5, ...},
                                by_model = {"resnet50" = 0.8, ...}, note
    [jobs]                      generator: sample | pairs | trace; count; kind: training |
                                inference; priority; arrival: poisson | at_once;
                                mean_interarrival_seconds; max_steps (coarsen long jobs);
                                duration_scale; think_seconds
    [jobs.inference]            request_fraction, duration_seconds, duty_min, duty_max,
                                persistent_fraction, ephemeral_fraction, priority
    [jobs.pairs]                count, stagger_seconds, overlap
    [cluster]                   required: gpu_memory ("16GiB"); machines, gpus_per_machine
    [compare]                   required: policies; placements; contention; baseline (a
                                variant label, or "dedicated"); dedicated (add the one-GPU-
                                per-job baseline)
    [sweep]                     gpus = [...], policy, placement, target_jct_ratio
    [simulate]                  timeline_step (seconds), record_iterations
    [run]                       time_scale (real s per simulated s), memory_scale, max_steps,
                                layers, sample_seconds
    [torch]                     models (cnn, transformer, lstm), steps, time_scale, gpu_memory
    [ray]                       ray mode (trials on a local Ray cluster; GPUs from [cluster],
                                the Salus arm's policies from [compare]): fraction (Ray's
                                num_gpus per trial), context_memory (a process's CUDA
                                context), time_scale, memory_scale, max_steps,
                                limit_minus_context (Salus's GPU limit leaves out the context),
                                weights_in_first_iteration (else when a Salus trial starts),
                                trial_processes (also Salus on Ray with each trial a process
                                of a salusd: SalusCluster(processes=True))
    [harvest]                   the memory-harvesting study (run mode): policy, gpus,
                                gpu_memory, topology, configs, iterations, warmup, [[harvest.job]]
    [scripts]                   unmodified training scripts as processes (scripts mode): folder
                                (relative to the file), steps (passed as --steps), cpus (the CPUs
                                they run on: the simulated GPU's compute; default the first
                                this process may use), policies (salusd's),
                                timeout_seconds, [[scripts.script]] name, path, args
    [scale.small], [scale.full] any of the above, merged over it
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..policies import BUILTIN_POLICIES, registered_policies
from .errors import InputError, ModeNotSupported
from .schema import (
    ArrayOfTables,
    Bool,
    Context,
    ListOf,
    MapOf,
    ModeSwitch,
    Num,
    Size,
    Str,
    Table,
    merge,
)
from .tomlsource import Key, TomlLines

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10 need the backport
    import tomli as tomllib

MODES = ("simulate", "run", "torch", "ray", "scripts")
SCALES = ("small", "full")
# The names the native simulator and runtime accept (salus._salus.simulate, salus.Runtime);
# checked here as well so that a typo is reported at its line in the experiment file.
PLACEMENTS = ("least_loaded", "most_free", "pack_first")
CONTENTION_MODELS = ("processor_sharing", "time_slicing", "none")
GENERATORS = ("sample", "pairs", "trace")
ARRIVALS = ("poisson", "at_once")
TORCH_MODELS = ("cnn", "transformer", "lstm")
HARVEST_CONFIGS = ("no-spill", "host-only", "peer-first")
TOPOLOGIES = ("none", "nvlink_mesh", "two_islands", "pcie_only")
DEFAULT_CSV = "benchmarks/data/salus_workloads.csv"


def known_policies() -> list[str]:
    return list(BUILTIN_POLICIES) + sorted(registered_policies())


_POLICY = Str(known_policies, "policy")
_FRACTION = Num(0.0, 1.0, open_low=True)

_SCHEMA_FIELDS: dict[str, Any] = {
    "name": Str(),
    "description": Str(),
    "modes": Table({m: ModeSwitch() for m in MODES}),
    "assumptions": ListOf(Str(), min_items=0),
    "paper": Table({
        "name": Str(), "value": Num(), "metric": Str(), "source": Str(),
        "variant": Str(), "note": Str(),
    }, required=("name", "value", "metric", "source")),
    "workload": Table({
        "csv": Str(),
        "include": ListOf(Str()),
        "exclude": ListOf(Str(), min_items=0),
        "persistent_fraction": Num(0.0, 1.0),
        "forward_fraction": Num(0.0, 1.0, open_low=True),
        "occupancy": Table({
            "default": _FRACTION,
            "by_batch": MapOf(_FRACTION),
            "by_model": MapOf(_FRACTION),
            "note": Str(),
        }, required=("default",)),
    }),
    "jobs": Table({
        "generator": Str(GENERATORS, "generator"),
        "count": Num(1, integer=True),
        "kind": Str(("training", "inference"), "job kind"),
        "priority": Num(integer=True),
        "arrival": Str(ARRIVALS, "arrival process"),
        "mean_interarrival_seconds": Num(0.0, open_low=True),
        "max_steps": Num(0, integer=True),
        "duration_scale": Num(0.0, open_low=True),
        "think_seconds": Num(0.0),
        "inference": Table({
            "request_fraction": Num(0.0, 1.0, open_low=True),
            "duration_seconds": Num(0.0, open_low=True),
            "duty_min": _FRACTION,
            "duty_max": _FRACTION,
            "persistent_fraction": _FRACTION,
            "ephemeral_fraction": Num(0.0, 1.0),
            "priority": Num(integer=True),
        }, required=("request_fraction", "duration_seconds", "duty_min", "duty_max")),
        "pairs": Table({
            "count": Num(1, integer=True),
            "stagger_seconds": Num(0.0),
            "overlap": Num(0.0, 1.0),
        }, required=("count",)),
    }),
    "cluster": Table({
        "machines": Num(1, integer=True),
        "gpus_per_machine": Num(1, integer=True),
        "gpu_memory": Size(),
    }, required=("gpu_memory",)),
    "compare": Table({
        "policies": ListOf(_POLICY, unique=True),
        "placements": ListOf(Str(PLACEMENTS, "placement"), unique=True),
        "contention": Str(CONTENTION_MODELS, "contention model"),
        "baseline": Str(),
        "dedicated": Bool(),
    }, required=("policies",)),
    "sweep": Table({
        "gpus": ListOf(Num(1, integer=True), unique=True),
        "policy": _POLICY,
        "placement": Str(PLACEMENTS, "placement"),
        "target_jct_ratio": Num(1.0),
    }, required=("gpus", "policy")),
    "simulate": Table({
        "timeline_step": Num(0.0),
        "record_iterations": Bool(),
    }),
    "run": Table({
        "time_scale": Num(0.0, open_low=True),
        "memory_scale": Num(0.0, 1.0, open_low=True),
        "max_steps": Num(1, integer=True),
        "layers": Num(1, integer=True),
        "sample_seconds": Num(0.0, open_low=True),
    }),
    "torch": Table({
        "models": ListOf(Str(TORCH_MODELS, "torch model")),
        "steps": Num(1, integer=True),
        "time_scale": Num(0.0, open_low=True),
        "gpu_memory": Size(),
    }),
    "ray": Table({
        "fraction": _FRACTION,
        "context_memory": Size(),
        "time_scale": Num(0.0, open_low=True),
        "memory_scale": Num(0.0, 1.0, open_low=True),
        "max_steps": Num(1, integer=True),
        "limit_minus_context": Bool(),
        "weights_in_first_iteration": Bool(),
        "trial_processes": Bool(),
    }),
    "harvest": Table({
        "policy": _POLICY,
        "gpus": Num(2, integer=True),
        "gpu_memory": Size(),
        "topology": Str(TOPOLOGIES, "topology"),
        "configs": ListOf(Str(HARVEST_CONFIGS, "harvest configuration"), unique=True),
        "iterations": Num(1, integer=True),
        "warmup": Num(0, integer=True),
        "job": ArrayOfTables(Table({
            "name": Str(),
            "persistent": Num(0.0, open_low=True),
            "ephemeral": Num(0.0),
            "layers": Num(1, integer=True),
            "forward_ms": Num(0.0, open_low=True),
        }, required=("name", "persistent", "ephemeral", "layers", "forward_ms"))),
    }, required=("job",)),
    "scripts": Table({
        "folder": Str(),
        "steps": Num(1, integer=True),
        "cpus": ListOf(Num(0, integer=True), unique=True),
        "policies": ListOf(Str(BUILTIN_POLICIES, "policy"), min_items=0, unique=True),
        "timeout_seconds": Num(1.0),
        "script": ArrayOfTables(Table({
            "name": Str(),
            "path": Str(),
            "args": ListOf(Str(), min_items=0),
        }, required=("name", "path"))),
    }, required=("script",)),
}
_REQUIRED = ("name", "description", "cluster")
_ROOT = Table({**_SCHEMA_FIELDS,
               "scale": Table({s: Table(_SCHEMA_FIELDS) for s in SCALES})},
              required=_REQUIRED)


@dataclass(frozen=True)
class Paper:
    """The number the paper reported, kept beside ours in every summary."""

    name: str
    value: float
    metric: str
    source: str
    variant: Optional[str] = None
    note: str = ""


@dataclass(frozen=True)
class Occupancy:
    """The rule that gives each workload an occupancy (the CSV does not measure it)."""

    default: float
    by_batch: dict[str, float] = field(default_factory=dict)
    by_model: dict[str, float] = field(default_factory=dict)
    note: str = ""

    def describe(self) -> str:
        parts = [f"by model {self.by_model}"] if self.by_model else []
        if self.by_batch:
            parts.append("by batch size " + ", ".join(f"{b}: {v:g}"
                                                      for b, v in self.by_batch.items()))
        parts.append(f"otherwise {self.default:g}" if parts else
                     f"{self.default:g} for every workload")
        text = "occupancy (share of the GPU a job keeps busy alone) is assumed: " + \
            "; ".join(parts)
        return text + (f" ({self.note})" if self.note else "")


@dataclass(frozen=True)
class Variant:
    """One configuration compared: a policy, a placement and a cluster size (or each job on a
    GPU of its own, the 'dedicated' baseline)."""

    label: str
    policy: str
    placement: str
    machines: int
    gpus_per_machine: int
    group: str = "compare"  # "compare", "baseline" or "sweep"
    dedicated: bool = False
    spill: str = "none"  # harvesting configurations

    @property
    def gpus(self) -> int:
        return self.machines * self.gpus_per_machine


@dataclass
class Experiment:
    """An experiment file, checked and with its scale's overrides applied."""

    path: Path
    scale: str
    data: dict[str, Any]
    ctx: Context

    # --- identity ---
    @property
    def name(self) -> str:
        return str(self.data["name"])

    @property
    def description(self) -> str:
        return str(self.data["description"]).strip()

    @property
    def paper(self) -> Optional[Paper]:
        raw = self.data.get("paper")
        return Paper(**raw) if raw else None

    def section(self, name: str) -> dict[str, Any]:
        return dict(self.data.get(name, {}))

    def error(self, key: Key, reason: str) -> InputError:
        """An InputError at the line where ``key`` (an effective dotted key) was written."""
        return self.ctx.error(key, reason)

    # --- what it needs ---
    @property
    def workload_csv(self) -> Path:
        """The CSV named in ``[workload] csv`` (relative to the experiment file), else the
        measured Salus workloads of the checkout (``benchmarks/data/salus_workloads.csv``)."""
        csv = self.section("workload").get("csv")
        if csv is not None:
            return Path(self.path.parent / csv).resolve()
        for base in [self.path.parent, *self.path.parents, Path.cwd(), *Path.cwd().parents,
                     *Path(__file__).resolve().parents]:
            found = base / DEFAULT_CSV
            if found.is_file():
                return found.resolve()
        raise self.error(("workload", "csv"), "no csv given and no benchmarks/data/"
                         "salus_workloads.csv found next to the experiment or the checkout")

    @property
    def occupancy(self) -> Occupancy:
        raw = self.section("workload").get("occupancy", {"default": 1.0})
        return Occupancy(**raw)

    @property
    def gpu_memory(self) -> int:
        return int(self.data["cluster"]["gpu_memory"])

    @property
    def contention(self) -> str:
        return str(self.data.get("compare", {}).get("contention", "processor_sharing"))

    @property
    def is_harvesting(self) -> bool:
        return "harvest" in self.data

    @property
    def is_scripts(self) -> bool:
        return "scripts" in self.data

    @property
    def is_cluster(self) -> bool:
        cluster = self.data["cluster"]
        return int(cluster.get("machines", 1)) > 1 or "sweep" in self.data

    def assumptions(self) -> list[str]:
        return [str(a) for a in self.data.get("assumptions", [])]

    def check_mode(self, mode: str) -> None:
        """Raises ModeNotSupported when the file says so (its reason) or the mode cannot do
        what the experiment needs."""
        said = self.section("modes").get(mode, True)
        if said is not True:
            raise ModeNotSupported(self.name, mode, str(said))
        if (mode == "scripts") != self.is_scripts:
            raise ModeNotSupported(self.name, mode, "scripts mode runs the unmodified scripts "
                                   "of a [scripts] table, and only those" if mode == "scripts" else
                                   "its jobs are unmodified scripts: use scripts mode")
        if mode == "simulate" and self.is_harvesting:
            raise ModeNotSupported(self.name, mode, "the discrete-event simulator has no memory "
                                   "tiers: it cannot spill to peer GPUs or the host")
        if mode == "ray" and "ray" not in self.data:
            raise ModeNotSupported(self.name, mode, "it has no [ray] table (ray mode runs its "
                                   "trials three ways on a local Ray cluster: see "
                                   "benchmarks/experiments/ray_trials.toml)")
        if mode == "torch" and self.is_cluster:
            raise ModeNotSupported(self.name, mode, "salus.torch routes one process's PyTorch "
                                   "allocations to one runtime: a cluster of machines (and "
                                   "placement across them) is simulate-only")

    def variants(self, policies: Optional[list[str]] = None) -> list[Variant]:
        """The configurations compared, in the order the summary shows them: the ``[compare]``
        cross of policies and placements, the dedicated baseline, then the ``[sweep]``."""
        if self.is_scripts:
            from .scripts_mode import script_arms

            return script_arms(self, policies)
        if self.is_harvesting:
            harvest = self.data["harvest"]
            return [Variant(config, harvest.get("policy", "fair"), "-", 1, int(harvest["gpus"]),
                            spill=config)
                    for config in harvest.get("configs", list(HARVEST_CONFIGS))]
        compare = self.data["compare"]
        cluster = self.data["cluster"]
        machines = int(cluster.get("machines", 1))
        per_machine = int(cluster.get("gpus_per_machine", 1))
        chosen = policies if policies is not None else list(compare["policies"])
        placements = list(compare.get("placements", ["least_loaded"]))
        out: list[Variant] = []
        for placement in placements:
            for policy in chosen:
                label = policy if len(placements) == 1 else f"{policy}/{placement}"
                out.append(Variant(label, policy, placement, machines, per_machine))
        if compare.get("dedicated", False):
            out.append(Variant("dedicated", "fifo", "least_loaded", 1, 1, group="baseline",
                               dedicated=True))
        sweep = self.data.get("sweep")
        if sweep:
            placement = sweep.get("placement", placements[0])
            for gpus in sweep["gpus"]:
                if gpus % per_machine:
                    raise self.error(("sweep", "gpus"), f"{gpus} GPUs is not a whole number of "
                                     f"machines of {per_machine} GPUs")
                out.append(Variant(f"{sweep['policy']}@{gpus}gpu", sweep["policy"], placement,
                                   gpus // per_machine, per_machine, group="sweep"))
        return out

    def baseline(self, variants: list[Variant], *, strict: bool = True) -> Optional[Variant]:
        """The variant the others are compared with (``[compare] baseline``); with ``strict``
        off (policies chosen on the command line) a baseline left out is no error: the ratios
        are then left out."""
        if self.is_harvesting:
            return next((v for v in variants if v.label == "no-spill"), None)
        if self.is_scripts:
            return next((v for v in variants if v.group == "baseline"), None)
        name = self.data["compare"].get("baseline")
        if name is None:
            return None
        for v in variants:
            if v.label == name or (v.policy == name and v.group == "compare"):
                return v
        if not strict:
            return None
        raise self.error(("compare", "baseline"),
                         f"{name!r} is none of the variants run "
                         f"({', '.join(v.label for v in variants)})")


def find_experiment(name: str, cwd: Optional[Path] = None) -> Path:
    """The file for ``name``: a path to a .toml file, or the name of one in
    ``benchmarks/experiments/`` (``$SALUS_BENCH_EXPERIMENTS``, then the working directory and
    its parents, then the checkout this package was imported from)."""
    candidate = Path(name)
    if candidate.suffix == ".toml" or os.sep in name or "/" in name:
        if candidate.is_file():
            return candidate.resolve()
        raise InputError(name, None, "EXPERIMENT", "no such file")
    folders = _experiment_folders(cwd or Path.cwd())
    for folder in folders:
        path = folder / f"{name}.toml"
        if path.is_file():
            return path.resolve()
    known = sorted({p.stem for f in folders if f.is_dir() for p in f.glob("*.toml")})
    where = ", ".join(str(f) for f in folders) or "no benchmarks/experiments folder found"
    listing = f" (known: {', '.join(known)})" if known else ""
    raise InputError("<command line>", None, "EXPERIMENT",
                     f"no experiment named {name!r} in {where}{listing}")


def list_experiments(cwd: Optional[Path] = None) -> list[Path]:
    seen: dict[str, Path] = {}
    for folder in _experiment_folders(cwd or Path.cwd()):
        for path in sorted(folder.glob("*.toml")):
            seen.setdefault(path.stem, path)
    return list(seen.values())


def _experiment_folders(cwd: Path) -> list[Path]:
    folders: list[Path] = []
    env = os.environ.get("SALUS_BENCH_EXPERIMENTS")
    if env:
        folders.append(Path(env))
    for base in [cwd, *cwd.resolve().parents, *Path(__file__).resolve().parents]:
        folder = base / "benchmarks" / "experiments"
        if folder.is_dir() and folder.resolve() not in [f.resolve() for f in folders]:
            folders.append(folder)
            if base != cwd:
                break
    return folders


def load_experiment(path: Path, scale: str = "full") -> Experiment:
    """Reads, checks and applies ``[scale.<scale>]``; raises InputError at the first mistake."""
    if scale not in SCALES:
        raise InputError("<command line>", None, "--scale",
                         f"unknown scale {scale!r} (known: {', '.join(SCALES)})")
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(shown, None, "(file)", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:  # found by fuzzing (tests/fuzz/python)
        raise InputError(shown, None, "(file)", f"not UTF-8 text: {e.reason}") from None
    lines = TomlLines(text)
    ctx = Context(shown, lines, {})
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = getattr(e, "lineno", None) or _decode_line(str(e))
        raise InputError(shown, line, "(syntax)", f"not valid TOML: {e}") from None
    checked = _ROOT.check(raw, ctx, (), partial=True)
    data = {k: v for k, v in checked.items() if k != "scale"}
    override = checked.get("scale", {}).get(scale)
    if override:
        data = merge(data, override, ctx.origins, (), ("scale", scale))
    # Required keys once the override is in: checked again, so a missing one is reported.
    _ROOT.check(data, ctx, ())
    experiment = Experiment(Path(path).resolve(), scale, data, ctx)
    _check_consistency(experiment)
    return experiment


def _check_consistency(exp: Experiment) -> None:
    """The rules that tie keys together."""
    if exp.is_harvesting or exp.is_scripts:
        return
    for name in ("jobs", "compare"):
        if name not in exp.data:
            raise exp.error((name,), f"missing [{name}] table (required unless [harvest])")
    jobs = exp.data["jobs"]
    generator = jobs.get("generator", "sample")
    if jobs.get("kind") == "inference" and "inference" not in jobs:
        raise exp.error(("jobs", "kind"), "inference jobs need a [jobs.inference] table")
    if generator == "pairs" and "pairs" not in jobs:
        raise exp.error(("jobs", "generator"), "the pairs generator needs a [jobs.pairs] table")
    if generator != "pairs" and "count" not in jobs:
        raise exp.error(("jobs", "count"), "missing (required: how many jobs)")
    if jobs.get("arrival") == "poisson" and "mean_interarrival_seconds" not in jobs:
        raise exp.error(("jobs", "arrival"), "poisson arrivals need mean_interarrival_seconds")
    inference = jobs.get("inference")
    if inference and inference["duty_min"] > inference["duty_max"]:
        raise exp.error(("jobs", "inference", "duty_min"), "must not exceed duty_max")
    occupancy = exp.section("workload").get("occupancy", {})
    for batch in occupancy.get("by_batch", {}):
        if not batch.isdigit():
            raise exp.error(("workload", "occupancy", "by_batch", batch),
                            "keys are batch sizes (digits)")
    paper = exp.data.get("paper")
    variants = exp.variants()
    if paper and paper.get("variant") and paper["variant"] not in [v.label for v in variants]:
        raise exp.error(("paper", "variant"), f"{paper['variant']!r} is none of the variants "
                        f"({', '.join(v.label for v in variants)})")
    exp.baseline(variants)


def _decode_line(message: str) -> Optional[int]:
    import re

    found = re.search(r"line (\d+)", message)
    return int(found.group(1)) if found else None
