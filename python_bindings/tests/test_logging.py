"""Salus's messages from Python: on standard error, never standard output (a script's output is
its own), at the level SALUS_LOG_LEVEL or salus.set_log_level says."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

import salus

WARNING = "1 blocks still live at shutdown"

# A script that prints its result and leaves a block allocated when its runtime closes, so that
# Salus has a warning to give.
SCRIPT = """
import salus
{setup}
runtime = salus.Runtime("sim", memory="64MiB")
runtime.allocate(4096)
runtime.close()
print("result 42")
"""


def run_script(setup: str = "", level: Optional[str] = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SALUS_LOG_LEVEL"}
    if level is not None:
        env["SALUS_LOG_LEVEL"] = level
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(setup=setup)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def test_warnings_go_to_standard_error_never_standard_output() -> None:
    done = run_script()
    assert done.stdout == "result 42\n"
    assert WARNING in done.stderr
    assert "[salus] [warning]" in done.stderr


def test_the_environment_or_set_log_level_sets_the_level() -> None:
    assert WARNING not in run_script(level="off").stderr
    assert WARNING not in run_script(setup='salus.set_log_level("error")').stderr
    # The call overrides the environment.
    assert WARNING in run_script(setup='salus.set_log_level("warn")', level="off").stderr
    unknown = run_script(level="loud")
    assert "SALUS_LOG_LEVEL is 'loud'" in unknown.stderr
    assert WARNING in unknown.stderr
    assert unknown.stdout == "result 42\n"


def test_set_log_level_takes_every_level_in_any_case() -> None:
    before = salus.log_level()
    try:
        for level in salus.LOG_LEVELS:
            salus.set_log_level(level.upper())
            assert salus.log_level() == level
    finally:
        salus.set_log_level(before)
    assert salus.log_level() == before
