"""Metrics computed after a run from the recorder's tables (see docs/metrics.md)."""

from simserve.metrics.slo import SloConfig
from simserve.metrics.summary import format_summary, summarize

__all__ = ["SloConfig", "format_summary", "summarize"]
