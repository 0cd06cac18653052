"""Fit the step-time model of vLLM on H100 to measured serving runs (issue #29), and judge it by
leaving one model out.

The step time is a sum of physical terms, each priced on one tensor-parallel rank from the
model's shapes and the H100-SXM datasheet, with one coefficient per term shared by every model
and TP degree::

    step = a_gemm · gemm + a_dec · decode_attn + a_pre · prefill_attn + a_pw · pointwise
         + a_ar · allreduces + allreduce_bytes + c_layer · layers + c_moe · moe layers
         + c_dev                                       (the device part)
         + c_step + c_seq · sampled rows               (the CPU part)
    TTFT and E2E of a request += c_fe (the front end: ingest, tokenise, hop, detokenise, stream)

``gemm`` is every linear layer and the LM head as the shipped ``h100`` efficiency curves price
them (our profiler's cuBLAS GEMMs, the same library vLLM calls); ``decode_attn``,
``prefill_attn`` and ``pointwise`` (norms, RoPE, residual adds, KV write) are their rooflines at
100 % of peak, so ``1 / a`` is the fraction of peak vLLM's kernels reach; ``allreduces`` is the
number of TP all-reduces of a step (2 a layer) and ``allreduce_bytes`` their bytes at NVLink
rate; ``layers`` and ``moe`` are the step's layers and MoE layers (fixed seconds each: launches,
an MoE layer's routing, permutation and the grouped GEMMs' own costs); ``c_dev`` is a step's
fixed device time (the CUDA graph's launch, input copies, sampling). The runs are simulated as
vLLM ran them, with async scheduling (vLLM's default: vllm/config/vllm.py turns it on unless
something is incompatible): the CPU part of a step runs while the device computes the step
before, so it is hidden whenever the device part is longer, and an arrival waits for the step
already scheduled ahead of it.

What the runs cannot tell apart is held by a prior from outside the corpus: the all-reduce's
fixed cost at NCCL's measured small-message latency on an H100 DGX (Vidur's published
``h100_dgx`` network profile), decode attention at 80 % ± 20 % of bandwidth, the CPU part of a
step at PRIORS["step"] (hidden in every run but the first step after an idle engine).

The fit is iterated: simulate every run with the current coefficients, record each step's
terms and each request's window of steps, solve a non-negative least squares on the
relative errors of the per-stage TTFT, E2E and ITL means (linear in the coefficients for a
fixed schedule), and simulate again until the coefficients settle.

    python benchmarks/truth/fit_h100_vllm.py [--truth DIR] [--lomo] [--write]

``--write`` writes ``simserve/data/efficiency/h100-vllm.json`` (the efficiency set and the
engine's CPU terms the roofline uses by default on H100-SXM) with its provenance.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import h100_vllm as truth  # noqa: E402

TERMS = ("gemm", "decode_attn", "prefill_attn", "pointwise", "allreduces", "layers", "moe",
         "dstep", "step", "seq")
FIXED = ("allreduce_bytes",)   # coefficient 1
# Held at their physical values (the data cannot tell them apart from the other terms): the
# GEMMs as our profiler measured cuBLAS's, FlashAttention-class prefill at half of peak FLOP/s
# (chunks of cached prompts are short here: it hardly shows), pointwise ops fused into their
# neighbours at full bandwidth; no per-layer or per-sampled-row cost (each trades against the
# step's fixed cost model by model, which a left-out model cannot check)
FIXED_AT = {"gemm": 1.0, "prefill_attn": 2.0, "pointwise": 1.0, "layers": 0.0, "seq": 0.0}
# Priors from outside the corpus, (value, scale) as pseudo-rows ((a - value) / scale):
# - decode attention's bandwidth efficiency, 80 % of peak give or take 20 % (only one model of
#   the corpus, Llama-2-7B without GQA, reads enough KV for the data to see it);
# - the all-reduce's fixed cost: NCCL's small-message all-reduce on an H100 DGX as Vidur
#   measured it (microsoft/vidur data/profiling/network/h100_dgx/all_reduce.csv, MIT): median
#   41 us over messages of 64 KiB-4 MiB on 2 and 4 GPUs, quartiles 35-43 us. Without it the
#   one TP-2 model (an MoE) cannot tell its all-reduces from its MoE layers, and the TP-4 model
#   left out is priced 35-50 % slow;
# - the CPU part of a step (scheduler, input preparation, output processing): hidden by async
#   scheduling in all but the first step after an idle engine
CPU_STEP_PRIOR = (1.0e-3, 0.5e-3)
PRIORS = {"decode_attn": (1.25, 0.25), "allreduces": (41e-6, 5e-6), "step": CPU_STEP_PRIOR}
START = {**FIXED_AT, "decode_attn": 1.25, "allreduces": 41e-6, "moe": 0.0, "dstep": 1.8e-3,
         "step": CPU_STEP_PRIOR[0], "frontend": 0.01}
# a simulated stage whose mean TTFT is this many times the measured one is in an overload the
# schedule of that round cannot linearise: left out of that round's solve (said so)
OVERLOAD = 5.0
OUT = ROOT / "simserve" / "data" / "efficiency" / "h100-vllm.json"
CPU = (TERMS.index("step"), TERMS.index("seq"))   # the terms of the CPU part


class FeatureModel:
    """A latency model that prices each step as ``coef · terms(plan)`` and records the terms."""

    frontend_delay_s = 0.0

    def __init__(self, scenario, coef: dict[str, float]):
        from simserve.latency.efficiency import load_curves
        from simserve.latency.roofline import RooflineModel
        from simserve.engine.build import _moe_options
        s = scenario
        kw = dict(tensor_parallel_size=s.engine.tensor_parallel_size,
                  block_size=s.engine.block_size, **_moe_options(s))
        curves = load_curves("h100")
        self.curved = RooflineModel(s.model, s.hardware, curves=curves, step_overhead_s=0.0, **kw)
        self.peak = RooflineModel(s.model, s.hardware, flops_efficiency=1.0,
                                  bandwidth_efficiency=1.0, step_overhead_s=0.0,
                                  allreduce_latency_s=0.0, **kw)
        self.tp = s.engine.tensor_parallel_size
        self.layers = s.model.num_layers
        self.moe_layers = s.model.moe_layers
        self.pw_fixed = self.curved._pw_fixed_s
        self.pw_eta = curves.pointwise_eta
        self.coef = np.array([coef[t] for t in TERMS])
        self.rows: list[tuple[float, ...]] = []
        self.label = "fit features"

    def terms(self, plan) -> tuple[float, ...]:
        c = self.curved.breakdown(plan)
        p = self.peak.breakdown(plan)
        n = plan.num_batched_tokens
        pw = (c["pointwise"] - self.pw_fixed) * self.pw_eta if n else 0.0
        ars = 2.0 * self.layers if (self.tp > 1 and n) else 0.0
        return (c["linear"] + c["lm_head"], p["attention_decode"], p["attention_prefill"], pw,
                ars, float(self.layers), float(self.moe_layers), 1.0, 1.0,
                float(plan.num_sampled), p["allreduce"])

    def step_time(self, plan) -> float:
        if plan.is_empty:
            return 0.0
        f = self.terms(plan)
        self.rows.append(f)
        return float(np.dot(self.coef, f[:len(TERMS)]) + f[len(TERMS)])

    def cpu_s(self, plan) -> float:
        """The CPU part (what async scheduling overlaps): the step and per-row terms."""
        if plan.is_empty:
            return 0.0
        return float(self.coef[CPU[0]] + self.coef[CPU[1]] * plan.num_sampled)

    def warnings(self) -> list[str]:
        return []


def windows(exp: dict, coef: dict[str, float], overrides: list[str] = ()) -> dict:
    """Simulate one run with ``coef``; return each finished request's summed terms over its
    TTFT window and its decode window, its arrival, and the run's simulated per-stage means."""
    from simserve.config import parse_scenario
    from simserve.runner import run
    from simserve.config import apply_overrides
    s = parse_scenario(apply_overrides(truth.scenario_dict(exp), list(overrides)), base_dir=HERE)
    model = FeatureModel(s, coef)
    res = run(s, latency=model, fast_forward=False, keep_steps=True)
    steps = res.steps
    F = np.array(model.rows)
    if len(F) != len(steps):
        raise RuntimeError(f"{exp['id']}: {len(F)} priced steps for {len(steps)} steps")
    start = steps["start_s"].to_numpy()
    end = start + steps["duration_s"].to_numpy()
    if s.engine.async_scheduling:
        # a step whose device part starts as soon as the step before ends lasts its device
        # part alone: its CPU part overlapped (engine/loops.py AsyncTiming); the others are
        # taken to last both parts (linearised; the next round's simulation corrects it)
        full = F[:, :len(TERMS)] @ model.coef + F[:, len(TERMS)]
        cpu = model.coef[CPU[0]] + model.coef[CPU[1]] * F[:, CPU[1]]
        overlapped = np.abs((end - start) - (full - cpu)) <= 1e-9 + 1e-9 * full
        F = F.copy()
        F[overlapped, CPU[0]] = 0.0
        F[overlapped, CPU[1]] = 0.0
    C = np.vstack([np.zeros(F.shape[1]), np.cumsum(F, axis=0)])   # C[j] = sum of rows < j
    req = res.requests
    ok = (req["status"] == "finished").to_numpy()
    arr = req["arrival_s"].to_numpy()[ok]
    first = req["first_token_s"].to_numpy()[ok]
    fin = req["finish_s"].to_numpy()[ok]
    j0 = np.searchsorted(end, arr, side="right")             # first step ending after arrival
    j1 = np.searchsorted(end, first - 1e-9)                  # the step giving the first token
    j2 = np.searchsorted(end, fin - 1e-9)                    # the step giving the last
    dur = end - start
    frac0 = np.clip((end[j0] - np.maximum(arr, start[j0])) / np.maximum(dur[j0], 1e-12), 0, 1)
    ttft = frac0[:, None] * F[j0] + C[j1 + 1] - C[j0 + 1]
    dec = C[j2 + 1] - C[j1 + 1]
    return {"id": exp["id"], "arrival": arr, "ttft": ttft, "dec": dec,
            "check": float(np.max(np.abs(ttft @ np.r_[model.coef, 1.0] - (first - arr))))}


