"""Derive the roofline's achieved-efficiency curves (simserve/data/efficiency/*.json).

For each measured operation, ``η = roofline time at 100 % of the datasheet peak / measured
time``, with the roofline time computed by simserve's own RooflineModel at efficiency 1 (so the
curves and the model that applies them use one definition of FLOPs and bytes). Two sets:

``h100``  from the two H100 profiles simserve ships (``simserve/data/profiles/*_H100-SXM_*``,
          measured by ``python -m profiler``; FlexAttention, CUDA-graph replays), against the
          H100-SXM spec; η at each grid point is the mean over the two models.
``a100``  from Vidur's published A100 measurements (microsoft/vidur ``data/profiling``, MIT; a
          copy for reading only is in /work/shared/vidur-profiles and is never shipped): GEMMs
          and pointwise ops of Llama-2-7B on A100 at TP 1; attention from the A800 (A100-class)
          FlashInfer profile of the same model; against the A100-80GB spec. Vidur has no LM-head
          measurement: the set's LM head is its GEMM curve at M = rows (labelled so).

Measured times are first made non-decreasing in every size (``envelope``: a smaller
operation can always run padded to a larger one). Pointwise ops (norms, RoPE, residual adds,
KV write; the embedding spread over the layers) are
fitted as ``t = layer_s + tokens · bytes / (bandwidth · eta)`` per layer, least squares in
relative error: fixed launch-bound cost plus a bandwidth term, so that the fixed part does not
grow with the model's width when transferred.

Collectives: ``allreduce_latency_s`` is the median time of the smallest all-reduce (2 workers)
in Vidur's ``<gpu>_dgx`` network profile.

    .venv/bin/python benchmarks/derive_efficiency.py                 # writes both sets
    .venv/bin/python benchmarks/derive_efficiency.py --check         # exit 1 if a file differs
    .venv/bin/python benchmarks/derive_efficiency.py --only-profiles Llama-3.1-8B_H100-SXM_bf16

Without /work/shared/vidur-profiles (``--vidur DIR``) only the h100 set can be re-derived.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simserve.cards import ModelCard, load_hardware, load_model  # noqa: E402
from simserve.latency.efficiency import EFFICIENCY_DIR, Curve2D, _axis  # noqa: E402
from simserve.latency.roofline import RooflineModel  # noqa: E402

PROFILES = ROOT / "simserve" / "data" / "profiles"
H100_PROFILES = ("Llama-3.1-8B_H100-SXM_bf16", "Qwen2.5-7B_H100-SXM_bf16")
VIDUR = Path("/work/shared/vidur-profiles")


class Roof:
    """Per-layer roofline times at 100 % of peak, by op class (one TP rank, TP 1)."""

    def __init__(self, card: ModelCard, hw_name: str):
        self.m = RooflineModel(card, load_hardware(hw_name), flops_efficiency=1.0,
                               bandwidth_efficiency=1.0)
        self.L = card.num_layers

    def gemm(self, n: int) -> float:
        return sum(max(n * f, w + n * a) for f, w, a in self.m._linear)

    def pointwise_tok(self) -> float:
        m = self.m
        card = m.model
        q, kv = card.q_dim, card.kv_dim
        return (10 * card.hidden_size + 2 * (q + kv) + 4 * kv) * card.dtype_bytes \
            / m.hw.mem_bandwidth

    def prefill(self, q: int, c: int) -> float:
        m = self.m
        return max(q * (c + (q + 1) / 2) * m._attn_flop_s,
                   (c + q) * m._kv_tok_s + q * m._q_tok_s) / self.L

    def decode(self, b: int, c: int) -> float:
        m = self.m
        a = b * (c + 1)
        return max(a * m._attn_flop_s, a * m._kv_tok_s + b * m._q_tok_s) / self.L

    def lm_head(self, r: int) -> float:
        m = self.m
        return max(r * m._lm_flop_s, m._lm_weight_s + r * m._lm_row_s)


def envelope(times: list) -> list:
    """Measured times made non-decreasing in every size (suffix minimum along each axis):
    a smaller operation can always be run padded to a larger one, so a small shape measured
    slower than a larger one (a kernel-selection artifact, e.g. FlexAttention at chunk 64 in
    the Llama-3.1-8B profile: 3.6 ms against 27 µs at chunk 128) is priced as the larger."""
    if not isinstance(times[0], list):
        out = list(times)
        for k in range(len(out) - 2, -1, -1):
            out[k] = min(out[k], out[k + 1])
        return out
    rows = [envelope(r) for r in times]
    cols = [envelope([r[j] for r in rows]) for j in range(len(rows[0]))]
    return [[cols[j][i] for j in range(len(cols))] for i in range(len(rows))]


def _eta(roof: float, measured: float) -> float:
    # a measurement faster than the datasheet roofline (caches) counts as 100 %
    return round(min(1.0, roof / measured), 4)


def _fit_pointwise(ns: list[int], seconds: list[float], tok_s: float) -> tuple[float, float]:
    """Least squares of t = a + n·s weighted by 1/t (relative error); returns (a, eta)."""
    w = [1 / t for t in seconds]
    sw = sum(x * x for x in w)
    swn = sum(x * x * n for x, n in zip(w, ns))
    swnn = sum(x * x * n * n for x, n in zip(w, ns))
    swt = sum(x * x * t for x, t in zip(w, seconds))
    swnt = sum(x * x * n * t for x, n, t in zip(w, ns, seconds))
    det = sw * swnn - swn * swn
    a = (swt * swnn - swn * swnt) / det
    s = (sw * swnt - swn * swt) / det
    return round(max(a, 0.0), 9), round(min(1.0, tok_s / s), 4)


def _card_of_profile(profile: dict) -> ModelCard:
    m = profile["model"]
    return ModelCard(name=m["name"], num_layers=m["num_layers"], hidden_size=m["hidden_size"],
                     num_heads=m["num_heads"], num_kv_heads=m["num_kv_heads"],
                     head_dim=m["head_dim"], intermediate_size=m["intermediate_size"],
                     vocab_size=m["vocab_size"], max_position_embeddings=1 << 20,
                     dtype_bytes=m["dtype_bytes"], qkv_bias=m["qkv_bias"],
                     tie_word_embeddings=m["tie_word_embeddings"])


def _allreduce_latency(vidur: Path, node: str) -> float:
    rows = list(csv.DictReader(open(vidur / "network" / node / "all_reduce.csv")))
    two = [r for r in rows if int(r["num_workers"]) == 2]
    smallest = min(int(r["size"]) for r in two)
    return round(statistics.median(float(r["time_stats.all_reduce.median"]) for r in two
                                   if int(r["size"]) == smallest) / 1e3, 9)


def derive_h100(names: tuple[str, ...], vidur: Path | None) -> dict:
    per: list[dict] = []
    for name in names:
        prof = json.loads((PROFILES / f"{name}.json").read_text())
        roof = Roof(_card_of_profile(prof), "H100-SXM")
        L = prof["model"]["num_layers"]
        lin, ops, emb = prof["linear"], prof["linear"]["ops"], prof["embedding"]
        toks = lin["tokens"]
        # the ops are timed one by one and add up to more than the layer's own replay time
        # (``linear.seconds``); each is scaled by the layer's time over their sum
        share = [lin["seconds"][k] / sum(ops[o][k] for o in ops) for k in range(len(toks))]
        gemm_t = envelope([share[k] * (ops["qkv_proj"][k] + ops["o_proj"][k] + ops["mlp"][k])
                           for k in range(len(toks))])
        gemm = [_eta(roof.gemm(n), t) for n, t in zip(toks, gemm_t)]
        pw = [share[k] * sum(ops[o][k] for o in ("input_norm", "rope", "kv_write", "post_norm"))
              + emb["seconds"][k] / L for k in range(len(toks))]
        pre, dec, lm = prof["attn_prefill"], prof["attn_decode"], prof["lm_head"]
        per.append({
            "tokens": toks, "gemm": gemm,
            "pointwise": _fit_pointwise(toks, pw, roof.pointwise_tok()),
            "chunk": pre["chunk"], "pctx": pre["ctx"],
            "prefill": [[_eta(roof.prefill(q, c), t) for c, t in zip(pre["ctx"], row)]
                        for q, row in zip(pre["chunk"], envelope(pre["seconds"]))],
            "pairs": [b * prof["model"]["num_kv_heads"] for b in dec["batch"]],
            "dctx": dec["ctx"],
            "decode": [[_eta(roof.decode(b, c), t) for c, t in zip(dec["ctx"], row)]
                       for b, row in zip(dec["batch"], envelope(dec["seconds"]))],
            "rows": lm["seqs"],
            "lm": [_eta(roof.lm_head(r), t) for r, t in zip(lm["seqs"],
                                                            envelope(lm["seconds"]))],
        })
    first = per[0]
    for p in per[1:]:
        for axis in ("tokens", "chunk", "pctx", "dctx", "rows"):
            if p[axis] != first[axis]:
                raise SystemExit(f"derive_efficiency: profiles differ in their {axis} grid")

    # decode rows differ by model (batch × KV heads): each model's η resampled onto one axis
    pairs = sorted({x for p in per for x in p["pairs"]})
    for p in per:
        curve = Curve2D(_axis(p["pairs"], ctx=False), _axis(p["dctx"], ctx=True),
                        tuple(tuple(r) for r in p["decode"]))
        p["decode"] = [[curve(x, c) for c in p["dctx"]] for x in pairs]

    def mean(key):
        vals = [p[key] for p in per]
        if isinstance(vals[0][0], list):
            return [[round(statistics.fmean(v[i][j] for v in vals), 4)
                     for j in range(len(vals[0][0]))] for i in range(len(vals[0]))]
        return [round(statistics.fmean(v[i] for v in vals), 4) for i in range(len(vals[0]))]

    def best(key):
        # decode attention: the better kernel's η at each point. The two profiles' FlexAttention
        # decode kernels scale differently with batch (Llama-3.1-8B's time is flat up to 32
        # sequences; Qwen2.5-7B's, 7 query heads per KV head, grows from 4 and is up to 4x
        # slower per byte at 256); a device curve should not inherit one kernel's weak path.
        vals = [p[key] for p in per]
        return [[round(max(v[i][j] for v in vals), 4) for j in range(len(vals[0][0]))]
                for i in range(len(vals[0]))]

    layer_s = round(statistics.fmean(p["pointwise"][0] for p in per), 9)
    pw_eta = round(statistics.fmean(p["pointwise"][1] for p in per), 4)
    ar = _allreduce_latency(vidur, "h100_dgx") if vidur else None
    return {
        "name": "h100",
        "source": ("derived by benchmarks/derive_efficiency.py from simserve's measured "
                   f"profiles {', '.join(names)} (python -m profiler on an NVIDIA H100 80GB "
                   "HBM3, bf16, FlexAttention, CUDA-graph replays) against the H100-SXM "
                   "datasheet (989 TFLOP/s, 3.35 TB/s); eta = roofline at 100 % / measured, "
                   "mean over the models; allreduce_latency_s: median smallest 2-GPU "
                   "all-reduce of Vidur's h100_dgx network profile (microsoft/vidur, MIT). "
                   "An estimate when applied to other models or to H100-class devices."),
        "gemm": {"tokens": first["tokens"], "eta": mean("gemm")},
        "attn_prefill": {"chunk": first["chunk"], "ctx": first["pctx"], "eta": mean("prefill")},
        "attn_decode": {"pairs": pairs, "ctx": first["dctx"], "eta": best("decode")},
        "lm_head": {"rows": first["rows"], "eta": mean("lm")},
        "pointwise": {"layer_s": layer_s, "eta": pw_eta},
        "allreduce_latency_s": ar,
    }


def _read(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def _ms(row: dict, op: str) -> float:
    return float(row[f"time_stats.{op}.median"]) / 1e3


def derive_a100(vidur: Path) -> dict:
    card = load_model("Llama-2-7B")
    roof = Roof(card, "A100-80GB")
    L = card.num_layers
    mlp = [r for r in _read(vidur / "compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv")
           if int(r["num_tensor_parallel_workers"]) == 1]
    by_n = {int(r["num_tokens"]): r for r in mlp}
    toks = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if n in by_n]
    gemm_ops = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_act", "mlp_down_proj")
    pw_ops = ("input_layernorm", "attn_rope", "post_attention_layernorm", "add")
    gemm_t = envelope([sum(_ms(by_n[n], o) for o in gemm_ops) for n in toks])
    gemm = [_eta(roof.gemm(n), t) for n, t in zip(toks, gemm_t)]
    pw = [sum(_ms(by_n[n], o) for o in pw_ops) + _ms(by_n[n], "emb") / L for n in toks]
    layer_s, pw_eta = _fit_pointwise(toks, pw, roof.pointwise_tok())

    att = [r for r in _read(vidur / "compute/a800/meta-llama/Llama-2-7b-hf/attention.csv")
           if int(r["num_tensor_parallel_workers"]) == 1]
    pre = {(int(r["prefill_chunk_size"]), int(r["kv_cache_size"])): _ms(r, "attn_prefill")
           for r in att if r["is_prefill"] == "True"}
    dec = {(int(r["batch_size"]), int(r["kv_cache_size"])): _ms(r, "attn_decode")
           for r in att if r["is_prefill"] != "True"}

    def grid(points: dict, rows: list[int], cols: list[int], roof_fn) -> list[list[float]]:
        """η on rows × cols; a missing point takes its row's nearest measured context."""
        near = []
        for r in rows:
            have = sorted(c for (rr, c) in points if rr == r)
            near.append([min(have, key=lambda x: abs(x - c)) for c in cols])
        times = envelope([[points[(r, c)] for c in cs] for r, cs in zip(rows, near)])
        return [[_eta(roof_fn(r, c), t) for c, t in zip(cs, ts)]
                for r, cs, ts in zip(rows, near, times)]

    chunks = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    pctx = [0, 512, 1024, 2048, 3072]
    batches = [1, 2, 4, 8, 16, 32, 64, 128]
    dctx = [32, 64, 128, 256, 512, 1024, 2048, 4032]
    gemm_at = dict(zip(toks, gemm))
    rows = [r for r in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512) if r in gemm_at]
    return {
        "name": "a100",
        "source": ("derived by benchmarks/derive_efficiency.py from Vidur's published "
                   "measurements (microsoft/vidur data/profiling, MIT): Llama-2-7B on A100, "
                   "TP 1, GEMMs (QKV, O, gate+up, act, down) and pointwise ops (norms, RoPE, "
                   "add, embedding) by tokens; attention from the A800 FlashInfer profile of "
                   "Llama-2-7B (block 16; a missing grid point takes its row's nearest measured "
                   "context); against the A100-80GB datasheet (312 TFLOP/s, 2.039 TB/s); "
                   "lm_head: no measurement, the GEMM curve at M = rows; allreduce_latency_s: "
                   "median smallest 2-GPU all-reduce of Vidur's a100_dgx network profile. "
                   "An estimate when applied to other models or A100 variants."),
        "gemm": {"tokens": toks, "eta": gemm},
        "attn_prefill": {"chunk": chunks, "ctx": pctx,
                         "eta": grid(pre, chunks, pctx, roof.prefill)},
        "attn_decode": {"pairs": [b * card.num_kv_heads for b in batches], "ctx": dctx,
                        "eta": grid(dec, batches, dctx, roof.decode)},
        "lm_head": {"rows": rows, "eta": [gemm_at[r] for r in rows]},
        "pointwise": {"layer_s": layer_s, "eta": pw_eta},
        "allreduce_latency_s": _allreduce_latency(vidur, "a100_dgx"),
    }


