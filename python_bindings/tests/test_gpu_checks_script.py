"""scripts/gpu_checks.py runs only on a GPU; here its checks must at least be valid Python with
distinct names, and it must say it skips when PyTorch sees no GPU."""

from __future__ import annotations

import importlib.util
import pathlib
import subprocess
import sys
import textwrap
import types

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gpu_checks.py"


def load() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_checks", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_every_check_compiles_and_names_are_distinct() -> None:
    checks = load()
    names = [c.name for c in checks.CHECKS]
    assert len(names) == len(set(names)) >= 7
    for check in checks.CHECKS:
        compile(checks.PRELUDE + textwrap.dedent(check.code), check.name, "exec")


def test_without_a_gpu_it_says_it_skips() -> None:
    import torch

    if torch.cuda.is_available():
        return  # a GPU machine runs the checks themselves
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0 and "SKIP" in proc.stdout
