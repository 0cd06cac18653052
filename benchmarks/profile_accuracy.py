"""Profile accuracy: does a step composed from a profile's parts match the measured whole step?

For a profile measured on this machine, draws held-out batches that are on no grid (random
prefill chunks with context, decode batches of random size and spread of context, and mixes of
both, within the profile's token budget), measures each one's whole step with the profiler's own
code (``profiler.layers.Model.step``: embedding, every layer with paged attention, final norm,
LM head, greedy sampling; same dtype, block size, attention backend and thread count as the
profile; warmed up, median of repeats, in rounds over all batches), predicts it with simserve's
``ProfileLatency``, and prints the absolute relative error per batch kind.

A shared machine's speed wanders by several per cent over minutes. To tell that apart from the
composition's own error, the profile's own held-out whole steps (timed while profiling) are
re-timed in the same rounds: the median ratio now/then is the machine's drift since profiling,
printed with a second table in which every prediction is scaled by it (a diagnostic, not a
prediction: the first table is the result).

    .venv/bin/python benchmarks/profile_accuracy.py        # the shipped tiny CPU profile
    .venv/bin/python benchmarks/profile_accuracy.py --profile p.json --n 300 --json out.json

Run it on a quiet machine (``uptime``: load average well under the core count); the load
average before and after is printed with the table. Needs torch (``pip install -e '.[profile]'``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHIPPED = ROOT / "simserve" / "data" / "profiles" / "tiny-llama-45m_cpu-epyc-2core_bf16_1t.json"
KINDS = ("prefill-only", "decode-only", "mixed")


@dataclass(frozen=True)
class Batch:
    kind: str
    prefill: tuple[tuple[int, int], ...]       # (chunk length, context before the chunk)
    decode_ctx: tuple[int, ...]
    num_sampled: int

    @property
    def num_tokens(self) -> int:
        return sum(q for q, _ in self.prefill) + len(self.decode_ctx)

    def describe(self) -> str:
        pre = " ".join(f"{q}@{c}" for q, c in self.prefill)
        dec = (f"{len(self.decode_ctx)} dec ctx {min(self.decode_ctx)}-{max(self.decode_ctx)}"
               if self.decode_ctx else "")
        return " + ".join(x for x in (pre, dec) if x)


# --------------------------------------------------------------------------------------------
# Held-out batches


def _decode_contexts(rng: random.Random, n: int, min_ctx: int, max_ctx: int) -> list[int]:
    """``n`` contexts around a random centre with a random spread: from nearly uniform batches
    to ones mixing short and long sequences (a real server's decode batch)."""
    centre = rng.uniform(min_ctx, max_ctx)
    spread = rng.choice([0.05, 0.3, 1.0]) * max_ctx
    return [min(max_ctx, max(min_ctx, round(rng.uniform(centre - spread, centre + spread))))
            for _ in range(n)]


def _chunks(rng: random.Random, budget: int, min_chunk: int, max_ctx: int,
            k: int) -> list[tuple[int, int]]:
    out = []
    left = budget
    for _ in range(k):
        if left < min_chunk:
            break
        q = rng.randint(min_chunk, max(min_chunk, min(left, budget * 3 // 4)))
        # a first chunk (no context) as often as a later chunk of a long prompt
        c = 0 if rng.random() < 0.3 else rng.randint(1, max_ctx - q)
        out.append((q, c))
        left -= q
    return out


def _on_grid(b: Batch, profile: dict) -> bool:
    tokens = set(profile["linear"]["tokens"])
    chunks = set(profile["attn_prefill"]["chunk"])
    pre_ctx = set(profile["attn_prefill"]["ctx"])
    batches = set(profile["attn_decode"]["batch"])
    dec_ctx = set(profile["attn_decode"]["ctx"])
    if b.num_tokens in tokens:
        return True
    if any(q in chunks and c in pre_ctx for q, c in b.prefill):
        return True
    return bool(b.decode_ctx) and len(b.decode_ctx) in batches and all(
        c in dec_ctx for c in b.decode_ctx)


def held_out_batches(profile: dict, n: int, seed: int, budget: int, max_decodes: int,
                     max_ctx: int) -> list[Batch]:
    """``n`` batches, a third of each kind, none on the profile's grids (a batch whose token
    count, chunk or decode shape falls on a grid point is drawn again), all inside the grids'
    ranges: the benchmark is about composing and interpolating, not extrapolating."""
    rng = random.Random(seed)
    min_chunk = max(2, profile["attn_prefill"]["chunk"][0])
    min_ctx = profile["attn_decode"]["ctx"][0]
    out: list[Batch] = []
    while len(out) < n:
        kind = KINDS[len(out) % 3]
        if kind == "prefill-only":
            prefill, decode = _chunks(rng, budget, min_chunk, max_ctx, rng.randint(1, 3)), []
        elif kind == "decode-only":
            prefill = []
            decode = _decode_contexts(rng, rng.randint(2, min(max_decodes, budget)), min_ctx,
                                      max_ctx)
        else:
            nd = rng.randint(1, min(max_decodes, budget // 2))
            decode = _decode_contexts(rng, nd, min_ctx, max_ctx)
            prefill = _chunks(rng, budget - nd, min_chunk, max_ctx, rng.randint(1, 2))
            if not prefill:
                continue
        # a chunk that completes its prompt samples a token; a middle chunk does not
        sampled = len(decode) + sum(rng.random() < 0.5 for _ in prefill)
        b = Batch(kind, tuple(prefill), tuple(decode), sampled)
        if b.num_tokens <= budget and not _on_grid(b, profile):
            out.append(b)
    return out


# --------------------------------------------------------------------------------------------
# Prediction (simserve, no torch) and measurement (profiler, torch)


def plan_of(b: Batch):
    from simserve.sched.plan import StepPlan
    n = len(b.prefill) + len(b.decode_ctx)
    return StepPlan(request_ids=tuple(range(n)),
                    num_new_tokens=tuple(q for q, _ in b.prefill) + (1,) * len(b.decode_ctx),
                    prefill_lens=tuple(q for q, _ in b.prefill),
                    prefill_ctx=tuple(c for _, c in b.prefill), decode_ctx=b.decode_ctx,
                    num_sampled=b.num_sampled)


def measure_steps(profile: dict, batches: list[Batch], warmup: int, repeats: int,
                  seed: int = 0, progress: bool = True) -> list[float]:
    """Median whole-step seconds of each batch, timed with the profiler's own step code.

    Measured in rounds, as the profiler measures its grids (``profiler.measure.Timer.rounds``):
    each round runs every batch once, in a fresh random order, so that each step follows some
    other step (as in a server) and a slow spell of a shared machine spreads over all batches
    instead of biasing the few measured during it. The first ``warmup`` rounds are not
    timed.
    """
    import torch

    from profiler import attention as attn
    from profiler.layers import DTYPES, Model, PagedKVCache, blocks_needed, build_step
    from profiler.layers import sample_greedy
    from profiler.measure import CLOCKS, WHOLE_STEP, Timer, sample_rows, steady_malloc
    from simserve.latency.schema import model_card

    prov, settings, shapes_d = profile["provenance"], profile["settings"], profile["model"]
    if prov["device"] != "cpu":
        raise SystemExit("profile_accuracy: this benchmark measures on the CPU; the profile "
                         f"was measured on {prov['device']}")
    torch.set_num_threads(prov["threads"])
    steady_malloc()                                # as the profiler measures (see there)
    dtype = DTYPES[prov["dtype"]]
    bs = settings["block_size"]
    max_pos = max(c + q for b in batches for q, c in b.prefill + tuple((1, c) for c in
                                                                       b.decode_ctx)) + 2
    shapes = model_card(shapes_d, max_position_embeddings=max_pos)
    backend = attn.make_backend(profile["attention"]["backend"], "cpu", shapes, dtype,
                                compile=profile["attention"]["compiled"])
    model = Model(shapes, dtype, "cpu", seed=seed, max_positions=max_pos)
    gen = torch.Generator().manual_seed(seed)
    nb = 8 + max(sum(blocks_needed(q + c, bs) for q, c in b.prefill)
                 + sum(blocks_needed(c + 1, bs) for c in b.decode_ctx) for b in batches)
    caches = [PagedKVCache(nb, bs, shapes.num_kv_heads, shapes.head_dim, dtype, "cpu",
                           fill="tile", generator=gen) for _ in model.layers]
    steps = []
    for b in batches:
        meta = build_step(list(b.prefill), list(b.decode_ctx), bs, nb, "cpu", generator=gen)
        ids = torch.randint(0, shapes.vocab_size, (meta.num_tokens,), generator=gen)
        # sampled rows: the last token of the chunks that finish a prompt, and every decode
        steps.append((meta, ids, sample_rows(meta, b.num_sampled, "cpu")))
    # the profile's own clock: thread CPU time for a one-thread profile, else wall time; the
    # profiler's own rounds (Timer.rounds), without a time budget
    timer = Timer(torch.device("cpu"), warmup, repeats, budget_s=math.inf,
                  clock=CLOCKS[settings["timer"]])
    start = time.perf_counter()

    def on_round(done: int, total: int) -> None:
        if progress:
            print(f"round {done}/{total}{' (warm-up)' if done <= warmup else ''}, "
                  f"{time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)

    def step(meta, ids, rows):
        return (lambda: backend.prepare(meta, nb),     # per-step metadata: outside the timing
                lambda sections: model.step(ids, meta, caches, backend, sample_greedy, rows,
                                            sections))

    # warm like the profile's own rounds when it was measured so (settings.order)
    warm = settings.get("order") == "warm_rounds"
    measured = timer.rounds([step(*x) for x in steps], seed=seed, on_round=on_round, warm=warm)
    return [parts[WHOLE_STEP].median for parts in measured]


# --------------------------------------------------------------------------------------------
# Report


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(rows: list[dict]) -> list[dict]:
    """Per kind and overall: count, median and p90 of |predicted - measured| / measured, and
    the median signed error (a bias shows as a signed median far from zero)."""
    out = []
    for kind in (*KINDS, "all"):
        sel = [r for r in rows if kind in ("all", r["kind"])]
        if not sel:
            continue
        errs = [abs(r["rel_err"]) for r in sel]
        out.append({"kind": kind, "count": len(sel), "median_abs_err": _quantile(errs, 0.5),
                    "p90_abs_err": _quantile(errs, 0.9),
                    "median_signed_err": _quantile([r["rel_err"] for r in sel], 0.5),
                    "median_measured_ms": 1e3 * _quantile([r["measured_s"] for r in sel], 0.5)})
    return out


def format_table(summary: list[dict]) -> str:
    lines = ["| batches | count | median abs err | p90 abs err | median signed err "
             "| median step |",
             "|---|---|---|---|---|---|"]
    for s in summary:
        lines.append(f"| {s['kind']} | {s['count']} | {100 * s['median_abs_err']:.1f} % "
                     f"| {100 * s['p90_abs_err']:.1f} % | {100 * s['median_signed_err']:+.1f} % "
                     f"| {s['median_measured_ms']:.1f} ms |")
    return "\n".join(lines)


def loadavg() -> float:
    return os.getloadavg()[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", type=Path, default=SHIPPED)
    ap.add_argument("--n", type=int, default=210, help="held-out batches (a third per kind)")
    ap.add_argument("--budget", type=int, default=None,
                    help="token budget of a batch (default: the profile's, at most 512 -- the "
                         "ground-truth vLLM server's max_num_batched_tokens)")
    ap.add_argument("--max-decodes", type=int, default=64)
    ap.add_argument("--max-ctx", type=int, default=2000,
                    help="largest context (the ground truth's max_model_len is 2048)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds over all batches")
    ap.add_argument("--repeats", type=int, default=7,
                    help="timed rounds; each batch's time is its median over them")
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--json", type=Path, help="write every batch's result here")
    ap.add_argument("--max-ref-s", type=float, default=1.0,
                    help="re-time the profile's own held-out steps up to this long, in the "
                         "same rounds, to measure how far the machine drifted since profiling")
    args = ap.parse_args(argv)

    from simserve.latency.schema import load_profile
    from simserve.latency.profile import ProfileLatency
    profile = dict(load_profile(args.profile))
    budget = args.budget or min(profile["settings"]["max_num_batched_tokens"], 512)
    max_ctx = min(args.max_ctx, max(profile["attn_decode"]["ctx"]) - 1,
                  max(profile["attn_prefill"]["ctx"]))
    max_decodes = min(args.max_decodes, max(profile["attn_decode"]["batch"]))
    batches = held_out_batches(profile, args.n, args.seed, budget, max_decodes, max_ctx)
    model = ProfileLatency(profile, source=str(args.profile))

    # the profile's own whole steps (timed while profiling) once more, in the same rounds:
    # their ratio now/then is how much faster or slower the machine runs than when profiled
    refs = [h for h in profile["heldout"] if h["seconds"] <= args.max_ref_s]
    ref_batches = [Batch("reference", tuple(tuple(x) for x in h["prefill"]),
                         tuple(h["decode_ctx"]), h["num_sampled"]) for h in refs]
    load_before = loadavg()
    measured = measure_steps(profile, batches + ref_batches, args.warmup, args.repeats)
    load_after = loadavg()
    measured, ref_now = measured[:len(batches)], measured[len(batches):]
    ratios = sorted(m / h["seconds"] for m, h in zip(ref_now, refs))
    drift = statistics.median(ratios) if ratios else None

    rows = []
    for b, m in zip(batches, measured):
        plan = plan_of(b)
        p = model.step_time(plan)
        rows.append({"kind": b.kind, "prefill": [list(x) for x in b.prefill],
                     "decode_ctx": list(b.decode_ctx), "num_sampled": b.num_sampled,
                     "measured_s": m, "predicted_s": p, "rel_err": (p - m) / m,
                     "parts_s": model.breakdown(plan)})
    summary = summarize(rows)
    prov = profile["provenance"]
    print(f"profile: {args.profile} ({prov['grid']} grid, measured {prov['date']} on "
          f"{prov['device_name']}, {prov['threads']} thread(s), {prov['dtype']}, "
          f"{profile['attention']['backend']} attention)")
    print(f"{len(batches)} held-out batches, budget {budget} tokens, up to {max_decodes} "
          f"decodes, context up to {max_ctx}; {args.warmup} warm-up + {args.repeats} timed rounds "
          f"(median); "
          f"load average {load_before:.2f} before, {load_after:.2f} after; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(format_table(summary))
    if drift is not None:
        adjusted = summarize([{**r, "rel_err": (r["predicted_s"] * drift - r["measured_s"])
                               / r["measured_s"]} for r in rows])
        print(f"\nmachine drift since profiling: the profile's {len(refs)} held-out steps of "
              f"up to {args.max_ref_s:g} s, re-timed in these rounds, took x{drift:.3f} their "
              f"profiled time (x{ratios[0]:.3f} to x{ratios[-1]:.3f}). With every prediction "
              f"scaled by that drift (the composition's error alone, not a prediction):")
        print(format_table(adjusted))
    if model.warnings():
        print("\n".join(model.warnings()))
    worst = sorted(rows, key=lambda r: -abs(r["rel_err"]))[:5]
    print("worst:", "; ".join(
        f"{Batch(r['kind'], tuple(map(tuple, r['prefill'])), tuple(r['decode_ctx']), 0).describe()}"
        f" {1e3 * r['measured_s']:.1f} ms measured, {100 * r['rel_err']:+.0f} %" for r in worst))
    if args.json:
        args.json.write_text(json.dumps({"profile": str(args.profile), "budget": budget,
                                         "load_before": load_before, "load_after": load_after,
                                         "summary": summary, "drift": drift,
                                         "drift_ratios": ratios, "batches": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