def dump(curves: dict) -> str:
    return json.dumps(curves, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vidur", type=Path, default=VIDUR)
    ap.add_argument("--check", action="store_true", help="compare with the shipped files")
    ap.add_argument("--only-profiles", nargs="+", default=list(H100_PROFILES),
                    help="derive the h100 set from these profiles only (print, do not write)")
    args = ap.parse_args(argv)
    vidur = args.vidur if args.vidur.exists() else None
    names = tuple(args.only_profiles)
    h100 = derive_h100(names, vidur)
    if names != H100_PROFILES:
        print(dump(h100))
        return 0
    sets = {"h100": h100}
    if vidur is not None:
        sets["a100"] = derive_a100(vidur)
    else:
        print("derive_efficiency: no Vidur profiles; the a100 set is not re-derived",
              file=sys.stderr)
    if h100["allreduce_latency_s"] is None:
        shipped = json.loads((EFFICIENCY_DIR / "h100.json").read_text())
        h100["allreduce_latency_s"] = shipped["allreduce_latency_s"]
    bad = 0
    for name, curves in sets.items():
        path = EFFICIENCY_DIR / f"{name}.json"
        if args.check:
            same = path.exists() and path.read_text() == dump(curves)
            print(f"{path.relative_to(ROOT)}: {'same' if same else 'DIFFERS'}")
            bad += not same
        else:
            EFFICIENCY_DIR.mkdir(parents=True, exist_ok=True)
            path.write_text(dump(curves))
            print(f"wrote {path.relative_to(ROOT)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
