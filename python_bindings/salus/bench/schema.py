"""A small schema checker for experiment files: every key known, every value of the right type
and range, and any mistake reported as one :class:`InputError` naming the file, line and key.

A JSON-schema library would do the checking but not the line numbers, which are what make a typo
in a 60-line TOML file quick to fix; and the rules here are few.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from .._checks import parse_size
from ..errors import InvalidArgument
from .errors import InputError
from .tomlsource import Key, TomlLines


@dataclass
class Context:
    """Where values come from: the file, its line map, and how an effective key maps back to the
    key written in the file (a ``[scale.small]`` override lives elsewhere than the base value)."""

    path: str
    lines: TomlLines
    origins: dict[Key, Key]

    def line(self, key: Key) -> Optional[int]:
        return self.lines.line(self.origins.get(key, key))

    def error(self, key: Key, reason: str) -> InputError:
        shown = self.origins.get(key, key)
        return InputError(self.path, self.line(key), ".".join(shown) or "(file)", reason)


class Spec:
    """Checks one value; returns it (possibly normalized)."""

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        raise NotImplementedError

    @property
    def describe(self) -> str:
        return "a value"


class Str(Spec):
    def __init__(self, choices: Optional[Callable[[], Sequence[str]] | Sequence[str]] = None,
                 what: str = "") -> None:
        self._choices = choices
        self._what = what

    def choices(self) -> Optional[Sequence[str]]:
        if self._choices is None:
            return None
        return self._choices() if callable(self._choices) else self._choices

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        if not isinstance(value, str):
            raise ctx.error(key, f"expected a string, got {_show(value)}")
        known = self.choices()
        if known is not None and value not in known:
            what = f"{self._what} " if self._what else ""
            raise ctx.error(key, f"unknown {what}{value!r} (known: {', '.join(known)})")
        return value

    @property
    def describe(self) -> str:
        return "a string"


class Num(Spec):
    """A number; ``low``/``high`` bounds, ``open_low`` excludes ``low`` itself."""

    def __init__(self, low: Optional[float] = None, high: Optional[float] = None, *,
                 open_low: bool = False, integer: bool = False) -> None:
        self.low, self.high, self.open_low, self.integer = low, high, open_low, integer

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        kind = "an integer" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                self.integer and not isinstance(value, int)):
            raise ctx.error(key, f"expected {kind}, got {_show(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ctx.error(key, f"expected a finite number, got {value}")
        if self.low is not None and (value < self.low or (self.open_low and value == self.low)):
            bound = "greater than" if self.open_low else "at least"
            what = "must not be negative" if self.low == 0 and not self.open_low else \
                f"must be {bound} {self.low:g}"
            raise ctx.error(key, f"{what} (got {value})")
        if self.high is not None and value > self.high:
            raise ctx.error(key, f"must be at most {self.high:g} (got {value})")
        return value if self.integer else float(value)

    @property
    def describe(self) -> str:
        return "an integer" if self.integer else "a number"


class Bool(Spec):
    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        if not isinstance(value, bool):
            raise ctx.error(key, f"expected true or false, got {_show(value)}")
        return value


class Size(Spec):
    """Bytes: an integer or a string such as "16GiB"."""

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        try:
            size = parse_size(value, ".".join(key))
        except (TypeError, InvalidArgument):
            raise ctx.error(key, f"expected a size such as \"16GiB\" or a number of bytes, "
                                 f"got {_show(value)}") from None
        if size == 0:
            raise ctx.error(key, "a size must be greater than 0")
        return size


class ModeSwitch(Spec):
    """``true`` (the experiment runs in this mode) or a string: why it does not."""

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        if value is True or (isinstance(value, str) and value):
            return value
        raise ctx.error(key, "expected true, or a string saying why this mode is not supported")


class ListOf(Spec):
    def __init__(self, item: Spec, *, min_items: int = 1, unique: bool = False) -> None:
        self.item, self.min_items, self.unique = item, min_items, unique

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        if not isinstance(value, list):
            raise ctx.error(key, f"expected a list, got {_show(value)}")
        if len(value) < self.min_items:
            raise ctx.error(key, f"needs at least {self.min_items} item(s)")
        out = [self.item.check(v, ctx, key) for v in value]
        if self.unique and len(set(map(repr, out))) != len(out):
            raise ctx.error(key, "lists an item twice")
        return out


class Table(Spec):
    """A table with known keys; ``required`` ones must be present (after overrides)."""

    def __init__(self, fields: Mapping[str, Spec], required: Sequence[str] = ()) -> None:
        self.fields = dict(fields)
        self.required = tuple(required)

    def check(self, value: Any, ctx: Context, key: Key, *, partial: bool = False) -> Any:
        if not isinstance(value, dict):
            raise ctx.error(key, f"expected a table, got {_show(value)}")
        out: dict[str, Any] = {}
        for name, item in value.items():
            spec = self.fields.get(name)
            if spec is None:
                raise ctx.error(key + (name,), f"unknown key (known here: "
                                               f"{', '.join(sorted(self.fields))})")
            if isinstance(spec, Table):
                out[name] = spec.check(item, ctx, key + (name,), partial=partial)
            else:
                out[name] = spec.check(item, ctx, key + (name,))
        if not partial:
            for name in self.required:
                if name not in out:
                    raise ctx.error(key + (name,), "missing (required)")
        return out


class MapOf(Spec):
    """A table whose keys are free (for example batch size -> occupancy)."""

    def __init__(self, item: Spec) -> None:
        self.item = item

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        if not isinstance(value, dict):
            raise ctx.error(key, f"expected a table, got {_show(value)}")
        return {str(k): self.item.check(v, ctx, key + (str(k),)) for k, v in value.items()}


class ArrayOfTables(Spec):
    def __init__(self, table: Table, *, min_items: int = 1) -> None:
        self.table, self.min_items = table, min_items

    def check(self, value: Any, ctx: Context, key: Key) -> Any:
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ctx.error(key, f"expected an array of tables ([[{'.'.join(key)}]])")
        if len(value) < self.min_items:
            raise ctx.error(key, f"needs at least {self.min_items} item(s)")
        return [self.table.check(v, ctx, key + (str(i),)) for i, v in enumerate(value)]


def merge(base: dict[str, Any], override: dict[str, Any], origins: dict[Key, Key],
          at: Key = (), source: Key = ()) -> dict[str, Any]:
    """``override`` deep-merged over ``base`` (tables merge, anything else replaces);
    ``origins`` learns where each overridden key was written."""
    out = dict(base)
    for name, value in override.items():
        here, there = at + (name,), source + (name,)
        if isinstance(value, dict) and isinstance(out.get(name), dict):
            origins.setdefault(here, there)
            out[name] = merge(out[name], value, origins, here, there)
        else:
            out[name] = value
            _record(origins, value, here, there)
    return out


def _record(origins: dict[Key, Key], value: Any, here: Key, there: Key) -> None:
    origins[here] = there
    if isinstance(value, dict):
        for name, inner in value.items():
            _record(origins, inner, here + (name,), there + (name,))


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
