"""Achieved-efficiency curves for the roofline: what fraction of its roofline each kind of
operation reaches on real GPUs, by size. Data files: ``simserve/data/efficiency/*.json``,
written by ``benchmarks/derive_efficiency.py`` from measured profiles (never edited by hand).

A curve maps an operation's size to ``η = roofline time at 100 % of peak / measured time``
(in (0, 1]; the roofline time at 100 % is ``max(FLOPs / peak FLOP/s, bytes / peak bandwidth)``
as :class:`~simserve.latency.roofline.RooflineModel` computes it). The roofline then prices an
operation at ``roofline time at 100 % / η(size)``. Op classes and their size axes:

================  ====================================  ========================================
class             size                                   what it captures
================  ====================================  ========================================
``gemm``          tokens in the step                     small-M GEMMs below HBM rate; the
                                                         compute plateau (~70 % of dense peak)
``attn_prefill``  (chunk tokens, tokens cached before)   short chunks on small tiles; the KV of
                                                         earlier chunks re-read by later ones
``attn_decode``   (sequences × KV heads on the rank,     short contexts and small batches far
                  mean context)                          below HBM rate; kernels parallelise
                                                         over (sequence, KV head) pairs
``lm_head``       rows sampled                           the vocabulary GEMM + sampling
``pointwise``     fixed seconds per layer + bytes        norms, RoPE, residual adds, KV write:
                                                         launch-bound when small
================  ====================================  ========================================

Lookups interpolate piecewise-linearly in log2 of each axis (``log2(1 + ctx)`` for contexts,
which may be 0) and clamp at the grid's edges: an efficiency is bounded, so holding the edge
value is the honest extrapolation. These are estimates transferred from the models and devices
they were measured on (each file's ``source``); the result is labelled so.
"""

from __future__ import annotations

import functools
import json
import math
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simserve.errors import ConfigError, DataError

EFFICIENCY_DIR = Path(__file__).resolve().parent.parent / "data" / "efficiency"
CLASSES = ("gemm", "attn_prefill", "attn_decode", "lm_head", "pointwise")
# an engine's CPU terms a set may carry (fitted with it to whole serving runs)
ENGINE_TERMS = ("step_overhead_s", "per_output_token_s", "frontend_delay_s")


def _axis(values: list[float], *, ctx: bool) -> tuple[float, ...]:
    return tuple(math.log2(1.0 + v) if ctx else math.log2(v) for v in values)


def _locate(axis: tuple[float, ...], x: float) -> tuple[int, float]:
    """Segment index and weight of ``x`` on ``axis``, clamped to the axis's ends."""
    if len(axis) == 1 or x <= axis[0]:
        return 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 2, 1.0
    i = bisect_right(axis, x) - 1
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


@dataclass(frozen=True)
class Curve1D:
    """η by one size (tokens or rows), log2-linear between points, clamped at the ends."""

    xs: tuple[float, ...]     # log2 of the size
    eta: tuple[float, ...]

    def __call__(self, size: float) -> float:
        return self.at_log2(math.log2(max(size, 1.0)))

    def at_log2(self, x: float) -> float:
        """η at a point already on the axis's log2 scale."""
        if len(self.xs) == 1:
            return self.eta[0]
        i, w = _locate(self.xs, x)
        return self.eta[i] + w * (self.eta[i + 1] - self.eta[i])


@dataclass(frozen=True)
class Curve2D:
    """η by (size, context): bilinear in (log2 size, log2(1 + context)), clamped."""

    rows: tuple[float, ...]   # log2 of the size (chunk tokens or decode batch)
    cols: tuple[float, ...]   # log2(1 + context)
    eta: tuple[tuple[float, ...], ...]

    def __call__(self, size: float, ctx: float) -> float:
        i, wr = _locate(self.rows, math.log2(max(size, 1.0)))
        j, wc = _locate(self.cols, math.log2(1.0 + max(ctx, 0.0)))
        v = self.eta
        i1 = min(i + 1, len(self.rows) - 1)
        j1 = min(j + 1, len(self.cols) - 1)
        top = v[i][j] + wc * (v[i][j1] - v[i][j])
        bottom = v[i1][j] + wc * (v[i1][j1] - v[i1][j])
        return top + wr * (bottom - top)


    def row(self, size: float) -> Curve1D:
        """η by context at one ``size``: the grid's rows interpolated once (what a decode
        stretch, one batch size at a growing context, looks up step after step). Its x axis
        is ``log2(1 + ctx)``: call ``row(size).at_log2(log2(1 + ctx))``."""
        i, wr = _locate(self.rows, math.log2(max(size, 1.0)))
        i1 = min(i + 1, len(self.rows) - 1)
        v = self.eta
        return Curve1D(self.cols, tuple(a + wr * (b - a) for a, b in zip(v[i], v[i1])))


