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

    Optional, for fast-forward (``engine.stretch_prices``): ``decode_stretch(plan)`` returns a
    function ``(i, n) -> list`` of the step times of steps i .. i + n - 1 of a decode stretch
    starting with ``plan`` (step i: every context grown by i); a model whose plain decode step
    depends on the contexts only through their sum may also offer ``decode_stretch_sum(b,
    total_ctx)``, the same for ``b`` decoding requests whose contexts sum to ``total_ctx``, and
    ``mixed_step_sum(b, total_ctx, prefill_lens, prefill_ctx)``, the price of a step of such
    decodes beside prefill chunks that each end a prompt (a step at which requests join a
    stretch). All must give values bit-identical to ``step_time`` of each step.

    Optional, for async scheduling: ``step_overhead_s``, the part of every step's time that is
    the engine's CPU work (scheduling, input preparation, output processing) rather than the
    device's: the roofline and profile models have it (``latency.step_overhead_ms``); and
    ``cpu_s(plan)``, that part for one plan where it grows with the plan (a CPU cost per
    sampled sequence, ``latency.per_output_token_ms``).
    """

    label: str

    def step_time(self, plan: StepPlan) -> float: ...


def cpu_overhead_s(model: LatencyModel) -> float:
    """The per-step CPU time within ``model.step_time`` (0 for a model that prices none)."""
    return float(getattr(model, "step_overhead_s", 0.0) or 0.0)


def cpu_part_s(model: LatencyModel, plan: StepPlan) -> float:
    """The CPU time within ``model.step_time(plan)``: the model's ``cpu_s(plan)`` (the
    per-step overhead and a cost per sampled sequence), else its per-step overhead alone."""
    cpu_s = getattr(model, "cpu_s", None)
    return float(cpu_s(plan)) if cpu_s is not None else cpu_overhead_s(model)
