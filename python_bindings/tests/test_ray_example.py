"""examples/ray_tune_sharing.py runs (it starts its own local Ray cluster) and shares GPUs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_tune_sharing.py"


def test_sixteen_trials_share_two_simulated_gpus() -> None:
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    done = subprocess.run([sys.executable, str(EXAMPLE), "--no-tune"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 trials, 0 failed" in done.stdout
    at_once = [int(n) for n in re.findall(r"at most (\d+) at once", done.stdout)]
    assert len(at_once) == 2 and max(at_once) >= 2, done.stdout
    losses = [float(line.split()[2]) for line in done.stdout.splitlines()
              if re.match(r"^\s+0\.\d+\s+\d+\s+\d", line)]
    assert len(losses) == 16
