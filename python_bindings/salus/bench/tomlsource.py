"""Where each key of a TOML file is: line numbers for error messages.

``tomllib`` returns plain values without positions, yet an error in an experiment file is only
useful if it names the line. The experiment files are small and hand-written, so a line scanner
that follows table headers, dotted keys and one-line inline tables is enough; a key it cannot
place falls back to its closest enclosing table (or to no line).
"""

from __future__ import annotations

import re
from typing import Optional

Key = tuple[str, ...]

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_ASSIGN = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
                     r"""(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_INLINE_KEY = re.compile(r"""[{,]\s*([A-Za-z0-9_-]+|"[^"]*"|'[^']*')\s*=""")


def _split_key(text: str) -> Key:
    parts = re.findall(r"""[A-Za-z0-9_-]+|"[^"]*"|'[^']*'""", text)
    return tuple(p[1:-1] if p[:1] in "\"'" else p for p in parts)


class TomlLines:
    """Maps dotted key paths to 1-based line numbers. Array-of-tables elements are indexed with
    their position as a string ("harvest", "job", "0", "name")."""

    def __init__(self, text: str) -> None:
        self._lines: dict[Key, int] = {}
        self._scan(text)

    def _scan(self, text: str) -> None:
        table: Key = ()
        arrays: dict[Key, int] = {}
        in_string = False
        for number, raw in enumerate(text.splitlines(), start=1):
            quotes = raw.count('"""') + raw.count("'''")
            if in_string:
                in_string = quotes % 2 == 0
                continue
            header = _HEADER.match(raw)
            if header:
                key = _split_key(header.group(2))
                if header.group(1) == "[[":
                    index = arrays.get(key, -1) + 1
                    arrays[key] = index
                    key = key + (str(index),)
                table = key
                self._lines.setdefault(table, number)
                continue
            assign = _ASSIGN.match(raw)
            if assign:
                key = table + _split_key(assign.group(1))
                self._lines.setdefault(key, number)
                rest = raw[assign.end():]
                brace = rest.find("{")
                if brace >= 0:
                    for inner in _INLINE_KEY.finditer(rest[brace:]):
                        self._lines.setdefault(key + _split_key(inner.group(1)), number)
            in_string = quotes % 2 == 1

    def line(self, key: Key) -> Optional[int]:
        """The line of ``key``, else of its closest enclosing table that has one."""
        for end in range(len(key), 0, -1):
            found = self._lines.get(tuple(key[:end]))
            if found is not None:
                return found
        return None