@dataclass(frozen=True)
class EfficiencyCurves:
    """One curve set (one device family), as read from its data file."""

    name: str
    source: str
    gemm: Curve1D
    attn_prefill: Curve2D
    attn_decode: Curve2D
    lm_head: Curve1D
    pointwise_layer_s: float      # fixed seconds per layer of the pointwise ops
    pointwise_eta: float          # their bandwidth efficiency on top of that
    allreduce_latency_s: float    # fixed cost of one small all-reduce (TP)
    # fixed seconds per MoE layer of a step beyond its GEMMs (routing, token permutation,
    # dispatch and combine, the grouped GEMMs' launches); 0 where not fitted
    moe_layer_s: float = 0.0
    # fixed device seconds per step beyond its layers' work (the CUDA graph's launch, input
    # copies, sampling kernels): not CPU time, so async scheduling does not hide it; 0 where
    # not fitted
    device_step_s: float = 0.0
    # the engine's CPU terms fitted with the set (absent: the roofline's own defaults); a
    # scenario's latency.step_overhead_ms / per_output_token_ms / frontend_delay_ms win
    step_overhead_s: float | None = None
    per_output_token_s: float | None = None
    frontend_delay_s: float | None = None
    # a set fitted to whole serving runs: each headline metric's expected error (median
    # absolute %, each model predicted by a fit without it) and what the runs covered
    # (latency/trust.py)
    expected_error_pct: dict[str, float] = field(default_factory=dict, hash=False)
    corpus: dict[str, Any] = field(default_factory=dict, hash=False)


def _eta_list(values: Any, where: str) -> tuple[float, ...]:
    if not isinstance(values, list) or not values:
        raise DataError(where, "expected a non-empty list of efficiencies")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise DataError(where, f"efficiency {v!r} is not in (0, 1]")
        out.append(float(v))
    return tuple(out)


def _sizes(values: Any, where: str, *, ctx: bool) -> tuple[float, ...]:
    if (not isinstance(values, list) or not values
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values)
            or any(v < (0 if ctx else 1) for v in values) or sorted(set(values)) != values):
        raise DataError(where, "expected an increasing list of sizes")
    return _axis(values, ctx=ctx)


def parse_curves(raw: Any, where: str) -> EfficiencyCurves:
    """Validate one curve set (a parsed data file); every problem is a DataError on ``where``."""
    if not isinstance(raw, dict):
        raise DataError(where, "expected an object")
    try:
        g, pf, dc, lm, pw = (raw[k] for k in CLASSES)
        gemm = Curve1D(_sizes(g["tokens"], f"{where}: gemm.tokens", ctx=False),
                       _eta_list(g["eta"], f"{where}: gemm.eta"))
        lm_head = Curve1D(_sizes(lm["rows"], f"{where}: lm_head.rows", ctx=False),
                          _eta_list(lm["eta"], f"{where}: lm_head.eta"))
        grids = []
        for key, name, d in (("chunk", "attn_prefill", pf), ("pairs", "attn_decode", dc)):
            rows = _sizes(d[key], f"{where}: {name}.{key}", ctx=False)
            cols = _sizes(d["ctx"], f"{where}: {name}.ctx", ctx=True)
            eta = tuple(_eta_list(r, f"{where}: {name}.eta") for r in d["eta"])
            if len(eta) != len(rows) or any(len(r) != len(cols) for r in eta):
                raise DataError(where, f"{name}.eta must be {len(rows)} rows of {len(cols)}")
            grids.append(Curve2D(rows, cols, eta))
        if (len(gemm.eta) != len(gemm.xs)) or (len(lm_head.eta) != len(lm_head.xs)):
            raise DataError(where, "gemm/lm_head: as many efficiencies as sizes")
        layer_s, pw_eta = float(pw["layer_s"]), float(pw["eta"])
        moe_s = float(pw.get("moe_layer_s", 0.0))
        dev_s = float(pw.get("step_s", 0.0))
        ar = float(raw["allreduce_latency_s"])
    except (KeyError, TypeError, ValueError) as e:
        raise DataError(where, f"malformed efficiency curves: {e!r}") from None
    if not (0 <= layer_s < 1 and 0 < pw_eta <= 1 and 0 <= ar < 1 and 0 <= moe_s < 1
            and 0 <= dev_s < 1):
        raise DataError(where, "pointwise.layer_s, pointwise.eta, pointwise.moe_layer_s, "
                               "pointwise.step_s or allreduce_latency_s out of range")
    engine = raw.get("engine", {})
    if not isinstance(engine, dict) or set(engine) - set(ENGINE_TERMS):
        raise DataError(where, f"engine: expected an object with keys among {ENGINE_TERMS}")
    terms = {}
    for key in ENGINE_TERMS:
        v = engine.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                              or not 0 <= v < 1):
            raise DataError(where, f"engine.{key}: expected seconds in [0, 1), got {v!r}")
        terms[key] = None if v is None else float(v)
    errors = raw.get("expected_error_pct", {})
    if not isinstance(errors, dict) or any(
            isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e4
            for v in errors.values()):
        raise DataError(where, "expected_error_pct: expected an object of percentages")
    corpus = raw.get("corpus", {})
    if not isinstance(corpus, dict):
        raise DataError(where, "corpus: expected an object")
    return EfficiencyCurves(str(raw.get("name", where)), str(raw.get("source", "")), gemm,
                            grids[0], grids[1], lm_head, layer_s, pw_eta, ar, moe_s, dev_s,
                            **terms,
                            expected_error_pct={str(k): float(v) for k, v in errors.items()},
                            corpus=dict(corpus))


def list_curves() -> list[str]:
    """Names of the shipped curve sets."""
    return sorted(p.stem for p in EFFICIENCY_DIR.glob("*.json"))


@functools.cache
def load_curves(name: str) -> EfficiencyCurves:
    """A shipped curve set by name (``a100``, ``h100``)."""
    path = EFFICIENCY_DIR / f"{name}.json"
    if not path.exists():
        raise ConfigError("hardware.efficiency", f"unknown efficiency curves {name!r}; "
                                                 f"available: {', '.join(list_curves())}")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DataError(path, f"cannot read: {e}") from None
    return parse_curves(raw, str(path))
