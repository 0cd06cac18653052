"""How long `simserve plan` takes over a space of >= 300 deployments (issue #32).

Plans benchmarks/data/plan_llama70b.yaml (Llama-3.1-70B on H100-SXM / A100-80GB / L40S, TP x
PP x colocated-or-P:D x two engine knobs) for a target rate, and prints the candidates, how
many each bound pruned, how many were simulated, the wall time and the load average around it.

    PYTHONPATH=. python benchmarks/plan_bench.py [--target-rate 20] [--repeat 2] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from pathlib import Path

from simserve.plan.planner import plan

SCENARIO = Path(__file__).parent / "data" / "plan_llama70b.yaml"


def _cpu_s() -> float:
    """User + system seconds of this process and of its finished child processes (the
    plan's workers: reaped when its process pool closes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-rate", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    walls = []
    for k in range(args.repeat):
        load0 = os.getloadavg()[0]
        cpu0 = _cpu_s()
        t0 = time.perf_counter()
        r = plan(SCENARIO, args.target_rate, workers=args.workers)
        wall = time.perf_counter() - t0
        cpu = _cpu_s() - cpu0
        walls.append(wall)
        w = r.row(r.winner) if r.met else None
        print(f"run {k + 1}: candidates {len(r.table)}, pruned "
              + ", ".join(f"{b} {n}" for b, n in r.pruned.items())
              + f"; simulated {r.simulated} ({len(r.probes)} runs); {wall:.1f} s wall, "
              f"{cpu:.0f} CPU-s (this process and its workers); "
              f"load {load0:.1f} -> {os.getloadavg()[0]:.1f}; cheapest: "
              + (f"{w['deployment']} x {w['replicas']} (${w['cost_per_hour']:.2f}/h)"
                 if w is not None else "none"))
    print(f"median {statistics.median(walls):.1f} s over {len(walls)} runs, "
          f"{os.cpu_count()} cores")


if __name__ == "__main__":
    main()
