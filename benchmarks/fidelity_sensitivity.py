"""How much would the simulated metrics move if the server ran a little faster or slower?

Reads one ``benchmarks/fidelity_vllm.py`` campaign (``--out`` folder: ``calibrated.json`` and
``sim_calibrated/<workload>/scenario.yaml``) and simulates every workload again with the
calibrated profile uniformly ``factor`` times slower (``simserve.live.calibrate.rescaled``: every
calibrated time and kernel scale times ``factor``), for a few factors around 1. A workload near
its capacity's edge turns a small change of speed into a large change of TPOT (it tips between
keeping up and queueing); set beside the real server's own campaign-to-campaign spread
(``benchmarks/fidelity_noise.py``), this says which errors a calibration that is a few per cent
off must produce.

    .venv/bin/python benchmarks/fidelity_sensitivity.py /tmp/fid11 [--factors 0.9 1 1.1]

No server: simulations only (seconds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

METRICS = (("median_ttft_ms", "TTFT p50"), ("median_tpot_ms", "TPOT p50"),
           ("median_e2el_ms", "E2EL p50"))


def sensitivity(campaign: Path, factors: list[float]) -> dict[str, dict[float, dict]]:
    """workload -> factor -> the simulated summary's metrics."""
    import simserve
    from simserve.latency.schema import dump, load_profile
    from simserve.live.calibrate import rescaled
    from simserve.config import load_scenario

    calibrated = load_profile(campaign / "calibrated.json")
    out: dict[str, dict[float, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for f in factors:
            paths[f] = Path(tmp) / f"x{f:g}.json"
            dump(rescaled(calibrated, f), paths[f])
        for scenario in sorted(campaign.glob("sim_calibrated/*/scenario.yaml")):
            sc = load_scenario(scenario)
            out[scenario.parent.name] = {
                f: simserve.run(sc.replace(latency=replace(sc.latency, path=str(paths[f])))
                                ).summary for f in factors}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaign", type=Path, help="an output folder of fidelity_vllm.py")
    ap.add_argument("--factors", type=float, nargs="+", default=[0.8, 0.9, 1.0, 1.1, 1.2],
                    help="slowdowns to simulate (1: as calibrated; 0.9: steps 10 %% faster)")
    args = ap.parse_args(argv)
    missing = [p for p in ("calibrated.json", "sim_calibrated")
               if not (args.campaign / p).exists()]
    if missing:
        print(f"fidelity_sensitivity: error: {args.campaign}: no {' or '.join(missing)} (the "
              "--out folder of benchmarks/fidelity_vllm.py)", file=sys.stderr)
        return 2
    factors = sorted(set(args.factors))
    if any(f <= 0 for f in factors):
        print("fidelity_sensitivity: error: --factors must be > 0", file=sys.stderr)
        return 2
    table = sensitivity(args.campaign, factors)
    print(f"{'workload':<20} {'metric':<9} " + " ".join(f"{'x' + format(f, 'g'):>9}"
                                                        for f in factors))
    for workload, by_factor in table.items():
        for key, label in METRICS:
            print(f"{workload:<20} {label:<9} " + " ".join(
                f"{by_factor[f][key]:>9.1f}" for f in factors))
    print("x f: the calibrated server f times slower (every calibrated time and kernel scale "
          "times f); values in ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
