"""Service-level objectives: per-request latency limits and the attainment target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simserve.errors import ConfigError
from simserve.fields import Fields

_LIMITS = ("ttft_ms", "tpot_ms", "e2el_ms")
# run-level criteria of the seed papers (one number per run, not per request)
AGGREGATES = ("tbt_ms", "scheduling_delay_ms", "normalized_latency_ms")


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Latency limits in milliseconds (``None`` = no limit on that metric).

    A finished request is *good* when every given limit holds (vLLM's goodput). ``attainment`` is
    the target fraction of all sent requests that must be good for the run to meet its SLO.

    Run-level criteria (the papers' capacity definitions), each met or not by the whole run:
    ``tbt_ms`` bounds the ``tbt_percentile`` (99) of all inter-token gaps pooled (Sarathi-Serve's
    P99 TBT); ``scheduling_delay_ms`` the ``scheduling_delay_percentile`` (50: the median) of
    the delay from arrival to first scheduling (Sarathi-Serve: median ≤ 2 s);
    ``normalized_latency_ms`` the mean over finished requests of E2EL / output tokens (vLLM,
    Orca, FastServe). The run meets its SLO when the attainment target and every given
    criterion hold.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    attainment: float = 0.9
    tbt_ms: float | None = None
    tbt_percentile: float = 99.0
    scheduling_delay_ms: float | None = None
    scheduling_delay_percentile: float = 50.0
    normalized_latency_ms: float | None = None

    def __post_init__(self) -> None:
        for name in _LIMITS + AGGREGATES:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"slo.{name}", f"must be > 0, got {value:g}")
        if not 0 < self.attainment <= 1:
            raise ConfigError("slo.attainment", f"must be in (0, 1], got {self.attainment:g}")
        for name in ("tbt_percentile", "scheduling_delay_percentile"):
            if not 0 < getattr(self, name) <= 100:
                raise ConfigError(f"slo.{name}", f"must be in (0, 100], got "
                                                 f"{getattr(self, name):g}")

    @classmethod
    def none(cls) -> SloConfig:
        return cls()

    @classmethod
    def from_fields(cls, f: Fields) -> SloConfig:
        """Read an ``slo:`` section; every field is optional."""
        limits = {name: f.float(name, None, positive=True) for name in _LIMITS + AGGREGATES}
        attainment = f.float("attainment", 0.9, positive=True, max=1)
        pcts = {name: f.float(name, default, positive=True, max=100)
                for name, default in (("tbt_percentile", 99.0),
                                      ("scheduling_delay_percentile", 50.0))}
        f.done()
        return cls(**limits, attainment=attainment, **pcts)

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in _LIMITS + AGGREGATES)

    @property
    def has_request_limits(self) -> bool:
        return any(getattr(self, name) is not None for name in _LIMITS)

    @property
    def has_aggregates(self) -> bool:
        return any(getattr(self, name) is not None for name in AGGREGATES)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
                               "e2el_ms": self.e2el_ms, "attainment": self.attainment}
        # the run-level criteria only where given (older outputs unchanged)
        if self.tbt_ms is not None:
            out.update(tbt_ms=self.tbt_ms, tbt_percentile=self.tbt_percentile)
        if self.scheduling_delay_ms is not None:
            out.update(scheduling_delay_ms=self.scheduling_delay_ms,
                       scheduling_delay_percentile=self.scheduling_delay_percentile)
        if self.normalized_latency_ms is not None:
            out["normalized_latency_ms"] = self.normalized_latency_ms
        return out
