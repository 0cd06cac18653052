"""Fault injection: which replica fails when, how long it takes to come back, and what happens
to the requests it held.

A replica fails at a given time (``events``) or at exponentially distributed intervals with
mean ``mtbf_s`` (one seeded stream per replica, drawn when it comes up), and restarts
``restart_s`` seconds later (model load plus warm-up). Its running and queued requests lose
their KV cache; with ``on_failure: retry`` each is sent again to the live replicas (the router
decides; held until one is up if none is), keeping the tokens it already streamed and
recomputing prompt plus those tokens, as a recompute preemption would; after ``max_retries``
failures, or with ``on_failure: fail``, it ends with status ``failed``. The engine applies
these (simserve/engine/runtime.py); this module is plain data and random draws.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simserve.errors import ConfigError
from simserve.fields import Fields, join
from simserve.limits import MAX_FAILURES, MAX_RETRIES, MAX_SECONDS, MIN_MTBF_S

ON_FAILURE = ("retry", "fail")
DEFAULT_RESTART_S = 60.0
# SeedSequence child of the scenario seed for failure times; one grandchild per replica
FAULT_SEED_CHILD = 6


@dataclass(frozen=True)
class FaultEvent:
    replica: int
    at_s: float
    restart_s: float | None = None    # None: FaultConfig.restart_s


@dataclass(frozen=True)
class FaultConfig:
    on_failure: str = "retry"
    max_retries: int = 3
    restart_s: float = DEFAULT_RESTART_S
    mtbf_s: float | None = None
    events: tuple[FaultEvent, ...] = field(default_factory=tuple)

    @classmethod
    def from_fields(cls, f: Fields, num_replicas: int) -> FaultConfig:
        events = []
        raw = f.any("events", [])
        if not isinstance(raw, list):
            raise ConfigError(f.where("events"), "expected a list of {replica, at_s, restart_s}")
        for i, item in enumerate(raw):
            e = Fields(item, join(f.where("events"), i))
            ev = FaultEvent(replica=e.int("replica", min=0, max=num_replicas - 1),
                            at_s=e.float("at_s", min=0.0, max=MAX_SECONDS),
                            restart_s=e.float("restart_s", None, positive=True,
                                              max=MAX_SECONDS))
            e.done()
            events.append(ev)
        cfg = cls(on_failure=f.str("on_failure", "retry", choices=ON_FAILURE),
                  max_retries=f.int("max_retries", 3, min=0, max=MAX_RETRIES),
                  restart_s=f.float("restart_s", DEFAULT_RESTART_S, positive=True,
                                    max=MAX_SECONDS),
                  mtbf_s=f.float("mtbf_s", None, min=MIN_MTBF_S, max=MAX_SECONDS),
                  events=tuple(sorted(events, key=lambda e: (e.at_s, e.replica))))
        f.done()
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return {"on_failure": self.on_failure, "max_retries": self.max_retries,
                "restart_s": self.restart_s, "mtbf_s": self.mtbf_s,
                "events": [{"replica": e.replica, "at_s": e.at_s, "restart_s": e.restart_s}
                           for e in self.events]}

    @property
    def enabled(self) -> bool:
        return bool(self.events) or self.mtbf_s is not None


class FaultSchedule:
    """Failure times: the explicit events, plus per-replica exponential draws when ``mtbf_s``
    is set. A replica's next random failure is drawn when it comes up (at time 0, then at each
    restart), from that replica's own stream, so the draws do not depend on the schedule."""

    def __init__(self, cfg: FaultConfig, num_replicas: int, seed: int = 0):
        self.cfg = cfg
        self._rngs = None
        if cfg.mtbf_s is not None:
            self._rngs = [np.random.default_rng(
                np.random.SeedSequence(seed, spawn_key=(FAULT_SEED_CHILD, i)))
                for i in range(num_replicas)]
        self.num_replicas = num_replicas
        self.num_drawn = 0

    def initial(self) -> list[tuple[float, int, float]]:
        """``(time, replica, restart seconds)`` of the failures known at the start."""
        out = [(e.at_s, e.replica, e.restart_s or self.cfg.restart_s) for e in self.cfg.events]
        for r in range(self.num_replicas):
            nxt = self.next_random(r, 0.0)
            if nxt is not None:
                out.append(nxt)
        return sorted(out)

    def next_random(self, replica: int, up_at: float) -> tuple[float, int, float] | None:
        """The replica's next random failure after it came up at ``up_at`` (None without MTBF)."""
        mtbf = self.cfg.mtbf_s
        if self._rngs is None or mtbf is None:      # (both or neither)
            return None
        self.num_drawn += 1
        if self.num_drawn > MAX_FAILURES:
            # each failure re-routes what the replica held: a tiny MTBF over a long run would
            # never end, so the run stops here with the field to change
            raise ConfigError("cluster.faults.mtbf_s",
                              f"{self.cfg.mtbf_s:g} s gives more than {MAX_FAILURES:,} replica "
                              "failures in this run; raise it (or shorten the workload)")
        gap = float(self._rngs[replica].exponential(mtbf))
        return (up_at + gap, replica, self.cfg.restart_s)
