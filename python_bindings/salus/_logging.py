"""Where Salus's messages go: standard error, never standard output, at a level set here or by
the environment variable ``SALUS_LOG_LEVEL`` (trace, debug, info, warn, error, critical or off;
default warn).

Python gets no callback sink, unlike C++ (``salus::set_log_sink``) and C
(``salus_set_log_callback``): Salus logs while holding its internal locks and from its streams'
worker threads, so a callback into Python would take the GIL there, while a Python thread that
holds the GIL may be waiting for one of those locks (not every call releases the GIL first): a
deadlock. Redirect file descriptor 2 to capture the messages in Python.
"""

from __future__ import annotations

from . import _salus
from ._checks import check_str

LOG_LEVELS = ("trace", "debug", "info", "warn", "error", "critical", "off")


def set_log_level(level: str) -> None:
    """Messages below ``level`` (one of :data:`LOG_LEVELS`; any case) are dropped; "off" drops
    all. Overrides ``SALUS_LOG_LEVEL``."""
    _salus.set_log_level(check_str(level, "level"))


def log_level() -> str:
    """The level now: one of :data:`LOG_LEVELS`."""
    return str(_salus.log_level())
