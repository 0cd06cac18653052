"""The one-method interface every step-latency model implements."""

from __future__ import annotations

from typing import Protocol

from simserve.sched.plan import StepPlan


class LatencyModel(Protocol):
    """Prices one engine iteration.

    ``step_time`` returns the wall-clock seconds the replica spends on ``plan``: model compute,
    attention over the KV cache, LM head and sampling, per-step CPU/scheduling overhead, and any
    swap transfers the plan carries. ``label`` names the model's source for reports
    (e.g. ``"roofline (H100-SXM spec)"``).
    """

    label: str

    def step_time(self, plan: StepPlan) -> float: ...
