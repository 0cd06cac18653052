"""What a step-latency model is: one required method, optional capabilities as typed Protocols,
and :class:`Pricing`, the record of what one model offers, asked for once where it is built."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from simserve.sched.plan import Prices, StepPlan


class LatencyModel(Protocol):
    """Prices one engine iteration.

    ``step_time`` returns the wall-clock seconds the replica spends on ``plan``: model compute,
    attention over the KV cache, LM head and sampling, per-step CPU/scheduling overhead, and any
    swap transfers the plan carries. ``label`` names the model's source for reports
    (e.g. ``"roofline (H100-SXM spec; estimate)"``). Everything else a model may offer is one of the
    Protocols below; the engine reads them only through :class:`Pricing`.
    """

    label: str

    def step_time(self, plan: StepPlan) -> float: ...


@runtime_checkable
class StepTimer(Protocol):
    """What ``simserve.run(latency=...)`` checks a model given from Python has (its one
    required method), to refuse a model's name or a config mapping passed in its place."""

    def step_time(self, plan: StepPlan) -> float: ...


@runtime_checkable
class StretchPricing(Protocol):
    """Fast-forward (sched/stretch.py): the prices of a decode stretch starting with ``plan``,
    each bit-identical to ``step_time`` of that step."""

    def decode_stretch(self, plan: StepPlan) -> Prices: ...


@runtime_checkable
class SumPricing(Protocol):
    """Fast-forward for a model whose plain decode step reads the contexts only through their
    sum (the roofline): a stretch segment of ``b`` decodes whose contexts sum to ``total_ctx``,
    and a step of such decodes beside prefill chunks that each end a prompt (requests joining
    a stretch). Bit-identical to ``step_time`` of the same steps."""

    def decode_stretch_sum(self, b: int, total_ctx: int) -> Prices: ...

    def mixed_step_sum(self, b: int, total_ctx: int, prefill_lens: tuple[int, ...],
                       prefill_ctx: tuple[int, ...]) -> float: ...


@runtime_checkable
class CountsPrices(Protocol):
    """A model that counts something as it prices (a profile's lookups outside its grid) takes
    back what a stretch priced and then dropped: ``prices`` (from ``decode_stretch``), steps
    i .. i + n - 1."""

    def forget_prices(self, prices: Any, i: int, n: int) -> None: ...


@runtime_checkable
class CpuPart(Protocol):
    """The engine's CPU time within ``step_time(plan)`` (what async scheduling overlaps with
    the step before): the step overhead and any cost that grows with the plan."""

    def cpu_s(self, plan: StepPlan) -> float: ...


@runtime_checkable
class StepOverhead(Protocol):
    """A fixed CPU time in every step (a model without :class:`CpuPart`)."""

    step_overhead_s: float


@runtime_checkable
class FrontEndDelay(Protocol):
    """A constant per-request delay outside the engine steps (HTTP hand-off and the stream
    back): TTFT and E2EL grow by it (``runner.collect``)."""

    frontend_delay_s: float


@runtime_checkable
class Warns(Protocol):
    """Notes for the run's summary (a profile's extrapolations), read after the run."""

    def warnings(self) -> list[str]: ...


@runtime_checkable
class Breakdown(Protocol):
    """Seconds per component of ``step_time(plan)`` (they sum to it, less ``extra_s``)."""

    def breakdown(self, plan: StepPlan) -> dict[str, float]: ...


@runtime_checkable
class StagePricing(Protocol):
    """A pipeline-parallel replica's model: seconds of ``plan`` on each stage and each send
    between stages (latency/pipeline.py)."""

    def stages(self, plan: StepPlan) -> tuple[list[float], list[float]]: ...


def _no_warnings() -> list[str]:
    return []


def _zero(plan: StepPlan) -> float:
    return 0.0


@dataclass(frozen=True, slots=True, eq=False)
class Pricing:
    """What one latency model offers the engine, resolved once (:meth:`of`): its step price,
    its optional capabilities (None where it has none) and the fallbacks every model gets."""

    model: LatencyModel
    step_time: Callable[[StepPlan], float]
    # a decode stretch's prices: the model's own, else each step's plan priced
    decode_stretch: Callable[[StepPlan], Prices]
    decode_stretch_sum: Callable[[int, int], Prices] | None
    mixed_step_sum: Callable[[int, int, tuple[int, ...], tuple[int, ...]], float] | None
    forget_prices: Callable[[Any, int, int], None] | None
    # the CPU part of a step: the model's cpu_s, else its fixed step overhead, else 0
    cpu_s: Callable[[StepPlan], float]
    frontend_delay_s: float
    warnings: Callable[[], list[str]]
    breakdown: Callable[[StepPlan], dict[str, float]] | None
    stages: Callable[[StepPlan], tuple[list[float], list[float]]] | None

    @classmethod
    def of(cls, model: LatencyModel) -> Pricing:
        if isinstance(model, CpuPart):
            cpu_s = model.cpu_s
        elif isinstance(model, StepOverhead):
            cpu_s = _constant(float(model.step_overhead_s or 0.0))
        else:
            cpu_s = _zero
        return cls(
            model=model,
            step_time=model.step_time,
            decode_stretch=(model.decode_stretch if isinstance(model, StretchPricing)
                            else _step_by_step(model)),
            decode_stretch_sum=(model.decode_stretch_sum if isinstance(model, SumPricing)
                                else None),
            mixed_step_sum=model.mixed_step_sum if isinstance(model, SumPricing) else None,
            forget_prices=model.forget_prices if isinstance(model, CountsPrices) else None,
            cpu_s=cpu_s,
            frontend_delay_s=(float(model.frontend_delay_s or 0.0)
                              if isinstance(model, FrontEndDelay) else 0.0),
            warnings=model.warnings if isinstance(model, Warns) else _no_warnings,
            breakdown=model.breakdown if isinstance(model, Breakdown) else None,
            stages=model.stages if isinstance(model, StagePricing) else None,
        )


def _constant(seconds: float) -> Callable[[StepPlan], float]:
    def cpu_s(plan: StepPlan) -> float:
        return seconds
    return cpu_s


def _step_by_step(model: LatencyModel) -> Callable[[StepPlan], Prices]:
    """``decode_stretch`` for a model without one: each step's plan priced."""
    def decode_stretch(plan: StepPlan) -> Prices:
        def prices(i: int, n: int) -> list[float]:
            return [model.step_time(plan._replace(decode_ctx=tuple(c + m for c in
                                                                   plan.decode_ctx)))
                    for m in range(i, i + n)]
        return prices
    return decode_stretch
