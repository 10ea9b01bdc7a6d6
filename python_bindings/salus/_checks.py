"""Argument checks shared by the package's entry points.

A bad argument is a ``TypeError`` (wrong type) or an :class:`~salus.errors.InvalidArgument` (a
``ValueError``: wrong value) whose message names the argument, raised before anything reaches
the C++ runtime, so a call that fails changes nothing. Integers are also checked against the C++
type they go to: pybind11 refuses one that does not fit with a ``TypeError`` that names no
argument.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, Optional, Union

from .errors import InvalidArgument

Size = Union[int, str]

# The C++ types' ranges (size_t and uintptr_t are 64 bits where Salus runs).
INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
UINT64_MAX = SIZE_MAX = (1 << 64) - 1

# The size grammar of every Salus door (salusd's parse_size too): any case; K, M, G, T as KiB ...
_UNITS = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
          "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
          "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
# More digits than this before the point is beyond SIZE_MAX bytes whatever the unit; checked
# before any arithmetic, since Python refuses to read ints of thousands of digits at all.
_MAX_SIZE_DIGITS = 20


def parse_size(value: Size, what: str) -> int:
    """Bytes from an int or a string such as "512MiB" or "4 GiB": at most 2**64 - 1."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"{what} must be a number of bytes or a string like '4GiB', "
                        f"not {type(value).__name__}")
    if isinstance(value, int):
        return _check_range(value, what, 0, SIZE_MAX)
    match = _SIZE.match(value)
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS:
        raise InvalidArgument(f"{what}: cannot read {value!r} as a size (say 512MiB, 4GiB, ...)")
    number = match.group(1)
    if len(number.split(".")[0].lstrip("0")) > _MAX_SIZE_DIGITS:
        raise InvalidArgument(f"{what}: {value!r} is more than {SIZE_MAX} bytes")
    try:
        # Exact: a float turns a long number into infinity, and rounds large sizes.
        exact = Fraction(number)
    except ValueError:  # thousands of digits after the point
        raise InvalidArgument(f"{what}: cannot read {value!r} as a size (too many digits)") \
            from None
    return _check_range(int(exact * _UNITS[unit]), what, 0, SIZE_MAX)


def check_int(value: Any, what: str, low: Optional[int] = None,
              high: Optional[int] = None) -> int:
    """An int (not a bool) in [low, high]: pass the bounds of the C++ type it goes to."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    return _check_range(value, what, low, high)


def _check_range(value: int, what: str, low: Optional[int], high: Optional[int]) -> int:
    if low is not None and value < low:
        raise InvalidArgument(f"{what} must be at least {low} (got {value})")
    if high is not None and value > high:
        raise InvalidArgument(f"{what} must be at most {high} (got {value})")
    return value


def check_number(value: Any, what: str, low: Optional[float] = None) -> float:
    """A finite float, or an int that converts to one, at least ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number, not {type(value).__name__}")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidArgument(f"{what} is too large for a float (an int of "
                              f"{value.bit_length()} bits)") from None
    if not math.isfinite(number):
        raise InvalidArgument(f"{what} must be a finite number (got {number})")
    if low is not None and number < low:
        raise InvalidArgument(f"{what} must be at least {low} (got {number})")
    return number


def check_str(value: Any, what: str) -> str:
    """Only the type: the runtime refuses unknown names itself, listing the known ones."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a string, not {type(value).__name__}")
    return value


def check_items(value: Any, what: str) -> list[Any]:
    """The items of a list, tuple or other iterable; never a string's characters."""
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Iterable):
        raise TypeError(f"{what} must be a list or tuple, not {type(value).__name__}")
    return list(value)
