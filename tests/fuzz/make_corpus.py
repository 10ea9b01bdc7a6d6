#!/usr/bin/env python3
"""Writes the seed corpora of the C++ fuzz targets under tests/fuzz/corpus/ (deterministic).

fuzz_salusd: random conversations (every byte is a decision). fuzz_c_api: one program per call kind (the op byte is `kind mod 16`, see fuzz_c_api.cpp's
Program::step), each opening with jobs and allocations so that the call has something to act on,
mixed programs, and hand-encoded programs that reach page moves between tiers.
fuzz_runtime_options: pseudo-random option structs. fuzz_workloads_csv: CSV files covering each
column, order, line ending and malformed cell (first byte: the cap). py_experiment /
py_workloads (tests/fuzz/python): the experiment files of benchmarks/experiments and small
hand-written ones; CSV files with the Python loader's optional columns and trace mode.
"""
from __future__ import annotations

import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent / "corpus"

# Program::step's call kinds (op byte mod 16).
C_API_OPS = {
    "add_job": 0, "begin": 1, "end": 2, "cancel_leave": 3, "allocate": 4, "free": 7,
    "record_stream": 9, "stream_create": 10, "stream_destroy_retire": 11, "bind_unbind": 12,
    "current_job": 13, "trim": 14, "stats": 15,
}


def step(rng: random.Random, op: int) -> bytes:
    """One call: its op byte and enough argument bytes for any call kind."""
    return bytes([op]) + bytes(rng.randrange(256) for _ in range(12))


# Hand-encoded programs (byte for byte as Program decodes them) that reach harvesting: job B holds
# memory and waits behind job A (so B is quiescent), then A allocates past the device, which
# moves B's pages to a peer or the host; A ends, B starts (its pages come home where they fit).
def _add_job() -> bytes:  # training, device 0, no hints, no limits, no fault
    return bytes([0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 99, 11])


def _alloc(job_index: int, pages: int) -> bytes:  # `pages` x 2 MiB on device 0, persistent
    return bytes([4, 1, 0, 7, pages - 1, 0, 0, 2, job_index, 0, 13])


def _harvest_programs() -> dict[str, bytes]:
    begin_a, begin_b_waits = bytes([1, 2, 0]), bytes([1, 2, 1, 0])
    end_a, end_b, free_first = bytes([2, 2, 0]), bytes([2, 2, 1]), bytes([7, 99, 0, 0, 9])
    stats = bytes([15, 1, 0, 0, 2, 0])
    programs = {}
    for name, header, b_pages, a_pages in (
            ("harvest_peer", [0, 0, 0, 0], 10, [10, 4]),       # 2 x 32 MiB, 8 MiB host
            ("harvest_host", [0, 0, 2, 0], 12, [12, 12, 6]),   # 2 x 32 MiB, 32 MiB host
            ("harvest_mesh4", [2, 99, 1, 1], 24, [24, 16])):   # 4 x 64 MiB, 16 MiB host, srtf
        program = bytes(header) + _add_job() + _add_job() + begin_a + _alloc(1, b_pages)
        program += begin_b_waits + b"".join(_alloc(0, p) for p in a_pages) + stats
        program += end_a + stats + free_first + end_b + stats
        programs[name] = program
    return programs


def c_api(out: Path) -> None:
    for name, program in _harvest_programs().items():
        (out / f"{name}.bin").write_bytes(program)
    for name, op in C_API_OPS.items():
        rng = random.Random(f"c_api/{name}")
        program = bytes(rng.randrange(256) for _ in range(4))  # runtime: devices, memory, host, policy
        prelude = [0, 0, 10, 4, 4, 1, 4, 5, 12]  # jobs, a stream, allocations, an iteration
        program += b"".join(step(rng, k) for k in prelude)
        program += b"".join(step(rng, op if i % 2 == 0 else rng.choice([0, 1, 2, 4, 7]))
                            for i in range(24))
        (out / f"{name}.bin").write_bytes(program)
    for seed in range(6):
        rng = random.Random(f"c_api/mixed{seed}")
        program = bytes(rng.randrange(256) for _ in range(4))
        program += b"".join(step(rng, rng.randrange(16)) for _ in range(60))
        (out / f"mixed{seed}.bin").write_bytes(program)


def runtime_options(out: Path) -> None:
    for seed in range(24):
        rng = random.Random(f"options/{seed}")
        (out / f"options{seed:02d}.bin").write_bytes(
            bytes(rng.randrange(256) for _ in range(40 + 4 * seed)))


