"""What ``salus run`` does inside the script's process, before the script: connect to salusd,
route PyTorch's memory through it and add the script's job, whose iterations PyTorch's optimizer
steps mark (:func:`salus.torch.share`). Its settings come in ``SALUS_RUN_*`` variables, which it
removes, so that processes the script starts do not inherit them."""
from __future__ import annotations

import os
import sys
from typing import Any


def _take(name: str) -> str | None:
    return os.environ.pop(name, None)


def start() -> None:
    name = _take("SALUS_RUN_NAME")
    kind = _take("SALUS_RUN_KIND") or "training"
    priority = int(_take("SALUS_RUN_PRIORITY") or "0")
    limit = _take("SALUS_RUN_LIMIT")
    stats = _take("SALUS_RUN_STATS")
    try:
        import salus.torch
    except ImportError as e:  # pragma: no cover: salus run checks this first
        sys.exit(f"salus run: cannot import salus.torch: {e}")
    salus.torch.share(name, priority=priority, kind=kind, limit=limit)
    state = salus.torch._shared
    assert state is not None
    state.by_salus_run = True
    state.stats_path = stats
    _report_salus_errors()


def _report_salus_errors() -> None:
    """A script that dies of an error Salus caused (PyTorch's ``OutOfMemoryError`` over a Salus
    budget) ends with the typed Salus error, chained to PyTorch's: the script itself cannot catch
    what it does not know of, but its log then says which job and which limit."""
    import salus.torch

    previous = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        pending = salus.torch._pending_error()
        if pending is None or pending is exc:
            previous(exc_type, exc, tb)
            return
        pending.__cause__ = exc
        previous(type(pending), pending.with_traceback(None), None)

    sys.excepthook = hook
