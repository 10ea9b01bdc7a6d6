"""Started by ``salus run``: shares this Python process through salusd before the script runs.

``salus run`` puts this directory first on ``PYTHONPATH``, so Python imports this module at
start-up (``site``). It does its work only in the process ``salus run`` started (the variable
``SALUS_RUN`` says so, and is then removed: a worker process the script spawns is not another
job), then hands over to any ``sitecustomize`` further down the path.
"""
import importlib
import os
import sys

if os.environ.pop("SALUS_RUN", None) == "1":
    # A failure here must stop the script: run without Salus, it would take memory and turns
    # nobody accounts for, while its user believes it shares (site would print a warning only).
    try:
        from salus import _run_boot

        _run_boot.start()
    except Exception as e:  # noqa: BLE001: whatever it was, the script must not run
        raise SystemExit(f"salus run: cannot set up Salus in {sys.executable}: "
                         f"{type(e).__name__}: {e}") from e

# The next sitecustomize on the path (a distribution's own), as if this one were not here.
_here = os.path.dirname(os.path.abspath(__file__))
_path = sys.path[:]
try:
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    _self = sys.modules.pop("sitecustomize", None)
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        if _self is not None:
            sys.modules["sitecustomize"] = _self
finally:
    sys.path[:] = _path