CSV_HEADER = "workload,jct_seconds,peak_memory_mb,iterations"
CSV_SEEDS = {
    "valid": f"{CSV_HEADER}\nvgg11_25_1min,67.059,3709.6,565\nresnet50,606.4,5087.5,5659\n",
    "reordered": "iterations,workload,peak_memory_mb,jct_seconds,extra\n10,a,100,5.5,x\n3,b,1,1,y\n",
    "crlf": f"{CSV_HEADER}\r\na,1,1,1\r\n\r\nb,2,2,2\r\n",
    "header_only": f"{CSV_HEADER}\n",
    "empty": "",
    "missing_column": "workload,jct_seconds,iterations\na,1,1\n",
    "too_few_cells": f"{CSV_HEADER}\na,1,1\n",
    "not_numbers": f"{CSV_HEADER}\na,one,1,1\n",
    "zero_iterations": f"{CSV_HEADER}\na,1,1,0\n",
    "negative": f"{CSV_HEADER}\na,-1,1,1\nb,1,-5,1\nc,1,1,-1\n",
    "nan_inf": f"{CSV_HEADER}\na,nan,1,1\nb,inf,1,1\nc,1,inf,1\nd,1,1e308,1\n",
    "huge_iterations": f"{CSV_HEADER}\na,1,1,18446744073709551615\nb,1e-300,1,99999999999\n",
    "tiny": f"{CSV_HEADER}\na,1e-320,1e-320,1\n",
    "hex_and_spaces": f"{CSV_HEADER}\na, 0x10 ,  2.5e3,7 \n",
    "duplicate_columns": "workload,workload,jct_seconds,peak_memory_mb,iterations\na,b,1,1,1\n",
    "trailing_comma": f"{CSV_HEADER},\na,1,1,1,\n",
}


def workloads_csv(out: Path) -> None:
    for i, (name, text) in enumerate(CSV_SEEDS.items()):
        cap = bytes([i % 5])  # the target's first byte picks the iteration cap
        (out / f"{name}.csv").write_bytes(cap + text.encode())
    shared = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "salus_workloads.csv"
    lines = shared.read_text().splitlines()[:12]
    (out / "salus_workloads_head.csv").write_bytes(b"\x00" + "\n".join(lines).encode() + b"\n")


PY_WORKLOADS = {
    "optional_columns": "workload,jct_seconds,peak_memory_mb,iterations,occupancy,kind,"
                        "forward_fraction\nresnet50_25_1min,60,1000,100,0.5,training,0.6\n"
                        "bert,10,200,5,1,inference,\n",
    "trace": "workload,jct_seconds,peak_memory_mb,iterations,arrival_seconds\na,1,1,1,0\n"
             "a,2,2,2,1.5\n",
    "quoted": 'workload,jct_seconds,peak_memory_mb,iterations\n"a,b",1,1,1\n"unterminated,1\n',
    "bad_kind_and_fraction": "workload,jct_seconds,peak_memory_mb,iterations,kind,"
                             "forward_fraction\na,1,1,1,eval,1.0\n",
    "unknown_and_twice": "workload,jct_seconds,peak_memory_mb,iterations,iterations,color\n",
    "listed_twice": "workload,jct_seconds,peak_memory_mb,iterations\na,1,1,1\na,1,1,1\n",
}

SMALL_EXPERIMENTS = {
    "minimal": 'name = "m"\ndescription = "d"\n[jobs]\ncount = 2\n[cluster]\n'
               'gpu_memory = "16GiB"\n[compare]\npolicies = ["fair", "fifo"]\n',
    "scale_override": 'name = "s"\ndescription = "d"\n[jobs]\ncount = 4\ngenerator = "pairs"\n'
                      '[jobs.pairs]\ncount = 2\n[cluster]\ngpu_memory = "8GiB"\n[compare]\n'
                      'policies = ["pack"]\n[scale.small]\njobs = { count = 1 }\n',
    "bad_syntax": 'name = "x\n[compare\npolicies = [1, "a"]\n',
    "bad_types": 'name = 3\ndescription = []\n[cluster]\ngpu_memory = "12 parsecs"\n'
                 '[modes]\ntorch = 7\n',
}


def py_workloads(out: Path) -> None:
    for i, (name, text) in enumerate({**CSV_SEEDS, **PY_WORKLOADS}.items()):
        if name in ("hex_and_spaces", "duplicate_columns", "tiny"):
            continue  # the C++ parser's quirks; the rest covers the Python one
        trace = bytes([1 if name == "trace" else i % 2])  # the target's first byte: trace mode
        (out / f"{name}.csv").write_bytes(trace + text.encode())


def py_experiment(out: Path) -> None:
    experiments = Path(__file__).resolve().parents[2] / "benchmarks" / "experiments"
    for i, toml in enumerate(sorted(experiments.glob("*.toml"))):
        (out / toml.name).write_bytes(bytes([i % 2]) + toml.read_bytes())  # first byte: scale
    for i, (name, text) in enumerate(SMALL_EXPERIMENTS.items()):
        (out / f"{name}.toml").write_bytes(bytes([i % 2]) + text.encode())


def salusd(out: Path) -> None:
    """Conversations with the coordinator: the target reads every byte as a decision (which
    client, which message, which fields), so random bytes of a range of lengths are programs."""
    rng = random.Random(22)
    for i in range(24):
        n = rng.choice((16, 48, 120, 300, 600))
        (out / f"conversation_{i:02d}.bin").write_bytes(bytes(rng.randrange(256) for _ in range(n)))


def main() -> None:
    for target, make in (("fuzz_c_api", c_api), ("fuzz_runtime_options", runtime_options),
                         ("fuzz_salusd", salusd),
                         ("fuzz_workloads_csv", workloads_csv), ("py_experiment", py_experiment),
                         ("py_workloads", py_workloads)):
        out = ROOT / target
        out.mkdir(parents=True, exist_ok=True)
        for old in out.iterdir():
            old.unlink()
        make(out)
        print(f"{target}: {len(list(out.iterdir()))} seeds")


if __name__ == "__main__":
    main()
