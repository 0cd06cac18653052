"""The planning API's arguments (sweep, capacity, plan) as plain Python values.

NumPy scalars (an ``np.int64`` from ``np.arange``, an ``np.float64`` from a DataFrame) are taken
as the int or float they hold, and an array, tuple or range of values as their list, so that a
grid or argument built with NumPy runs, prints and saves exactly as the same values typed by
hand: a NumPy scalar fails ``isinstance(x, int)`` and ``yaml.safe_dump`` cannot write one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simserve.errors import ConfigError


def plain(value: Any) -> Any:
    """``value`` with every NumPy scalar and array in it (in lists, tuples and dicts too) as
    Python's own; a NumPy bool becomes a bool, so it is refused where a number is expected."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(plain(v) for v in value)
    if isinstance(value, dict):
        return {plain(k): plain(v) for k, v in value.items()}
    return value


def as_list(value: Any) -> list | None:
    """A sequence of values (a list, tuple, range or NumPy array of at least one dimension) as a
    plain list; None for anything else, a string included (one value, not its characters)."""
    if isinstance(value, (list, tuple, range)) or (isinstance(value, np.ndarray)
                                                   and value.ndim >= 1):
        return [plain(v) for v in value]
    return None


def number(where: str, value: Any, integer: bool = False) -> Any:
    """``value`` as a plain int or float; a ConfigError naming ``where`` for anything else (a
    bool is not a number, a string is not read as one, a whole float is not an integer)."""
    value = plain(value)
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ConfigError(where, f"expected {'an integer' if integer else 'a number'}, got "
                                 f"{type(value).__name__} {value!r:.60}")
    return value


def check_log(log: Any) -> None:
    """``log`` must be None or a callable taking each line (a str would fail at the first)."""
    if log is not None and not callable(log):
        raise ConfigError("log", f"expected a function taking each line of text, or None, got "
                                 f"{type(log).__name__} {log!r:.60}")
