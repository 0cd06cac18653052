"""Metrics computed after a run from the recorder's tables (see docs/metrics.md).

The names below are imported on first use: ``simserve.metrics.slo`` is read while a scenario
is parsed, and the summary is not needed before a simulation ends. No module here imports
pandas: the summary reads NumPy columns (or a DataFrame's, when given one).
"""

from typing import Any

_EXPORTS = {"SloConfig": "simserve.metrics.slo", "format_summary": "simserve.metrics.summary",
            "summarize": "simserve.metrics.summary"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'simserve.metrics' has no attribute {name!r}")
