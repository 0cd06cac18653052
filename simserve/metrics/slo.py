"""Service-level objectives: per-request latency limits and the attainment target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simserve.errors import ConfigError
from simserve.fields import Fields

_LIMITS = ("ttft_ms", "tpot_ms", "e2el_ms")


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Latency limits in milliseconds (``None`` = no limit on that metric).

    A finished request is *good* when every given limit holds (vLLM's goodput). ``attainment`` is
    the target fraction of all sent requests that must be good for the run to meet its SLO.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None
    attainment: float = 0.9

    def __post_init__(self) -> None:
        for name in _LIMITS:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"slo.{name}", f"must be > 0, got {value:g}")
        if not 0 < self.attainment <= 1:
            raise ConfigError("slo.attainment", f"must be in (0, 1], got {self.attainment:g}")

    @classmethod
    def none(cls) -> SloConfig:
        return cls()

    @classmethod
    def from_fields(cls, f: Fields) -> SloConfig:
        """Read an ``slo:`` section; every field is optional."""
        limits = {name: f.float(name, None, positive=True) for name in _LIMITS}
        attainment = f.float("attainment", 0.9, positive=True, max=1)
        f.done()
        return cls(**limits, attainment=attainment)

    @property
    def is_empty(self) -> bool:
        return all(getattr(self, name) is None for name in _LIMITS)

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2el_ms": self.e2el_ms,
                "attainment": self.attainment}
