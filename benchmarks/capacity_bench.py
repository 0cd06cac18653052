"""Wall time of one capacity search on scenarios/quickstart.yaml (1,000 requests per probe).

    .venv/bin/python benchmarks/capacity_bench.py [--seeds 3] [--tolerance 0.05]

Target: ≤ 10 s on a 2-core machine once the engine fast-forwards decode stretches.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from simserve.plan.capacity import capacity

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "quickstart.yaml"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--tolerance", type=float, default=0.05)
    args = p.parse_args()
    t0 = time.perf_counter()
    result = capacity(SCENARIO, seeds=args.seeds, tolerance=args.tolerance)
    wall = time.perf_counter() - t0
    print(result.table())
    print(f"\ncapacity search: {len(result.probes)} runs of "
          f"{int(result.probes['num_requests'].max())} requests in {wall:.2f} s wall "
          f"({wall / len(result.probes):.3f} s per run)")


if __name__ == "__main__":
    main()
