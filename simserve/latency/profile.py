"""Step latency composed from a measured kernel profile (written by ``python -m profiler``).

    step = overhead + embedding(T) + L · ( linear(T)
                                          + Σ_chunks attn_prefill(chunk, ctx)
                                          + attn_decode(B, mean decode ctx) )
           + lm_head(num_sampled) + swap

with T the tokens in the step, L the layers and B the decode batch. Each term is interpolated
on the profile's grid: piecewise linear in 1-D, bilinear in 2-D; no training step. A query
outside a grid is extrapolated linearly from its last segment (clamped at zero) and counted;
the run's summary carries a warning with the count, never a crash. Decode attention is priced
at the batch's mean context, since it reads every sequence's KV once (memory-bound: cost is
linear in total context).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from pathlib import Path
from typing import Any

from simserve.cards import ModelCard
from simserve.errors import DataError
from simserve.sched.plan import StepPlan


def _segment(axis: list[float], x: float) -> tuple[int, float, bool]:
    """Index i and weight w so that x ≈ axis[i]·(1-w) + axis[i+1]·w; and whether x is outside."""
    if len(axis) == 1:
        return 0, 0.0, x != axis[0]
    i = min(max(bisect_right(axis, x) - 1, 0), len(axis) - 2)
    w = (x - axis[i]) / (axis[i + 1] - axis[i])
    return i, w, x < axis[0] or x > axis[-1]


class Grid1D:
    def __init__(self, xs: list[float], ys: list[float]):
        self.xs, self.ys = [float(x) for x in xs], [float(y) for y in ys]

    def __call__(self, x: float) -> tuple[float, bool]:
        i, w, outside = _segment(self.xs, x)
        if len(self.xs) == 1:
            return self.ys[0], outside
        return max(0.0, self.ys[i] + w * (self.ys[i + 1] - self.ys[i])), outside


class Grid2D:
    def __init__(self, rows: list[float], cols: list[float], values: list[list[float]]):
        self.rows, self.cols = [float(r) for r in rows], [float(c) for c in cols]
        self.v = [[float(x) for x in row] for row in values]

    def __call__(self, r: float, c: float) -> tuple[float, bool]:
        i, wr, out_r = _segment(self.rows, r)
        j, wc, out_c = _segment(self.cols, c)
        v = self.v
        i1 = i + 1 if len(self.rows) > 1 else i
        j1 = j + 1 if len(self.cols) > 1 else j
        top = v[i][j] + wc * (v[i][j1] - v[i][j])
        bottom = v[i1][j] + wc * (v[i1][j1] - v[i1][j])
        return max(0.0, top + wr * (bottom - top)), out_r or out_c


class ProfileLatency:
    """A :class:`~simserve.latency.base.LatencyModel` backed by a measured profile."""

    def __init__(self, profile: dict[str, Any], *, source: str = "<profile>",
                 step_overhead_s: float = 0.0, host_link_bandwidth: float | None = None):
        self.profile = profile
        prov = profile["provenance"]
        self.label = (f"profile ({profile['model']['name']} on {prov['device_name']}, "
                      f"{prov['dtype']}, {prov['threads']} threads)")
        self.source = source
        self.layers = int(profile["model"]["num_layers"])
        # a calibration block (simserve calibrate: fitted against a live server) adds the
        # engine's own costs the kernels cannot see and scales the measured parts
        cal = _calibration(profile.get("calibration"), source)
        self.step_overhead_s = step_overhead_s + cal["step_overhead_s"]
        self.per_output_token_s = cal["per_output_token_s"]
        self.scale = cal["scale"]
        self.frontend_delay_s = cal["frontend_delay_s"]   # per request, outside the steps
        if "calibration" in profile:
            self.label = self.label[:-1] + ", calibrated)"
        lin, emb, lm = profile["linear"], profile["embedding"], profile["lm_head"]
        self.linear = Grid1D(lin["tokens"], lin["seconds"])
        self.embedding = Grid1D(emb["tokens"], emb["seconds"])
        self.lm_head = Grid1D(lm["seqs"], lm["seconds"])
        pre, dec = profile["attn_prefill"], profile["attn_decode"]
        self.prefill = Grid2D(pre["chunk"], pre["ctx"], pre["seconds"])
        self.decode = Grid2D(dec["batch"], dec["ctx"], dec["seconds"])
        block_bytes = profile["memory"]["block_bytes"]
        self._swap_block_s = block_bytes / host_link_bandwidth if host_link_bandwidth else 0.0
        self.extrapolated: Counter[str] = Counter()

    @classmethod
    def from_file(cls, path: str | Path, model: ModelCard | None = None, **kwargs) -> ProfileLatency:
        """Load and validate a profile file; with ``model``, refuse a profile of other shapes."""
        from profiler.schema import load_profile, model_mismatch
        profile = load_profile(path)
        if model is not None:
            diffs = model_mismatch(profile, model)
            if diffs:
                raise DataError(path, f"profile was measured for other model shapes than "
                                      f"{model.name!r}: {'; '.join(diffs)}")
        return cls(dict(profile), source=str(path), **kwargs)

    def step_time(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        return sum(self.breakdown(plan).values()) + plan.extra_s

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        """Seconds per component (all layers together); they sum to :meth:`step_time` less the
        plan's ``extra_s``."""
        parts = dict.fromkeys(("overhead", "output_tokens", "embedding", "linear",
                               "attn_prefill", "attn_decode", "lm_head", "swap"), 0.0)
        if plan.is_empty:
            return parts
        parts["overhead"] = self.step_overhead_s
        n = plan.num_batched_tokens
        if n:
            parts["embedding"] = self._get("embedding", self.embedding, n)
            parts["linear"] = self.layers * self._get("linear", self.linear, n)
            prefill = 0.0
            for q, c in zip(plan.prefill_lens, plan.prefill_ctx):
                prefill += self._get("attn_prefill", self.prefill, q, c)
            parts["attn_prefill"] = self.layers * prefill
            if plan.decode_ctx:
                b = len(plan.decode_ctx)
                parts["attn_decode"] = self.layers * self._get(
                    "attn_decode", self.decode, b, sum(plan.decode_ctx) / b)
        if plan.num_sampled:
            parts["lm_head"] = self._get("lm_head", self.lm_head, plan.num_sampled)
            parts["output_tokens"] = self.per_output_token_s * plan.num_sampled
        if self.scale != 1.0:
            for name in ("embedding", "linear", "attn_prefill", "attn_decode", "lm_head"):
                parts[name] *= self.scale
        parts["swap"] = (plan.swap_in_blocks + plan.swap_out_blocks) * self._swap_block_s
        return parts

    def _get(self, name: str, grid, *args: float) -> float:
        value, outside = grid(*args)
        if outside:
            self.extrapolated[name] += 1
        return value

    def warnings(self) -> list[str]:
        """Human-readable notes on grid extrapolation during the run (empty if none)."""
        return [f"{self.label}: {name} extrapolated beyond the measured grid in {k} lookups"
                for name, k in sorted(self.extrapolated.items())]


_CALIBRATION_DEFAULTS = {"step_overhead_s": 0.0, "per_output_token_s": 0.0, "scale": 1.0,
                         "frontend_delay_s": 0.0}


def _calibration(cal: Any, source: str) -> dict[str, float]:
    """The fitted terms of a ``calibration`` block (docs/fidelity.md), defaults without one."""
    if cal is None:
        return dict(_CALIBRATION_DEFAULTS)
    if not isinstance(cal, dict):
        raise DataError(source, "calibration: expected an object")
    out = {}
    for key, default in _CALIBRATION_DEFAULTS.items():
        v = cal.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0 or \
                (key == "scale" and v == 0):
            raise DataError(source, f"calibration.{key}: expected a "
                                    f"{'positive' if key == 'scale' else 'non-negative'} number, "
                                    f"got {v!r}")
        out[key] = float(v)
    return out
