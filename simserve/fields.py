"""Reading a YAML mapping into typed values, with errors that name the field.

Each config section is parsed with one :class:`Fields` reader::

    f = Fields(raw, "engine")
    max_num_seqs = f.int("max_num_seqs", default=256, min=1)
    f.done()          # raises ConfigError for any key nobody asked for

Booleans are not accepted where numbers are expected (YAML's ``yes`` is not 1); NumPy's
numbers are, as the plain int or float. Integers are
64-bit unless a field says less (``simserve/limits.py``): every count ends in an int64 column.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from simserve.errors import ConfigError

INT64 = 2**63 - 1

_MISSING = object()
CLOSE = 0.8     # difflib ratio from which an unknown key is taken for a misspelt known one


def join(path: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{path}[{name}]"
    return f"{path}.{name}" if path else name


class Fields:
    """Typed, path-aware accessors over one mapping; tracks which keys were consumed."""

    def __init__(self, raw: Any, path: str):
        if raw is None:
            raw = {}
        if not isinstance(raw, Mapping):
            raise ConfigError(path or "scenario", f"expected a mapping, got {type(raw).__name__}")
        for key in raw:
            if not isinstance(key, str):
                raise ConfigError(path or "scenario", f"field names must be strings, got {key!r}")
        self.raw = raw
        self.path = path
        self._used: set[str] = set()

    def where(self, name: str) -> str:
        return join(self.path, name)

    def has(self, name: str) -> bool:
        return name in self.raw and self.raw[name] is not None

    def any(self, name: str, default: Any = _MISSING) -> Any:
        self._used.add(name)
        if name in self.raw and self.raw[name] is not None:
            return self.raw[name]
        if default is _MISSING:
            raise self.missing(name)
        return default

    def missing(self, name: str, message: str = "is required") -> ConfigError:
        """The error for a required field that is absent: a misspelt key is the likelier
        mistake, so a close unread key is named as unknown first (difflib's ratio)."""
        unread = [k for k in self.raw if k not in self._used and k != name]
        for key in difflib.get_close_matches(name, unread, n=1, cutoff=CLOSE):
            return ConfigError(self.where(key), f"unknown field (did you mean {name}?)")
        return ConfigError(self.where(name), message)

    def int(self, name: str, default: Any = _MISSING, *, min: int | None = None,
            max: int | None = None) -> Any:
        value = self.any(name, default)
        if value is None or (value is default and default is not _MISSING):
            return value
        # (a NumPy integer or whole float, as a notebook passes them, is taken as the int)
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
                not isinstance(value, numbers.Integral) and not float(value).is_integer()):
            raise ConfigError(self.where(name), f"expected an integer, got {value!r}")
        if not -INT64 <= value <= INT64:      # a float such as 1e308 is whole too
            raise ConfigError(self.where(name), f"{value:g} is out of range; at most {INT64:,}")
        value = int(value)
        _check_range(self.where(name), value, min, max)
        return value

    def float(self, name: str, default: Any = _MISSING, *, min: float | None = None,
              max: float | None = None, positive: bool = False) -> Any:
        value = self.any(name, default)
        if value is None or (value is default and default is not _MISSING):
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ConfigError(self.where(name), f"expected a number, got {value!r}")
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise ConfigError(self.where(name), f"expected a finite number, got {value!r}")
        if positive and value <= 0:
            raise ConfigError(self.where(name), f"must be > 0, got {value:g}")
        _check_range(self.where(name), value, min, max)
        return value

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        value = self.any(name, default)
        if value is None or (value is default and default is not _MISSING):
            return value
        if not isinstance(value, bool):
            raise ConfigError(self.where(name), f"expected true or false, got {value!r}")
        return value

    def str(self, name: str, default: Any = _MISSING, *,
            choices: Sequence[str] | None = None) -> Any:
        value = self.any(name, default)
        if value is None or (value is default and default is not _MISSING):
            return value
        if not isinstance(value, str):
            raise ConfigError(self.where(name), f"expected a string, got {value!r}")
        value = str(value)          # (a str subclass, NumPy's np.str_, as the plain str)
        if choices is not None and value not in choices:
            raise ConfigError(self.where(name),
                              f"unknown value {value!r}; expected one of: {', '.join(choices)}")
        return value

    def section(self, name: str) -> Fields:
        return Fields(self.any(name, {}), self.where(name))

    def only(self, names: Iterable[str]) -> None:
        """Raise for a key outside ``names`` before any field is read, so that a misspelt
        field is reported as unknown rather than a required one as missing."""
        _check_known(self.path, self.raw, set(names))

    def done(self) -> None:
        _check_known(self.path, self.raw, self._used)


def _check_known(path: str, raw: Mapping[str, Any], known: set[str]) -> None:
    unknown = [k for k in raw if k not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], sorted(known), n=1, cutoff=CLOSE)
    raise ConfigError(join(path, unknown[0]),
                      f"unknown field (did you mean {close[0]}?)" if close else
                      f"unknown field; known fields here: {', '.join(sorted(known))}")


def _check_range(where: str, value: float, lo: float | None, hi: float | None) -> None:
    if lo is not None and value < lo:
        raise ConfigError(where, f"must be >= {_num(lo)}, got {_num(value)}")
    if hi is not None and value > hi:
        raise ConfigError(where, f"must be <= {_num(hi)}, got {_num(value)}")


def _num(x: float) -> str:
    """A bound or value as written: integers in full (2,147,483,647), floats compactly."""
    if isinstance(x, int) and abs(x) >= 10**6:
        return f"{x:,}"
    return f"{x:g}"
