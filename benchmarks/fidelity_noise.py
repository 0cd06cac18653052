"""How reproducible is the ground truth? Real against real, before the simulator against real.

``benchmarks/fidelity_vllm.py`` replays each workload against the live vLLM server a few times
per campaign and compares the simulation with the median of those runs. This reads the real runs
that several campaigns saved (``<campaign>/real/<workload>/run*/summary.json``) and asks how
well those medians agree *with each other* for the same scenario (the runs' ``scenario.yaml``
must be byte-identical across campaigns; a workload whose scenario differs is reported apart):

* per campaign: the median of its runs (what the simulation is scored against);
* across campaigns: min-max of those medians, and the median pairwise relative difference
  |a - b| / b over all ordered pairs of campaigns;
* ``best band``: the most campaigns that one value, chosen after the fact with every campaign
  known (an oracle), lies within ±5 % of (±10 % for TTFT). A simulator whose prediction is
  fixed before the runs can be on target for at most that many;
* within each campaign, the range (max - min) of its back-to-back runs over their median.

    .venv/bin/python benchmarks/fidelity_noise.py /tmp/fid4 /tmp/fid5 ... [--json out.json]

It reads only saved files: no server, no simulation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
from pathlib import Path

METRICS = (("median_ttft_ms", "TTFT p50", 0.10), ("median_tpot_ms", "TPOT p50", 0.05),
           ("median_e2el_ms", "E2EL p50", 0.05), ("output_throughput", "out tok/s", 0.05))


def campaign_runs(campaign: Path) -> dict[str, list[tuple[str, dict]]]:
    """workload -> [(scenario hash, summary metrics)] for each run saved by one campaign."""
    out: dict[str, list[tuple[str, dict]]] = {}
    for summary in sorted(campaign.glob("real/*/run*/summary.json")):
        run = summary.parent
        scenario = run / "scenario.yaml"
        if not scenario.is_file():
            continue
        digest = hashlib.sha256(scenario.read_bytes()).hexdigest()[:8]
        data = json.loads(summary.read_text())
        out.setdefault(run.parent.name, []).append((digest, data.get("metrics", data)))
    return out


def best_band(values: list[float], tol: float) -> int:
    """The most values within ±tol of one number (relative to that number)."""
    best = 0
    for v in values:                     # a band's best centre puts some value on an edge
        for centre in (v / (1 - tol), v / (1 + tol), v):
            best = max(best, sum(abs(x - centre) <= tol * centre + 1e-12 for x in values))
    return best


def pairwise(values: list[float]) -> float:
    diffs = [abs(a - b) / b for i, a in enumerate(values) for j, b in enumerate(values) if i != j]
    return statistics.median(diffs) if diffs else 0.0


def analyse(campaigns: list[Path]) -> list[dict]:
    runs = {c: campaign_runs(c) for c in campaigns}
    workloads = sorted({w for got in runs.values() for w in got})
    rows = []
    for w in workloads:
        # group campaigns by the workload's scenario: only identical scenarios compare
        groups: dict[str, list[tuple[str, list[dict]]]] = {}
        for c in campaigns:
            got = runs[c].get(w, [])
            digests = {d for d, _ in got}
            if len(digests) != 1:
                continue
            groups.setdefault(digests.pop(), []).append((c.name, [m for _, m in got]))
        for digest, members in groups.items():
            if len(members) < 2:
                continue
            row = {"workload": w, "scenario": digest, "campaigns": [n for n, _ in members],
                   "metrics": {}}
            for key, label, tol in METRICS:
                medians = [statistics.median(m[key] for m in ms) for _, ms in members]
                within = [(min(m[key] for m in ms), max(m[key] for m in ms))
                          for _, ms in members]
                spread = statistics.median((hi - lo) / med for (lo, hi), med in
                                           zip(within, medians))
                row["metrics"][label] = {
                    "medians": medians, "within_campaign": within,
                    "within_campaign_median_range": spread,
                    "min": min(medians), "max": max(medians),
                    "pairwise_median_rel_diff": pairwise(medians),
                    "tolerance": tol, "best_band": best_band(medians, tol)}
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaigns", nargs="+", type=Path,
                    help="output folders of benchmarks/fidelity_vllm.py (each with real/)")
    ap.add_argument("--json", type=Path, help="write the table as JSON too")
    args = ap.parse_args(argv)
    missing = [str(c) for c in args.campaigns if not (c / "real").is_dir()]
    if missing:
        print(f"fidelity_noise: error: no real/ folder in {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = analyse(args.campaigns)
    if not rows:
        print("fidelity_noise: error: no workload was replayed with the same scenario in two "
              "campaigns", file=sys.stderr)
        return 2
    print(f"{'workload':<20} {'metric':<10} {'campaign medians (min-max)':<27} "
          f"{'pairwise':>9} {'best band':>10} {'in-campaign range':>18}")
    for row in rows:
        n = len(row["campaigns"])
        for label, m in row["metrics"].items():
            print(f"{row['workload']:<20} {label:<10} {m['min']:>10.2f} - {m['max']:<14.2f} "
                  f"{100 * m['pairwise_median_rel_diff']:>8.1f}% "
                  f"{m['best_band']:>3}/{n} ±{100 * m['tolerance']:.0f}%"
                  f"{100 * m['within_campaign_median_range']:>17.1f}%")
    print("pairwise: median |a - b| / b over pairs of campaigns' medians; best band: the most "
          "campaigns one value (chosen knowing them all) is within the tolerance of; "
          "in-campaign range: median over campaigns of (max - min) / median of its runs")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
