"""salus-bench errors: exceptions with fields, like the rest of ``salus.errors``.

A researcher's typo in a TOML file or a CSV must end the run with one message that says where to
look; so every input problem is an :class:`InputError` carrying the file, the line and the field,
and the command line prints it as ``path:line: field: reason``.
"""

from __future__ import annotations

from typing import Optional

from ..errors import InvalidArgument, NotSupported


class InputError(InvalidArgument):
    """Bad input: an experiment file, a workload CSV or a command-line option.

    Fields: ``path`` (the file, or ``<command line>``), ``line`` (1-based, ``None`` when the
    problem has no line, such as a missing key), ``field`` (the TOML key as a dotted path, the CSV
    column or the option) and ``reason`` (what is wrong, and what would be right).
    """

    path: str
    line: Optional[int]
    field: str
    reason: str

    def __init__(self, path: str, line: Optional[int], field: str, reason: str) -> None:
        super().__init__(_where(path, line, field, reason), path=str(path), line=line,
                         field=field, reason=reason)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.path, self.line, self.field, self.reason))


class ModeNotSupported(NotSupported):
    """An experiment that cannot run in the mode asked for (for example harvesting in the
    discrete-event simulator, which has no memory tiers). Fields: ``experiment``, ``mode``,
    ``reason``."""

    experiment: str
    mode: str
    reason: str

    def __init__(self, experiment: str, mode: str, reason: str) -> None:
        super().__init__(f"experiment '{experiment}' does not run in mode '{mode}': {reason}",
                         experiment=experiment, mode=mode, reason=reason)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.experiment, self.mode, self.reason))


def _where(path: str, line: Optional[int], field: str, reason: str) -> str:
    place = f"{path}:{line}" if line is not None else str(path)
    return f"{place}: {field}: {reason}"


__all__ = ["InputError", "ModeNotSupported"]
