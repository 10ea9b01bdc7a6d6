#!/usr/bin/env bash
# Installs what building and testing Salus needs, and only what is missing (safe to run again).
# Debian/Ubuntu: apt-get. The CUDA toolkit is not installed here (it is large and comes from
# NVIDIA): its headers must already exist; the driver is not needed (Salus opens it at run time).
set -euo pipefail

log() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

# Tool -> Debian package providing it, then libraries (checked as installed packages).
# ccache: fuzz.sh and a developer's builds use it when present (CCACHE_BASEDIR lets worktrees share).
declare -A TOOLS=([cmake]=cmake [g++]=g++ [make]=make [pkg-config]=pkg-config [clang++]=clang
                  [ccache]=ccache)
LIBS=(libtbb-dev libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
      libbenchmark-dev
      libclang-rt-14-dev)  # libFuzzer for scripts/fuzz.sh (Debian 12's clang is 14)

missing=()
for tool in "${!TOOLS[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("${TOOLS[$tool]}")
done
have_dpkg=0
command -v dpkg-query >/dev/null 2>&1 && have_dpkg=1
for pkg in "${LIBS[@]}"; do
  if [[ $have_dpkg == 1 ]]; then
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  command -v apt-get >/dev/null 2>&1 ||
    die "missing ${missing[*]} and no apt-get here: install them with your package manager"
  # Root runs apt-get directly; others need password-less sudo (CI has no stdin to ask on).
  SUDO=()
  if [[ $(id -u) != 0 ]]; then
    sudo -n true 2>/dev/null || die "missing ${missing[*]}: run as root or with password-less sudo"
    SUDO=(sudo -n)
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update -q
  "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
else
  log "build dependencies present"
fi

# CMake 3.25 or later (the project's minimum).
cmake_version=$(cmake --version | awk 'NR == 1 {print $3}')
if [[ $(printf '%s\n3.25\n' "$cmake_version" | sort -V | head -n1) != 3.25 ]]; then
  die "cmake $cmake_version is too old: Salus needs 3.25 or later"
fi

# CUDA toolkit headers: used at build time only (no libcuda link; the driver is dlopen'ed).
cuda_header=""
for root in "${CUDAToolkit_ROOT:-}" "${CUDA_HOME:-}" /usr/local/cuda; do
  if [[ -n $root && -f $root/include/cuda.h ]]; then cuda_header=$root/include/cuda.h; break; fi
done
if [[ -z $cuda_header ]] && command -v nvcc >/dev/null 2>&1; then
  nvcc_root=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  [[ -f $nvcc_root/include/cuda.h ]] && cuda_header=$nvcc_root/include/cuda.h
fi
[[ -n $cuda_header ]] || die "CUDA toolkit headers not found (looked for cuda.h under \
\$CUDAToolkit_ROOT, \$CUDA_HOME, /usr/local/cuda and next to nvcc). Install the CUDA toolkit \
(https://developer.nvidia.com/cuda-downloads; a GPU is not needed) or set CUDAToolkit_ROOT."
log "CUDA headers: $cuda_header"

# --- Python: the project's virtual environment (.venv), PyTorch and the salus package -----------
# SALUS_SKIP_PYTHON=1 skips it (a C++-only set-up). PyTorch is PyPI's default wheel (about 5 GB
# with its CUDA libraries; it runs on the CPU where there is no GPU).
if [[ ${SALUS_SKIP_PYTHON:-0} == 1 ]]; then
  log "Python set-up skipped (SALUS_SKIP_PYTHON=1)"
  exit 0
fi
PYTHON=${SALUS_PYTHON_BOOTSTRAP:-python3}
command -v "$PYTHON" >/dev/null 2>&1 || die "python3 not found: install Python 3.9 or later"
SUDO=()
[[ $(id -u) == 0 ]] || SUDO=(sudo -n)
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    rm -rf .venv
    command -v apt-get >/dev/null 2>&1 || die "python3 -m venv failed: install python3-venv"
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends python3-venv </dev/null
    "$PYTHON" -m venv .venv
  fi
fi
PY_REQS=(torch numpy pytest pytest-benchmark matplotlib tqdm "scikit-build-core>=0.10" "pybind11>=2.12"
         atheris  # atheris: the Python fuzz targets (tests/fuzz/python)
         "ray[tune]>=2.9"  # salus.ray: trials on Ray GPU workers, and its Ray Tune glue
         # Models the project did not write, for the tests (small configs, random weights):
         torchvision timm transformers)
if ! .venv/bin/python - "${PY_REQS[@]}" <<'PY' >/dev/null 2>&1
import importlib.metadata as md, re, sys
for req in sys.argv[1:]:
    md.version(re.split(r"[<>=[]", req)[0])  # the distribution, without extras or version
PY
then
  log "installing into .venv: ${PY_REQS[*]} (PyTorch is large: a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q "${PY_REQS[@]}"
fi
# The salus package itself, built against the venv's torch (no build isolation, so that libtorch
# is found); scikit-build-core keeps its build folder, so a rebuild after a change is quick.
log "building and installing the salus Python package into .venv"
.venv/bin/python -m pip install -q --no-build-isolation --no-deps . ||
  die "pip install . failed (see above)"
.venv/bin/python -c "import salus, salus.torch, torch; salus.torch._load()" ||
  die "the salus package does not import"
log "Python: $(.venv/bin/python -c 'import salus, torch; print("salus", salus.__version__, "torch", torch.__version__)')"