OVERRIDES: list[str] = []   # scenario overrides of every simulated run (--set)


def simulate_all(exps: list[dict], coef: dict[str, float], workers: int) -> dict[str, dict]:
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return {w["id"]: w for w in pool.map(windows, exps, [coef] * len(exps),
                                             [OVERRIDES] * len(exps))}


def design(exps: list[dict], wins: dict[str, dict], measured: dict,
           coef: dict[str, float] | None = None):
    """Rows of the least squares: (features incl. the front-end column, fixed part, measured,
    label) for each scored per-stage mean."""
    A, b, meas, labels = [], [], [], []
    nt = len(TERMS)
    for exp in exps:
        w, i = wins[exp["id"]], exp["id"]
        bounds = [(-1, (0.0, np.inf)), *enumerate(truth.stage_bounds(exp))]
        scored = truth.rows_of(measured, i)
        for k, (lo, hi) in bounds:
            if k not in scored:
                continue
            m = (w["arrival"] >= lo) & (w["arrival"] < hi)
            t, d = w["ttft"][m].mean(axis=0), w["dec"][m].mean(axis=0)
            mt = measured.get((i, k, "ttft_mean"))
            if coef is not None and mt is not None:
                x = np.r_[[coef[n] for n in TERMS], 1.0]
                if (t @ x + coef["frontend"]) * 1e3 > OVERLOAD * mt:
                    print(f"    ({i} stage {k} overloaded this round: left out)")
                    continue
            me = measured.get((i, k, "e2e_mean"))
            mi = measured.get((i, k, "itl_mean"))
            if mt is not None:
                A.append(np.r_[t[:nt], 1.0]), b.append(t[nt]), meas.append(mt / 1e3)
                labels.append((i, k, "ttft_mean"))
            if mi and me is not None and mt is not None:     # decode time, the client's count
                A.append(np.r_[d[:nt], 0.0]), b.append(d[nt]), meas.append((me - mt) / 1e3)
                labels.append((i, k, "itl_mean"))
            elif me is not None:
                A.append(np.r_[t[:nt] + d[:nt], 1.0]), b.append(t[nt] + d[nt])
                meas.append(me / 1e3), labels.append((i, k, "e2e_mean"))
    return np.array(A), np.array(b), np.array(meas), labels


