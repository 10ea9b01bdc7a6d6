#!/usr/bin/env python3
"""Fuzz targets for the Python parsers of outside input in salus-bench.

Targets (the first argument):
  experiment  salus.bench.experiment.load_experiment (TOML; schema.py, tomlsource.py) on the input
              as a file; the first byte picks the scale ("full" or "small").
  workloads   salus.bench.workloads.load_workloads (CSV); the first byte picks trace mode.

Any exception other than the documented salus.bench.InputError / ModeNotSupported is a finding.

Engines: atheris (libFuzzer for Python, coverage-guided) when it is installed; otherwise a
byte-level mutation loop over the seeds (bit flips, byte and chunk insertions, deletions,
splices), which explores bytes but has no coverage feedback (the log says which ran).

  fuzz_bench_inputs.py TARGET CORPUS_DIR... [-max_total_time=S] [libFuzzer flags]   fuzz
  fuzz_bench_inputs.py TARGET --replay DIR_OR_FILE...                               replay only
"""
from __future__ import annotations

import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable

try:
    import atheris
except ImportError:  # the fallback engine below
    atheris = None


def _bench_from_checkout() -> None:
    """Makes ``salus.bench`` this checkout's source (python_bindings/salus/bench), on top of the
    installed ``salus`` package (which holds the native module): the fuzzer then tests the tree,
    not the copy pip installed from it."""
    import importlib.util

    import salus

    source = Path(__file__).resolve().parents[3] / "python_bindings" / "salus" / "bench"
    spec = importlib.util.spec_from_file_location(
        "salus.bench", source / "__init__.py", submodule_search_locations=[str(source)])
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["salus.bench"] = bench
    salus.bench = bench  # type: ignore[attr-defined]
    spec.loader.exec_module(bench)


def _instrumented_imports() -> tuple[Callable[..., object], Callable[..., object], tuple]:
    if atheris is not None:
        with atheris.instrument_imports(include=["salus.bench"]):
            _bench_from_checkout()
            from salus.bench.errors import InputError, ModeNotSupported
            from salus.bench.experiment import load_experiment
            from salus.bench.workloads import load_workloads
    else:
        _bench_from_checkout()
        from salus.bench.errors import InputError, ModeNotSupported
        from salus.bench.experiment import load_experiment
        from salus.bench.workloads import load_workloads
    return load_experiment, load_workloads, (InputError, ModeNotSupported)


load_experiment, load_workloads, EXPECTED = _instrumented_imports()
_SCRATCH = Path(tempfile.mkdtemp(prefix="salus-fuzz-"))


def run_experiment(data: bytes) -> None:
    scale = "small" if data[:1] and data[0] % 2 else "full"
    path = _SCRATCH / "experiment.toml"
    path.write_bytes(data[1:])
    try:
        load_experiment(path, scale)
    except EXPECTED:
        pass


def run_workloads(data: bytes) -> None:
    trace = bool(data[:1] and data[0] % 2)
    path = _SCRATCH / "workloads.csv"
    path.write_bytes(data[1:])
    try:
        load_workloads(path, trace=trace)
    except EXPECTED:
        pass


TARGETS: dict[str, Callable[[bytes], None]] = {
    "experiment": run_experiment,
    "workloads": run_workloads,
}


def _inputs(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            files.append(p)
        elif p.is_dir():
            files.extend(sorted(f for f in p.rglob("*") if f.is_file()
                                and f.name != ".gitkeep" and not f.name.startswith("README")))
    return files


def replay(target: Callable[[bytes], None], paths: list[str]) -> int:
    files = _inputs(paths)
    for f in files:
        target(f.read_bytes())  # an unexpected exception propagates: a failed replay
    print(f"replayed {len(files)} inputs")
    return 0 if files else 1


def _mutate(rng: random.Random, data: bytes, seeds: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(1 + rng.randrange(4)):
        op = rng.randrange(6)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos:pos] = bytes([rng.randrange(256)])
        elif op == 2 and buf:
            del buf[pos:pos + 1 + rng.randrange(8)]
        elif op == 3:
            other = rng.choice(seeds)
            start = rng.randrange(len(other) + 1)
            buf[pos:pos] = other[start:start + rng.randrange(64)]
        elif op == 4:
            buf[pos:pos] = rng.choice([b"=", b"[", b"]", b'"', b",", b"\n", b"\r\n", b"1e999",
                                       b"-1", b"nan", b"{", b"}", b"[[", b"0", b"\x00", b"\xff"])
        elif op == 5 and buf:
            buf[min(pos, len(buf) - 1)] = rng.choice(b"0123456789.,=\"'[]{}#\n -_ae")
    return bytes(buf)


def fallback_fuzz(name: str, target: Callable[[bytes], None], corpus: list[str],
                  seconds: float, artifacts: Path) -> int:
    seeds = [f.read_bytes() for f in _inputs(corpus)] or [b""]
    rng = random.Random(int(os.environ.get("SALUS_FUZZ_SEED", "1")))
    pool = list(seeds)
    deadline = time.monotonic() + seconds
    execs = 0
    while time.monotonic() < deadline:
        data = _mutate(rng, rng.choice(pool), seeds)
        execs += 1
        try:
            target(data)
        except Exception:  # noqa: BLE001 - anything not documented is the finding
            artifacts.mkdir(parents=True, exist_ok=True)
            crash = artifacts / f"crash-{name}-{execs}"
            crash.write_bytes(data)
            traceback.print_exc()
            print(f"==FINDING== {crash}")
            print(f"stat::number_of_executed_units: {execs}")
            return 1
        if len(pool) < 512 and rng.randrange(16) == 0:
            pool.append(data)  # keep some mutants as parents (no coverage to choose them)
    print(f"#{execs} DONE (fallback engine: no coverage) corp: {len(pool)}")
    print(f"stat::number_of_executed_units: {execs}")
    print(f"stat::average_exec_per_sec: {int(execs / max(seconds, 1e-9))}")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] not in TARGETS:
        print(__doc__)
        return 2
    name, target = argv[1], TARGETS[argv[1]]
    if argv[2] == "--replay":
        return replay(target, argv[3:])
    if atheris is not None:
        print("engine: atheris")
        atheris.Setup([argv[0]] + argv[2:], target)
        atheris.Fuzz()
        return 0
    print("engine: fallback (atheris is not installed)")
    flags = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv[2:] if a.startswith("-")
             and "=" in a}
    corpus = [a for a in argv[2:] if not a.startswith("-")]
    seconds = float(flags.get("-max_total_time", "60"))
    artifacts = Path(flags.get("-artifact_prefix", "fuzz-artifacts/"))
    return fallback_fuzz(name, target, corpus, seconds, artifacts)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
