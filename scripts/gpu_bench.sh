#!/usr/bin/env bash
# The first benchmark for a real GPU: what sharing it through Salus costs, each figure against a
# reference measured in the same run, and their ratio (benchmarks/gpu/gpu_bench.py says what
# parts A-F measure). At most 6 minutes on one H100/H200, and no network: models have random
# weights. Starts with a pre-flight of at most 15 s (nvidia-smi, and what the driver does with
# interprocess event handles). Every arm runs in a fresh process with a timeout; a failed arm is
# recorded and the others go on. Writes results.json (rows, skips, failures, environment),
# results.md (the table, also printed at the end) and logs/ under $OUT.
#
# Without a GPU (no nvidia-smi that lists one), or with --dry-run, it is a dry run: the parts
# that make sense on the simulated backend run end to end at tiny sizes and print their rows,
# what needs CUDA prints "SKIP <part>: <reason>", and it exits 0 unless an arm failed.
#
#   scripts/gpu_bench.sh [--dry-run] [--parts A,B,...] [--budget SECONDS]
#
# Environment: OUT (results folder, default ./gpu-bench-out, relative to where you call it).
# SALUS_GPU_PREBUILT=1 uses the build-gpu/ that is there (no set-up, no build: a GPU machine with
# no network, given a tree built elsewhere); without it a GPU run first sets up and builds
# build-gpu/ as scripts/gpu_check.sh does (not counted in the 6 minutes). SALUS_GPU_PYTHON names
# the Python (default .venv/bin/python), which must import salus and torch (a CUDA build on a
# GPU). SALUS_JOBS: build parallelism (default 2).
set -euo pipefail
OUT=${OUT:-gpu-bench-out}
[[ $OUT == /* ]] || OUT=$PWD/$OUT
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${SALUS_GPU_PYTHON:-.venv/bin/python}
BUILD=build-gpu

log() { printf '[gpu-bench] %s\n' "$*"; }

dry=0
args=("$@")
for a in "$@"; do [[ $a == --dry-run ]] && dry=1; done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  log "no NVIDIA GPU found: dry run on the simulated backend"
  ((dry)) || args+=(--dry-run)
  dry=1
fi

if ((!dry)); then
  ./scripts/gpu_build.sh  # not counted in the benchmark's budget
  export SALUS_LIBSALUS_PATH=$PWD/$BUILD/src/libsalus.so
  export SALUSD=${SALUSD:-$PWD/$BUILD/src/salusd}
fi
# A dry run uses what is installed: the salusd beside the Python unless SALUSD names one.

if [[ ! -x $PY ]] || ! "$PY" -c 'import salus.torch, torch' 2>/dev/null; then
  log "FAILED: $PY has no salus and torch: make the venv and pip install . first" >&2
  exit 1
fi
if ((!dry)) && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  log "FAILED: the torch in $PY does not see the GPU (a CPU-only wheel?)" >&2
  exit 1
fi

exec "$PY" benchmarks/gpu/gpu_bench.py --out "$OUT" --python "$PY" "${args[@]}"
