"""How far is the roofline from each shipped measured profile? Before (constant 60 % / 80 %
efficiencies) and after (efficiency curves), on steps no curve was fitted to.

Two comparisons per shipped GPU profile (simserve/data/profiles/*_H100-SXM_*):

1. **held-out whole steps**: the profile's ``heldout`` steps, each a whole forward step
   (mixed prefill chunks + decodes) measured as one CUDA-graph replay while profiling and used
   by no grid or curve. Truth = the measured seconds.
2. **off-grid batches vs the profile's composition**: 300 batches drawn by
   ``profile_accuracy.held_out_batches`` (a third prefill-only, decode-only, mixed; none on a
   grid point), priced by ``ProfileLatency`` (the measured parts, interpolated). This covers
   the small decode batches and short chunks the held-out steps lack.

Rows: ``constant`` (0.6 / 0.8, the old default), ``curves`` (the shipped ``h100`` set, derived
from both H100 profiles), ``curves, other model only`` (the set re-derived from the *other*
profile alone: leave-one-model-out, the honest transfer test) and, for reference,
``profile composition`` (1. only). Every roofline is priced without its per-step CPU overhead
(the measurements are GPU time of CUDA-graph replays). Error = predicted / measured − 1.

    .venv/bin/python benchmarks/roofline_accuracy.py [--n 300] [--seed 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from derive_efficiency import H100_PROFILES, PROFILES, _card_of_profile, derive_h100  # noqa: E402
from profile_accuracy import Batch, held_out_batches, plan_of  # noqa: E402

from simserve.cards import load_hardware  # noqa: E402
from simserve.latency.efficiency import load_curves, parse_curves  # noqa: E402
from simserve.latency.profile import ProfileLatency  # noqa: E402
from simserve.latency.roofline import RooflineModel  # noqa: E402


def models_for(name: str) -> dict:
    prof = json.loads((PROFILES / f"{name}.json").read_text())
    card, hw = _card_of_profile(prof), load_hardware("H100-SXM")
    other = tuple(p for p in H100_PROFILES if p != name)
    loo = parse_curves({**derive_h100(other, None), "allreduce_latency_s": 0.0}, "loo")
    return prof, {
        "constant (0.6/0.8, before)": RooflineModel(card, hw, step_overhead_s=0.0),
        "curves (h100 set, after)": RooflineModel(card, hw, step_overhead_s=0.0,
                                                  curves=load_curves("h100")),
        "curves, other model only": RooflineModel(card, hw, step_overhead_s=0.0, curves=loo),
        # the default since issue #29: fitted to vLLM's own runs, not to these profiles (its
        # CPU terms left out, as the profiles time the GPU's step alone)
        "h100-vllm (vLLM's kernels)": RooflineModel(card, hw, step_overhead_s=0.0,
                                                    curves=load_curves("h100-vllm")),
    }


def stats(errs: list[float]) -> dict:
    a = sorted(abs(e) for e in errs)
    return {"median_abs": statistics.median(a), "p90_abs": a[int(0.9 * (len(a) - 1))],
            "max_abs": a[-1], "median_signed": statistics.median(errs)}


def fmt(row: str, s: dict) -> str:
    return (f"  {row:34s} median |err| {100 * s['median_abs']:6.1f} %   p90 "
            f"{100 * s['p90_abs']:6.1f} %   max {100 * s['max_abs']:7.1f} %   median signed "
            f"{100 * s['median_signed']:+7.1f} %")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    out: dict = {}
    for name in H100_PROFILES:
        prof, models = models_for(name)
        composed = ProfileLatency(prof, source=name)
        steps = [Batch("mixed" if h["prefill"] else "decode-only",
                       tuple(tuple(x) for x in h["prefill"]), tuple(h["decode_ctx"]),
                       h["num_sampled"]) for h in prof["heldout"]]
        truth = [h["seconds"] for h in prof["heldout"]]
        print(f"{name}: {len(steps)} held-out whole steps (measured CUDA-graph replays)")
        res: dict = {}
        for label, m in {**models, "profile composition (reference)": composed}.items():
            errs = [m.step_time(plan_of(b)) / t - 1 for b, t in zip(steps, truth)]
            res[label] = stats(errs)
            print(fmt(label, res[label]))
        batches = held_out_batches(prof, args.n, args.seed, 4096, max_decodes=256,
                                   max_ctx=prof["attn_decode"]["ctx"][-1])
        print(f"  {len(batches)} off-grid batches vs the profile's composition, by kind:")
        res2: dict = {}
        for label, m in models.items():
            for kind in ("prefill-only", "decode-only", "mixed", "all"):
                sel = [b for b in batches if kind in ("all", b.kind)]
                errs = [m.step_time(plan_of(b)) / composed.step_time(plan_of(b)) - 1
                        for b in sel]
                res2[f"{label} | {kind}"] = stats(errs)
                print(fmt(f"{label[:22]} | {kind}", res2[f"{label} | {kind}"]))
        out[name] = {"heldout": res, "offgrid": res2}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
