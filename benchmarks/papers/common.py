"""Shared pieces of the seed papers' reproductions (benchmarks/papers/*.py).

Each reproduction is one scenario file (``<name>.yaml`` beside its script, variants under
``compare:``) and one script that runs it, prints the paper's number, simserve's and their
ratio, and says whether the ratio lands inside the paper's reported range — or names the
mechanism still missing. ``run_all.py`` runs all five and saves what they print under
``results/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

import simserve  # noqa: E402
from simserve.plan.capacity import capacity  # noqa: E402
from simserve.config import load_variants  # noqa: E402


def variants(name: str, overrides: list[str] | None = None) -> dict:
    """label -> Scenario of ``<name>.yaml`` (with ``--set``-style overrides on every variant)."""
    return dict(load_variants(HERE / f"{name}.yaml", overrides or []))


def strict_and_relaxed(name: str, relaxed_tbt_ms: int) -> tuple[dict, dict]:
    """Sarathi-Serve's two SLO regimes of ``<name>.yaml``: the variants as written (strict), and
    with ``slo.tbt_ms`` relaxed, Sarathi's token budget raised from 512 to 2048 as the paper
    runs it there (the variant renamed ``sarathi-2048``)."""
    import dataclasses
    strict = variants(name)
    relaxed = variants(name, [f"slo.tbt_ms={relaxed_tbt_ms}"])
    s512 = relaxed.pop("sarathi-512")
    relaxed["sarathi-2048"] = s512.replace(
        engine=dataclasses.replace(s512.engine, max_num_batched_tokens=2048))
    return strict, relaxed


TOLERANCE = 0.08


def max_rate(scenario, tolerance: float = TOLERANCE) -> float:
    """The highest rate meeting the scenario's whole SLO (one seed; simserve.capacity)."""
    return capacity(scenario, tolerance=tolerance, seeds=1).max_rate


MAX_TIMED_REQUESTS = 1_000_000       # a timed probe larger than this is refused


def max_rate_timed(scenario, tolerance: float = TOLERANCE) -> float:
    """The highest rate meeting the scenario's whole SLO when every probe runs the scenario's
    ``workload.duration`` of arrivals at its rate (so more requests at a higher rate), as a
    harness that runs each rate for a fixed time measures it (DistServe's artifact: 100 s a
    rate). ``simserve.capacity`` instead keeps the request count fixed while it searches.
    Brackets by doubling or halving from the scenario's rate, then bisects geometrically to
    ``tolerance``; one seed (the scenario's)."""
    import math

    from simserve.plan.capacity import with_rate
    from simserve.runner import run as run_once

    arrival = scenario.workload.arrival
    if arrival is None or arrival.duration_s is None:
        raise ValueError(f"{scenario.name}: max_rate_timed needs workload.duration")
    met: dict[float, bool] = {}

    def meets(rate: float) -> bool:
        if rate * arrival.duration_s > MAX_TIMED_REQUESTS:
            raise ValueError(f"{scenario.name}: the SLO is still met at {rate / 2:.3g} req/s; "
                             f"a probe at {rate:.3g} would send over {MAX_TIMED_REQUESTS:,} "
                             f"requests")
        if rate not in met:
            met[rate] = bool(run_once(with_rate(scenario, rate)).summary.get("slo_met"))
        return met[rate]

    rate = arrival.rate
    if meets(rate):                          # double until a rate misses
        lo = rate
        for _ in range(30):
            if not meets(lo * 2):
                break
            lo *= 2
        else:
            raise ValueError(f"{scenario.name}: the SLO is still met at {lo:.3g} req/s")
        hi = lo * 2
    else:                                    # halve until a rate meets
        hi = rate
        for _ in range(30):
            if hi / 2 * arrival.duration_s < 2:
                raise ValueError(f"{scenario.name}: the SLO is missed even at {hi:.3g} req/s")
            if meets(hi / 2):
                break
            hi /= 2
        else:
            raise ValueError(f"{scenario.name}: the SLO is missed even at {hi:.3g} req/s")
        lo = hi / 2
    while (hi - lo) / lo > tolerance:
        mid = math.sqrt(lo * hi)
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo


def run(scenario) -> dict:
    return simserve.run(scenario).summary


def verdict(ratio: float, low: float, high: float, missing: str, tolerance: float = 0.0) -> str:
    """Inside when the ratio, known to within the capacity search's resolution (each capacity
    in [found, found · (1 + tolerance)), so their ratio within a factor 1 + tolerance either
    way), can lie in the paper's range."""
    lo_r, hi_r = ratio / (1 + tolerance), ratio * (1 + tolerance)
    if hi_r >= low and lo_r <= high:
        how = "" if low <= ratio <= high else f" (within the search's ±{tolerance:.0%})"
        return f"INSIDE the paper's range [{low:g}, {high:g}]{how}"
    return f"OUTSIDE the paper's range [{low:g}, {high:g}]: {missing}"


def table(rows: list[tuple[str, str, str, str]],
          head: tuple[str, str, str, str] = ("comparison", "paper", "simserve",
                                             "simserve / paper")) -> str:
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(4)]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))   # noqa: E731
    return "\n".join([line(head), line(tuple("-" * w for w in widths)), *map(line, rows)])
