"""The ``salus-bench`` command line.

    salus-bench simulate|run|torch|ray EXPERIMENT [--out DIR] [--seed N] [--scale small|full]
                [--policies a,b] [--quiet]
    salus-bench list

Input mistakes print ``path:line: field: reason`` and exit 2; an experiment a mode cannot run
says why and exits 2; no traceback either way.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from ..errors import Error
from .errors import InputError, ModeNotSupported
from .experiment import MODES, SCALES, list_experiments
from .report import Summary
from .runner import DEFAULT_SEED, parse_policies, run

_MODE_HELP = {
    "simulate": "the discrete-event simulator (virtual clock, thousands of jobs, deterministic)",
    "run": "the real mechanism: salus.Runtime on simulated GPUs, time-scaled, Perfetto traces",
    "torch": "real PyTorch jobs (small models on the CPU through salus.torch) on a simulated GPU",
    "ray": "trials on a local Ray cluster of simulated GPUs, three ways: one per GPU, Ray "
           "fractional GPUs (no memory check), Salus on Ray (needs ray; experiments with [ray])",
    "scripts": "unmodified PyTorch training scripts as processes on one simulated GPU: one at a "
               "time, all at once without Salus, and under salusd (experiments with [scripts])",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="salus-bench",
        description="GPU-sharing experiments with Salus: compare scheduling policies, "
                    "placements and cluster sizes on measured workloads, from a simulator to "
                    "real PyTorch jobs.",
        epilog="EXPERIMENT is the name of a file in benchmarks/experiments/ (jct, hyperparam, "
               "inference, colocation, harvesting, cluster, ray_trials, unmodified_scripts) or a path to any .toml "
               "file.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("experiment", metavar="EXPERIMENT",
                        help="experiment name (benchmarks/experiments/NAME.toml) or .toml path")
    common.add_argument("--out", type=Path, default=None,
                        help="output folder (default: bench-results/EXPERIMENT-MODE)")
    common.add_argument("--seed", type=int, default=DEFAULT_SEED,
                        help=f"random seed for the jobs (default: {DEFAULT_SEED})")
    common.add_argument("--scale", choices=SCALES, default="full",
                        help="full (default), or small: the experiment's [scale.small] "
                             "overrides, for CI and quick looks")
    common.add_argument("--policies", default=None, metavar="A,B",
                        help="compare these policies instead of the experiment's")
    common.add_argument("--quiet", action="store_true",
                        help="no progress bar and no table: only where the files are")
    for mode in MODES:
        sub.add_parser(mode, parents=[common], help=_MODE_HELP[mode], description=_MODE_HELP[mode])
    sub.add_parser("list", help="list the experiments found")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        return _list()
    try:
        policies = parse_policies(args.policies)
        outcome = run(args.experiment, args.command, out=args.out, seed=args.seed,
                      scale=args.scale, policies=policies,
                      progress=not args.quiet and sys.stderr.isatty(),
                      log=(lambda _: None) if args.quiet else _log)
    except InputError as e:
        print(e.message, file=sys.stderr)
        return 2
    except ModeNotSupported as e:
        print(f"salus-bench: {e.message}", file=sys.stderr)
        return 2
    except Error as e:
        print(f"salus-bench: {type(e).__name__}: {e.message}", file=sys.stderr)
        return 1
    except OSError as e:  # the output folder cannot be made or written
        print(f"salus-bench: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("salus-bench: interrupted", file=sys.stderr)
        return 130
    if not args.quiet:
        print(_table(outcome.summary))
    print(f"wrote {', '.join(outcome.files)} to {outcome.folder} "
          f"({outcome.wall_seconds:.1f} s)")
    return 0


def _log(text: str) -> None:
    print(text, file=sys.stderr)


def _list() -> int:
    from .experiment import load_experiment

    for path in list_experiments():
        try:
            description = load_experiment(path).description.split(". ")[0]
            if len(description) > 96:
                description = description[:93] + "..."
        except InputError as e:
            description = f"(invalid: {e.message})"
        print(f"{path.stem:<12} {description}")
    return 0


def _table(summary: Summary) -> str:
    """A few headline numbers per variant, for the terminal (summary.md has them all)."""
    keys = [("failed_jobs", "failed", "{:.0f}"), ("avg_jct", "avg JCT s", "{:.1f}"),
            ("p95_jct", "p95 JCT s", "{:.1f}"),
            ("makespan", "makespan s", "{:.1f}"), ("utilization", "util %", "{:.1%}"),
            ("latency_p99", "p99 lat ms", "{:.2f}")]
    ratio_keys = [("avg_jct_speedup", "JCT x"), ("utilization_gain", "util x"),
                  ("makespan_speedup", "makespan x"), ("gpu_makespan_speedup", "GPU mk x")]
    present = [k for k in keys if any(m.get(k[0]) is not None for m in summary.metrics.values())]
    ratio_present = [k for k in ratio_keys
                     if any(r.get(k[0]) is not None for r in summary.vs_baseline.values())]
    head = f"{'variant':<24}" + "".join(f"{h:>12}" for _, h, _ in present) + \
        "".join(f"{h:>12}" for _, h in ratio_present)
    lines = [head, "-" * len(head)]
    for label, m in summary.metrics.items():
        row = f"{label:<24}"
        for key, _, fmt in present:
            value = m.get(key)
            if value is not None and key == "latency_p99":
                value *= 1000
            row += f"{'-' if value is None else fmt.format(value):>12}"
        for key, _ in ratio_present:
            value = summary.vs_baseline.get(label, {}).get(key)
            row += f"{'-' if value is None else f'{value:.2f}':>12}"
        lines.append(row)
    for label, m in summary.metrics.items():
        if m.get("failed_jobs"):
            lines.append(f"warning: {m['failed_jobs']:.0f} job(s) of {label} failed "
                         "(see the notes in summary.md and the error column of jobs.csv)")
    needed = summary.gpus_needed()
    if needed is not None:
        lines.append(f"GPUs needed: {needed['gpus']} (average JCT within "
                     f"{needed['target_jct_ratio']:g}x of {needed['largest_gpus']} GPUs')")
    paper = summary.paper_comparison()
    if paper is not None:
        ours = "-" if paper["ours"] is None else f"{paper['ours']:.2f}"
        lines.append(f"paper: {paper['name']}: {paper['value']:g} ({paper['metric']}); "
                     f"ours: {ours}")
    return "\n".join(lines)
