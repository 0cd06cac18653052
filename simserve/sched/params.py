"""Policy knobs: each policy that has any declares them as one small frozen dataclass.

A field's type (``int``, ``float``, ``str``, ``bool``, optionally ``| None``) and its metadata
(``min``, ``max``, ``positive``, ``choices``) are all the validation needs, so a knob is declared
once and read from the scenario's ``scheduler:`` section with errors that name its path::

    @dataclass(frozen=True)
    class TgiParams:
        waiting_served_ratio: float = knob(0.3, min=0.0)

    read_params(TgiParams, Fields({"waiting_served_ratio": 1.2}, "scheduler"))
"""

from __future__ import annotations

import dataclasses
from typing import Any

from simserve.fields import Fields


def knob(default: Any, **checks: Any) -> Any:
    """A dataclass field with a default and the range/choice checks ``read_params`` applies."""
    return dataclasses.field(default=default, metadata=checks)


def read_params(cls: type, f: Fields) -> Any:
    """An instance of the knob dataclass ``cls`` from the mapping ``f`` (missing = default).

    Does not call ``f.done()``: the caller's section may hold other fields (``policy``).
    """
    values = {}
    for fd in dataclasses.fields(cls):
        kind = str(fd.type).replace(" ", "").removesuffix("|None")
        checks = dict(fd.metadata)
        if kind == "int":
            values[fd.name] = f.int(fd.name, fd.default, **checks)
        elif kind == "float":
            values[fd.name] = f.float(fd.name, fd.default, **checks)
        elif kind == "bool":
            values[fd.name] = f.bool(fd.name, fd.default)
        elif kind == "str":
            values[fd.name] = f.str(fd.name, fd.default, **checks)
        else:
            raise TypeError(f"{cls.__name__}.{fd.name}: unsupported knob type {fd.type}")
    return cls(**values)


def params_to_dict(params: Any) -> dict[str, Any]:
    """The knobs as plain data (None values kept out, so the dict parses back the same)."""
    if params is None:
        return {}
    return {k: v for k, v in dataclasses.asdict(params).items() if v is not None}