def nnls(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares, exactly, for a few unknowns: the best unconstrained fit on
    every subset of the columns whose solution is all >= 0 (2^n small solves)."""
    import itertools
    n = A.shape[1]
    best, best_x = np.inf, np.zeros(n)
    for r in range(1, n + 1):
        for cols in itertools.combinations(range(n), r):
            z = np.linalg.lstsq(A[:, cols], y, rcond=None)[0]
            if (z < 0).any():
                continue
            x = np.zeros(n)
            x[list(cols)] = z
            res = float(np.sum((A @ x - y) ** 2))
            if res < best:
                best, best_x = res, x
    return best_x


def solve(A, b, meas) -> np.ndarray:
    """Coefficients minimising the squared relative errors, all >= 0, with FIXED_AT held and
    PRIORS added as pseudo-rows ((a - prior) / scale)."""
    names = [*TERMS, "frontend"]
    fixed = np.array([FIXED_AT.get(n, 0.0) for n in names])
    free = [i for i, n in enumerate(names) if n not in FIXED_AT]
    W = 1.0 / meas
    Aw, yw = A[:, free] * W[:, None], (meas - b - A @ fixed) * W
    for name, (prior, scale) in PRIORS.items():
        row = np.zeros(len(free))
        row[[names[i] for i in free].index(name)] = 1.0 / scale
        Aw, yw = np.vstack([Aw, row]), np.r_[yw, prior / scale]
    x = fixed.copy()
    x[free] = nnls(Aw, yw)
    return x


def as_dict(x: np.ndarray) -> dict[str, float]:
    return {**dict(zip(TERMS, map(float, x[:len(TERMS)]))), "frontend": float(x[len(TERMS)])}


def fit(exps: list[dict], measured: dict, workers: int, coef: dict[str, float],
        rounds: int, log, wins: dict | None = None) -> tuple[dict[str, float], dict]:
    """Simulate, solve, repeat (``rounds`` times at most; ``wins``: solve on these first)."""
    for r in range(rounds):
        if wins is None or r > 0:
            wins = simulate_all(exps, coef, workers)
        A, b, meas, _ = design(exps, wins, measured, coef)
        x = solve(A, b, meas)
        new = as_dict(x)
        change = max(abs(new[k] - coef[k]) / max(abs(coef[k]), 1e-9) for k in new)
        coef = new
        log(f"  round {r + 1}: " + ", ".join(f"{k} {v:.4g}" for k, v in coef.items())
            + f" (largest change {change:.1%})")
        if change < 0.01:
            break
    return coef, wins


def predict(exps, wins, coef) -> dict[str, dict]:
    """Per-stage metrics (ms) of each run from its recorded windows and ``coef``."""
    x = np.r_[[coef[t] for t in TERMS], 1.0]
    out = {}
    for exp in exps:
        w = wins[exp["id"]]
        ttft = (w["ttft"] @ x + coef["frontend"]) * 1e3
        e2e = ttft + (w["dec"] @ x) * 1e3
        out[exp["id"]] = truth.stage_metrics(w["arrival"], ttft, e2e, truth.stage_bounds(exp))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truth", type=Path, default=truth.DEFAULT_TRUTH)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--lomo", action="store_true", help="also fit without each model")
    ap.add_argument("--write", action="store_true", help=f"write {OUT.relative_to(ROOT)}")
    ap.add_argument("--save", type=Path, default=HERE / "results" / "h100_vllm_fit.json",
                    help="where the fitted coefficients and errors go")
    ap.add_argument("--write-from", type=Path,
                    help="write the efficiency set from a saved fit (--save) without fitting")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="a scenario override of every run (e.g. engine.async_scheduling=true)")
    args = ap.parse_args(argv)
    OVERRIDES[:] = args.overrides
    exps, measured, peers = truth.load_truth(args.truth)
    if args.write_from:
        saved = json.loads(args.write_from.read_text())
        if "made" not in saved:
            sys.exit(f"{args.write_from}: no 'made' (date, tree, command): a fit saved before "
                     "fits recorded their provenance; fit again")
        write(saved["in_sample"], saved.get("expected_error"), exps, saved["made"])
        return 0
    t0 = time.time()
    print("in-sample fit on every run:")
    coef, wins = fit(exps, measured, args.workers, dict(START), args.rounds, print)
    sims = predict(exps, wins, coef)
    for exp in exps:
        truth.with_itl(sims[exp["id"]], exp["id"], measured)
    ours, theirs = truth.error_table(exps, measured, peers, sims)
    print("\n".join(truth.summary_lines(ours, theirs)))
    print("\n".join(truth.stage_split_lines(ours, measured)))
    result = {"in_sample": coef, "made": provenance(sys.argv[1:] if argv is None else argv)}
    if args.lomo:
        held: dict = {}
        lomo_coef = {}
        for card in sorted({truth.model_name(e) for e in exps}):
            train = [e for e in exps if truth.model_name(e) != card]
            test = [e for e in exps if truth.model_name(e) == card]
            print(f"without {card}:")
            c, _ = fit(train, measured, args.workers, dict(coef), 2, print,
                       wins={e["id"]: wins[e["id"]] for e in train})
            lomo_coef[card] = c
            w = simulate_all(test, c, args.workers)
            s = predict(test, w, c)
            for exp in test:
                truth.with_itl(s[exp["id"]], exp["id"], measured)
            held.update(s)
        ours_l, _ = truth.error_table(exps, measured, peers, held)
        print("leave-one-model-out (each model predicted by a fit without it):")
        print("\n".join(truth.summary_lines(ours_l, theirs)))
        print("\n".join(truth.stage_split_lines(ours_l, measured)))
        result["lomo"] = lomo_coef
        result["lomo_errors"] = {f"{a}/{b}/{c}": v for (a, b, c), v in ours_l.items()}
        result["expected_error"] = {
            m: round(float(np.median(np.abs([v for k, v in ours_l.items() if k[2] == m]))), 1)
            for m in truth.METRICS}
    print(f"{time.time() - t0:.0f} s")
    args.save.parent.mkdir(parents=True, exist_ok=True)
    args.save.write_text(json.dumps(result, indent=1) + "\n")
    if args.write:
        write(coef, result.get("expected_error"), exps, result["made"])
    return 0


def corpus_of(exps: list[dict]) -> dict:
    """What the measured runs cover (latency/trust.py says when a scenario leaves it)."""
    from simserve.cards import load_model
    cards = sorted({truth.model_name(e) for e in exps})
    params = [load_model(c).num_params / 1e9 for c in cards]
    sp = [e["workload"]["inference_perf"]["shared_prefix"] for e in exps]
    moe = [c for c in cards if load_model(c).is_moe]
    return {"hardware": "H100-SXM", "engine": "vLLM V1", "models": cards, "moe_models": moe,
            "params_b": [round(min(params), 2), round(max(params), 2)],
            "max_tp": max(e["tp"] for e in exps),
            "max_context": max(s["system_prompt_len"] + s["question_len"] + s["output_len"]
                               for s in sp),
            "runs": len(exps)}


def provenance(argv: list[str]) -> dict[str, str]:
    """When, from which tree and with which command a fit was made (saved with it: a set
    written later from the saved fit names the fit's, not the writing's)."""
    tree = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                          capture_output=True, text=True).stdout.strip() or "unknown"
    return {"date": datetime.date.today().isoformat(), "tree": tree,
            "command": " ".join(["benchmarks/truth/fit_h100_vllm.py", *argv])}


def write(coef: dict[str, float], expected: dict | None, exps: list[dict],
          made: dict[str, str]) -> None:
    """The fitted coefficients as an efficiency set plus engine terms, with provenance
    (``made``: the fit's date, tree and command)."""
    from simserve.latency.efficiency import EFFICIENCY_DIR
    base = json.loads((EFFICIENCY_DIR / "h100.json").read_text())
    g = coef["gemm"]
    out = {
        "name": "h100-vllm",
        "source": (
            f"ESTIMATE fitted on {made['date']} by `{made['command']}` (simserve "
            f"{made['tree']}) to twelve serving runs "
            "of vLLM V1 on H100-SXM measured with inference-perf by the BLIS authors "
            "(inference-sim/inference-sim f90a1e3a training data; "
            "inference-sim/sim-to-real-accuracy-validation dcec3fd4 error_records.csv): "
            "Llama-2-7B, Qwen2.5-7B, Llama-3.1-70B TP4, Llama-4-Scout FP8 TP2. GEMM and LM-head "
            "curves: the h100 set's (our profiler's cuBLAS GEMMs) divided by a_gemm = "
            f"{g:.4g}; decode attention, prefill attention and pointwise ops at one efficiency "
            "each (1 / a); the all-reduce's fixed cost (prior: Vidur's measured H100 DGX NCCL "
            "all-reduce), an MoE layer's and a step's fixed device time, the engine's CPU "
            "step (prior) and the front end fitted, the runs simulated with async "
            "scheduling on (vLLM's default) and Poisson arrivals."),
        "gemm": {"tokens": base["gemm"]["tokens"],
                 "eta": [min(1.0, e / g) for e in base["gemm"]["eta"]]},
        "attn_prefill": {"chunk": [1], "ctx": [0], "eta": [[min(1.0, 1 / coef["prefill_attn"])]]},
        "attn_decode": {"pairs": [1], "ctx": [0], "eta": [[min(1.0, 1 / coef["decode_attn"])]]},
        "lm_head": {"rows": base["lm_head"]["rows"],
                    "eta": [min(1.0, e / g) for e in base["lm_head"]["eta"]]},
        "pointwise": {"layer_s": coef["layers"], "eta": 1 / coef["pointwise"],
                      "moe_layer_s": coef["moe"], "step_s": coef["dstep"]},
        "allreduce_latency_s": coef["allreduces"],
        "engine": {"step_overhead_s": coef["step"], "per_output_token_s": coef["seq"],
                   "frontend_delay_s": coef["frontend"]},
        "fit": {k: coef[k] for k in coef},
    }
    if expected:
        # median absolute % error of each metric over the corpus's per-stage rows, each model
        # predicted by a fit without it: how far to trust a number (the summary carries it)
        out["expected_error_pct"] = expected
    out["corpus"] = corpus_of(exps)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.exit(main())
