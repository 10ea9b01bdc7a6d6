"""Measured workloads: the rows of a ``salus_workloads.csv``-shaped file, checked as they are read.

Each row is one training workload measured alone on a GPU: its completion time, its peak memory
and its iteration count. Per-iteration time is ``jct_seconds / iterations``. Optional columns
let a user give what the original measurements lack (occupancy, kind, forward fraction) or turn
the file into a trace (arrival times).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .errors import InputError

MiB = 1 << 20
REQUIRED_COLUMNS = ("workload", "jct_seconds", "peak_memory_mb", "iterations")
OPTIONAL_COLUMNS = ("occupancy", "kind", "forward_fraction", "arrival_seconds")
KINDS = ("training", "inference")


@dataclass(frozen=True)
class Workload:
    """One row. ``model`` and ``batch`` come from a ``model_batch_duration`` name where it has
    that shape (None otherwise); ``line`` is the row's line in its file."""

    name: str
    jct_seconds: float
    peak_bytes: int
    iterations: int
    line: int
    occupancy: Optional[float] = None
    kind: Optional[str] = None
    forward_fraction: Optional[float] = None
    arrival_seconds: Optional[float] = None

    @property
    def iteration_seconds(self) -> float:
        return self.jct_seconds / self.iterations

    @property
    def model(self) -> str:
        return self.name.split("_")[0]

    @property
    def batch(self) -> Optional[str]:
        parts = self.name.split("_")
        return parts[1] if len(parts) >= 2 and parts[1].isdigit() else None


def load_workloads(path: Path, *, trace: bool = False) -> list[Workload]:
    """Every row of ``path``. Names must be unique unless ``trace`` (then each row is one job
    and ``arrival_seconds`` is required)."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(shown, None, "(file)", f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InputError(shown, None, "(file)", f"not UTF-8 text: {e.reason}") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        raise InputError(shown, 1, "(header)", "the file is empty")
    columns = [c.strip() for c in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if trace and "arrival_seconds" not in columns:
        missing.append("arrival_seconds")
    if missing:
        raise InputError(shown, 1, missing[0],
                         f"missing column (the header needs {', '.join(REQUIRED_COLUMNS)}"
                         f"{' and arrival_seconds' if trace else ''})")
    unknown = [c for c in columns if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
    if unknown:
        raise InputError(shown, 1, unknown[0], "unknown column (known: "
                         f"{', '.join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)})")
    if len(set(columns)) != len(columns):
        raise InputError(shown, 1, "(header)", "a column is named twice")
    rows: list[Workload] = []
    seen: dict[str, int] = {}
    try:
        for fields in reader:
            line = reader.line_num
            if not fields or all(not f.strip() for f in fields):
                continue
            if len(fields) != len(columns):
                raise InputError(shown, line, "(row)", f"has {len(fields)} fields, the header "
                                 f"has {len(columns)}")
            row = {c: f.strip() for c, f in zip(columns, fields)}
            workload = _parse_row(row, shown, line)
            if not trace and workload.name in seen:
                raise InputError(shown, line, "workload", f"{workload.name!r} is listed twice "
                                 f"(also on line {seen[workload.name]})")
            seen.setdefault(workload.name, line)
            rows.append(workload)
    except csv.Error as e:
        raise InputError(shown, reader.line_num, "(row)", f"not valid CSV: {e}") from None
    if not rows:
        raise InputError(shown, 2, "(row)", "no workloads in the file")
    return rows


def _parse_row(row: dict[str, str], path: str, line: int) -> Workload:
    def number(column: str, *, positive: bool, integer: bool = False,
               at_most: Optional[float] = None) -> float:
        text = row[column]
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            kind = "a whole number" if integer else "a number"
            raise InputError(path, line, column, f"expected {kind}, got {text!r}") from None
        if not math.isfinite(value):
            raise InputError(path, line, column, f"expected a finite number, got {text!r}")
        if value < 0:
            raise InputError(path, line, column, f"must not be negative (got {text})")
        if positive and value == 0:
            raise InputError(path, line, column, "must be greater than 0")
        if at_most is not None and value > at_most:
            raise InputError(path, line, column, f"must be at most {at_most:g} (got {text})")
        return value

    name = row["workload"]
    if not name:
        raise InputError(path, line, "workload", "empty name")
    kind = row.get("kind") or None
    if kind is not None and kind not in KINDS:
        raise InputError(path, line, "kind", f"unknown kind {kind!r} (known: {', '.join(KINDS)})")

    def optional(column: str, **limits: object) -> Optional[float]:
        return number(column, **limits) if row.get(column) else None  # type: ignore[arg-type]

    forward = optional("forward_fraction", positive=True, at_most=1.0)
    if forward is not None and forward >= 1.0:
        raise InputError(path, line, "forward_fraction", "must be below 1 (backward follows)")
    # At most 2**62 bytes (a size the native side holds); beyond 1e302 MB the product is not even
    # finite (found by fuzzing: int(inf) raised OverflowError).
    peak_mb = number("peak_memory_mb", positive=True, at_most=float(2**62 // MiB))
    return Workload(
        name=name,
        jct_seconds=number("jct_seconds", positive=True),
        peak_bytes=int(peak_mb * MiB),
        iterations=int(number("iterations", positive=True, integer=True)),
        line=line,
        occupancy=optional("occupancy", positive=True, at_most=1.0),
        kind=kind,
        forward_fraction=forward,
        arrival_seconds=optional("arrival_seconds", positive=False),
    )


def select(workloads: list[Workload], include: list[str], exclude: list[str],
           ) -> tuple[list[Workload], Optional[str]]:
    """The workloads matching any ``include`` pattern (fnmatch) and no ``exclude`` one, and the
    first include pattern that matched nothing (a typo, reported by the caller), if any."""
    unmatched = next((p for p in include
                      if not any(fnmatch.fnmatchcase(w.name, p) for w in workloads)), None)
    chosen = [w for w in workloads
              if any(fnmatch.fnmatchcase(w.name, p) for p in include)
              and not any(fnmatch.fnmatchcase(w.name, p) for p in exclude)]
    return chosen, unmatched
