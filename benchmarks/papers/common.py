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


def max_rate(scenario, tolerance: float = TOLERANCE, hold: str = "requests") -> float:
    """The highest rate meeting the scenario's whole SLO (one seed; simserve.capacity).
    ``hold="duration"``: every probe runs the workload's duration of arrivals at its rate, as
    a harness that runs each rate for a fixed time (DistServe's artifact: 100 s a rate)."""
    return capacity(scenario, tolerance=tolerance, seeds=1, hold=hold).max_rate


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
