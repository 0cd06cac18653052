"""Step latency composed from a measured kernel profile (written by ``python -m profiler``).

    step = overhead + embedding(T) + L · ( linear(T) [+ moe(T), an MoE card]
                                          + Σ_chunks attn_prefill(chunk, ctx)
                                          + (1/B) Σ_decodes attn_decode(B, ctx) )
           + lm_head(num_sampled) + swap

with T the tokens in the step, L the layers and B the decode batch. Each term is interpolated
on the profile's grid: piecewise linear in 1-D, bilinear in 2-D; no training step. A query
outside a grid is extrapolated linearly from its last segment (clamped at zero) and counted;
the run's summary carries a warning with the count, never a crash. Decode attention prices each
sequence at its own context, at the batch's size (:class:`DecodeGrid` says why the batch's mean
context is not enough).

A calibrated profile (``simserve calibrate``, docs/fidelity.md) carries a ``calibration`` block:
``step_overhead_s`` is added to every step, ``per_output_token_s`` per sampled token, and the
measured parts are multiplied by ``scale`` (embedding, linear, LM head),
``prefill_attention_scale`` and ``decode_attention_scale`` (the two attentions; an older
block's single ``attention_scale`` for both, ``scale`` when absent). ``admission_s`` is added
per request admitted in the step (a prefill chunk at context 0: the engine's own work to take a
new request in, which a profile of kernels cannot see). ``frontend_delay_s`` is per request,
outside the steps (``runner.collect`` moves engine times onto the client's clock).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
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


class DecodeGrid:
    """Decode attention of a batch whose sequences have different contexts.

    The grid measures batches of ``B`` decodes all at one context. A real batch mixes short
    and long sequences, and a decode's cost is not linear in its context (on a CPU, a long
    sequence's K/V no longer fits in cache), so pricing the batch at its mean context
    underestimates a spread-out batch. Instead each sequence is priced at its own context, at
    the batch's size, and the batch costs the mean of those::

        attn_decode(B; c_1 .. c_B) = (1/B) · Σ_i D(B, c_i)

    exact both for kernels that loop over sequences (``D(B, c) = B·g(c) + o(B)`` gives
    ``Σ g(c_i) + o(B)``) and for batched kernels linear in total context (``D = a + b·B·c``
    gives ``a + b·Σ c_i``). ``D(B, ·)`` is piecewise linear between the grid's contexts, so the
    sum needs only the count and the sum of the contexts falling in each segment: the contexts
    are sorted once and each segment's share read off prefix sums (exact integers, so a decode
    stretch, every context grown by ``offset``, gives bit-identical values).
    """

    def __init__(self, batch: list[float], ctx: list[float], values: list[list[float]]):
        self.grid = Grid2D(batch, ctx, values)
        self.cols = self.grid.cols
        self._coef: dict[int, tuple[list[float], list[float], bool]] = {}

    def coefficients(self, b: int) -> tuple[list[float], list[float], bool]:
        """Per column segment j: D(b, cols[j]) and the slope up to cols[j + 1]; and whether b
        is outside the batch axis."""
        got = self._coef.get(b)
        if got is None:
            g, cols = self.grid, self.cols
            i, wr, outside = _segment(g.rows, b)
            i1 = i + 1 if len(g.rows) > 1 else i
            at = [g.v[i][j] + wr * (g.v[i1][j] - g.v[i][j]) for j in range(len(cols))]
            if len(cols) == 1:
                got = ([at[0]], [0.0], outside)
            else:
                slope = [(at[j + 1] - at[j]) / (cols[j + 1] - cols[j])
                         for j in range(len(cols) - 1)]
                got = (at[:-1], slope, outside)
            self._coef[b] = got
        return got

    def __call__(self, sorted_ctx: list[int], prefix: list[int],
                 offset: int = 0) -> tuple[float, bool]:
        """Mean of D(B, c + offset) over ``sorted_ctx`` (ascending; ``prefix[k]`` = sum of the
        first k), and whether any lookup left the grid."""
        b = len(sorted_ctx)
        at, slope, outside = self.coefficients(b)
        cols = self.cols
        last = len(at) - 1
        total, lo = 0.0, 0
        for j in range(len(at)):
            # segment j: cols[j] <= c + offset < cols[j + 1]; the first segment also takes
            # contexts below the grid, the last those above it (linear extrapolation)
            hi = b if j == last else bisect_left(sorted_ctx, cols[j + 1] - offset, lo)
            n = hi - lo
            if n:
                ctx_sum = prefix[hi] - prefix[lo] + offset * n
                total += n * at[j] + slope[j] * (ctx_sum - n * cols[j])
            lo = hi
        outside = (outside or sorted_ctx[0] + offset < cols[0]
                   or sorted_ctx[-1] + offset > cols[-1])
        return max(0.0, total / b), outside


class ProfileLatency:
    """A :class:`~simserve.latency.base.LatencyModel` backed by a measured profile."""

    def __init__(self, profile: dict[str, Any], *, source: str = "<profile>",
                 step_overhead_s: float = 0.0, per_output_token_s: float = 0.0,
                 host_link_bandwidth: float | None = None,
                 swap_block_bytes: int | None = None, tensor_parallel_size: int = 1,
                 allreduce_s=None, enable_expert_parallel: bool = False,
                 expert_balancedness: float = 1.0):
        self.profile = profile
        prov = profile["provenance"]
        n = prov["threads"]
        threads = "" if prov["device"] == "cuda" else f", {n} thread{'' if n == 1 else 's'}"
        self.label = (f"profile ({profile['model']['name']} on {prov['device_name']}, "
                      f"{prov['dtype']}{threads})")
        self.source = source
        self.layers = int(profile["model"]["num_layers"])
        # a calibration block (simserve calibrate: fitted against a live server) adds the
        # engine's own costs the kernels cannot see and scales the measured parts
        cal = _calibration(profile.get("calibration"), source)
        self.step_overhead_s = step_overhead_s + cal["step_overhead_s"]
        self.per_output_token_s = per_output_token_s + cal["per_output_token_s"]
        self.scale = cal["scale"]                         # GEMM parts: embedding, linear, LM head
        # attention: prefill and decode run different kernels in a serving engine, so each has
        # its own scale; an older block's single attention_scale (or none: GEMM scale) for both
        both = cal.get("attention_scale", self.scale)
        self.prefill_attention_scale = cal.get("prefill_attention_scale", both)
        self.decode_attention_scale = cal.get("decode_attention_scale", both)
        self.frontend_delay_s = cal["frontend_delay_s"]   # per request, outside the steps
        self.admission_s = cal["admission_s"]             # per request admitted in a step
        self._scaled = (self.scale, self.prefill_attention_scale,
                        self.decode_attention_scale) != (1.0, 1.0, 1.0)
        if "calibration" in profile:
            self.label = self.label[:-1] + ", calibrated)"
        lin, emb, lm = profile["linear"], profile["embedding"], profile["lm_head"]
        self.linear = Grid1D(lin["tokens"], lin["seconds"])
        self.embedding = Grid1D(emb["tokens"], emb["seconds"])
        self.lm_head = Grid1D(lm["seqs"], lm["seconds"])
        pre, dec = profile["attn_prefill"], profile["attn_decode"]
        self.prefill = Grid2D(pre["chunk"], pre["ctx"], pre["seconds"])
        self.decode = DecodeGrid(dec["batch"], dec["ctx"], dec["seconds"])
        # a swap moves the simulated replica's blocks (``swap_block_bytes``: block_size tokens
        # of K and V on one rank); the profile's own blocks only when none is given
        block_bytes = swap_block_bytes if swap_block_bytes is not None else \
            profile["memory"]["block_bytes"]
        self._swap_block_s = block_bytes / host_link_bandwidth if host_link_bandwidth else 0.0
        self.extrapolated: Counter[str] = Counter()
        # what the run should know of this profile beside its lookups (engine/build.py's
        # device check)
        self.notes: list[str] = []
        # Tensor parallelism the profile was not measured at: per-layer compute (linear ops,
        # attention, LM head; all split by heads or columns across ranks) scaled by measured
        # ranks / TP, plus the roofline's ring all-reduce (``allreduce_s(tokens)``), labelled
        measured = int(profile.get("settings", {}).get("tensor_parallel_size", 1))
        self.tp, self.tp_scale = tensor_parallel_size, measured / tensor_parallel_size
        self.allreduce_s = allreduce_s if tensor_parallel_size > 1 else None
        # an MoE card's profile (#18): one MoE block per layer vs the step's tokens, measured
        # with near-uniform routing on one device. Over TP or EP ranks each rank does 1/TP of
        # the routed rows (experts sharded, or whole experts split), scaled like the linears;
        # with EP the busiest rank carries 1 / balancedness of the mean (an estimate)
        self.moe = None
        if "moe" in profile:
            self.moe = Grid1D(profile["moe"]["tokens"], profile["moe"]["seconds"])
            self.moe_scale = self.tp_scale / (expert_balancedness if enable_expert_parallel
                                              else 1.0)
        if self.tp_scale != 1.0:
            self.label = (self.label[:-1] + f", TP {tensor_parallel_size} scaled from "
                          f"TP {measured} + roofline all-reduce)")

    @classmethod
    def from_file(cls, path: str | Path, model: ModelCard | None = None,
                  **kwargs) -> ProfileLatency:
        """Load and validate a profile file; with ``model``, refuse a profile of other shapes."""
        from simserve.latency.schema import load_profile, model_mismatch
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

    def decode_stretch(self, plan: StepPlan):
        """Prices of a decode stretch starting with ``plan`` (step i: every context grown by
        i): a function ``(i, n) -> list`` of the ``step_time`` of steps i .. i + n - 1. Only
        decode attention changes along a stretch; it is recomputed from the contexts sorted once
        (no per-step sort or tuple), by the same operations as :meth:`breakdown`, so each value
        is bit-identical to ``step_time`` of that step, and the extrapolation counts come out as
        if each step had been priced."""
        if plan.padding or plan.overlapped_swap_blocks:    # rare shapes: step by step
            return lambda i, n: [self.step_time(plan._replace(
                decode_ctx=tuple(c + k for c in plan.decode_ctx))) for k in range(i, i + n)]
        before = Counter(self.extrapolated)
        base = self.breakdown(plan)
        first = self.extrapolated - before           # this plan's lookups outside the grid,
        self.extrapolated = before                   # counted when step 0 is priced
        again = Counter(first)
        again.pop("attn_decode", None)
        ctx = sorted(plan.decode_ctx)
        prefix = [0, *accumulate(ctx)]
        scaled = self._scaled
        extra = plan.extra_s

        def step(i: int) -> float:
            if i == 0 or not ctx:
                if i == 0:
                    self.extrapolated.update(first)
                return sum(base.values()) + extra
            self.extrapolated.update(again)
            decode = self.layers * self._get("attn_decode", self.decode, ctx, prefix, i)
            if scaled:
                decode *= self.decode_attention_scale
            parts = dict(base)
            parts["attn_decode"] = decode
            return sum(parts.values()) + extra

        def prices(i: int, n: int) -> list[float]:
            return [step(j) for j in range(i, i + n)]

        return prices

    def forget_prices(self, prices: Any, i: int, n: int) -> None:
        """Take back the grid lookups counted when ``prices`` (a :meth:`decode_stretch`)
        priced steps i .. i + n - 1, which the engine then dropped (a stretch prices a step
        or two past the next event and stepping never prices them): the warnings count the
        lookups of the steps that ran, fast-forwarded or not. They are priced again to see
        what they counted, and that is taken off twice."""
        before = Counter(self.extrapolated)
        prices(i, n)
        counted = self.extrapolated - before
        self.extrapolated = before - counted

    def cpu_s(self, plan: StepPlan) -> float:
        """The engine's CPU time within ``step_time(plan)`` (what async scheduling overlaps
        with the step before): the step overhead, ``admission_s`` a request admitted and
        ``per_output_token_s`` a sampled row (the breakdown's overhead, admission and
        output_tokens)."""
        if plan.is_empty:
            return 0.0
        admitted = plan.prefill_ctx.count(0) if self.admission_s and plan.prefill_ctx else 0
        return (self.step_overhead_s + self.admission_s * admitted
                + self.per_output_token_s * plan.as_computed().num_sampled)

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        """Seconds per component (all layers together); they sum to :meth:`step_time` less the
        plan's ``extra_s``."""
        parts = dict.fromkeys(("overhead", "admission", "output_tokens", "embedding", "linear",
                               "attn_prefill", "attn_decode", "lm_head", "swap"), 0.0)
        if plan.is_empty:
            return parts
        plan = plan.as_computed()          # padded rows: decodes the device computes too
        parts["overhead"] = self.step_overhead_s
        if self.admission_s and plan.prefill_ctx:
            parts["admission"] = self.admission_s * plan.prefill_ctx.count(0)
        n = plan.num_batched_tokens
        if n:
            parts["embedding"] = self._get("embedding", self.embedding, n)
            parts["linear"] = self.layers * self._get("linear", self.linear, n)
            if self.moe is not None:
                parts["moe"] = self.layers * self._get("moe", self.moe, n) * self.moe_scale
            prefill = 0.0
            for q, c in zip(plan.prefill_lens, plan.prefill_ctx):
                prefill += self._get("attn_prefill", self.prefill, q, c)
            decode_ctx = plan.decode_ctx
            if plan.decode_q:
                # speculative verifies (q > 1 tokens after c cached): priced as chunks on the
                # measured prefill kernel; single-token decodes as decodes
                for q, c in zip(plan.decode_q, plan.decode_ctx):
                    if q > 1:
                        prefill += self._get("attn_prefill", self.prefill, q, c)
                decode_ctx = tuple(c for q, c in zip(plan.decode_q, decode_ctx) if q == 1)
            parts["attn_prefill"] = self.layers * prefill
            if decode_ctx:
                ctx = sorted(decode_ctx)
                parts["attn_decode"] = self.layers * self._get(
                    "attn_decode", self.decode, ctx, [0, *accumulate(ctx)])
        if plan.num_sampled:
            # a verify scores every one of its q positions
            rows = plan.num_sampled + plan.num_decode_tokens - len(plan.decode_ctx)
            parts["lm_head"] = self._get("lm_head", self.lm_head, rows)
            parts["output_tokens"] = self.per_output_token_s * plan.num_sampled
        if self._scaled:
            for name in ("embedding", "linear", "lm_head", "moe"):
                if name in parts:
                    parts[name] *= self.scale
            parts["attn_prefill"] *= self.prefill_attention_scale
            parts["attn_decode"] *= self.decode_attention_scale
        # on the critical path: every swapped block but those moved alongside the compute
        parts["swap"] = (plan.swap_in_blocks + plan.swap_out_blocks
                         - plan.overlapped_swap_blocks) * self._swap_block_s
        if self.tp_scale != 1.0:
            for name in ("linear", "attn_prefill", "attn_decode", "lm_head"):
                parts[name] *= self.tp_scale
        if self.allreduce_s is not None:
            parts["allreduce"] = self.allreduce_s(n)
        if plan.overlapped_swap_blocks:    # a side stream: only what outlasts the step counts
            side = plan.overlapped_swap_blocks * self._swap_block_s
            parts["swap"] += max(0.0, side - sum(parts.values()))
        return parts

    def _get(self, name: str, grid, *args: float) -> float:
        value, outside = grid(*args)
        if outside:
            self.extrapolated[name] += 1
        return value

    def warnings(self) -> list[str]:
        """Human-readable notes: the profile's device against the scenario's, and grid
        extrapolation during the run (empty if none)."""
        return self.notes + [f"{self.label}: {name} extrapolated beyond the measured grid in "
                             f"{k} lookups" for name, k in sorted(self.extrapolated.items())]


_CALIBRATION_DEFAULTS = {"step_overhead_s": 0.0, "per_output_token_s": 0.0, "scale": 1.0,
                         "frontend_delay_s": 0.0, "admission_s": 0.0}


def _calibration(cal: Any, source: str) -> dict[str, float]:
    """The fitted terms of a ``calibration`` block (docs/fidelity.md), defaults without one."""
    if cal is None:
        return dict(_CALIBRATION_DEFAULTS)
    if not isinstance(cal, dict):
        raise DataError(source, "calibration: expected an object")
    out = {}
    keys = dict(_CALIBRATION_DEFAULTS)
    for key in ("attention_scale", "prefill_attention_scale", "decode_attention_scale"):
        if key in cal:                    # without them, attention is scaled like the rest
            keys[key] = 1.0
    for key, default in keys.items():
        v = cal.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise DataError(source, f"calibration.{key}: expected a non-negative number, "
                                    f"got {v!r}")
        out[key] = float(v)
    return out


PROFILES_DIR = Path(__file__).resolve().parent.parent / "data" / "profiles"


def list_profiles() -> list[str]:
    """Names of the profiles shipped in ``simserve/data/profiles`` (file names without .json)."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.json"))


def resolve_profile_path(path: str | Path, base_dir: str | Path = ".") -> Path | None:
    """Where a scenario's ``latency.path`` points: a file (relative to ``base_dir``, the
    scenario's folder) when one exists there, else a shipped profile of that name (with or
    without ``.json``); None when neither exists."""
    p = Path(path)
    local = p if p.is_absolute() else Path(base_dir) / p
    if local.exists():
        return local
    if p.parent == Path("."):                     # a bare name: look among the shipped ones
        name = p.name[:-5] if p.name.endswith(".json") else p.name
        shipped = PROFILES_DIR / f"{name}.json"
        if shipped.exists():
            return shipped
    return None


def find_profile(given: str | Path, base_dir: str | Path, where: str) -> Path:
    """:func:`resolve_profile_path`, or a ConfigError naming ``where`` when neither a file nor
    a shipped profile of that name exists (``simserve run`` and ``calibrate`` alike)."""
    from simserve.errors import ConfigError
    path = resolve_profile_path(given, base_dir)
    if path is None:
        raise ConfigError(where, f"profile file not found: {Path(base_dir) / given}, nor a "
                                 f"shipped profile of that name (shipped: "
                                 f"{', '.join(list_profiles()) or 'none'})")
    return path


FORM_FACTORS = {"pcie", "nvl"}     # device-name words that set a card apart (SXM: the default)


def other_device(profile_device: str, device_name: str, hardware: Any) -> str:
    """Why a profile measured on ``device_name`` (its provenance: ``profile_device`` "cpu" or
    "cuda") is not of the scenario's ``hardware``, or "" when it is: a CPU profile on a CPU
    card; a GPU profile whose device name has, as whole words, the card's family (the shipped
    card's name up to its first dash: "H100" of H100-SXM in "NVIDIA H100 80GB HBM3"; an
    inline card's shipped base, ``{spec: H100-SXM, name: mine}``), the same form factor
    (PCIe, NVL; none for SXM) and, where both name one, the same memory size (40GB, 80GB)."""
    import re

    def words(name: str) -> set[str]:
        return {w.lower() for w in re.split(r"[^A-Za-z0-9]+", name) if w}

    kind = "cpu" if profile_device == "cpu" else "gpu"
    card = str(getattr(hardware, "base", "") or hardware.name)
    have, want = words(device_name), words(card)
    memory = {w for w in have if re.fullmatch(r"\d+gb", w)}
    card_memory = {w for w in want if re.fullmatch(r"\d+gb", w)}
    same = kind == hardware.kind and (kind == "cpu" or (
        card.split("-")[0].lower() in have
        and have & FORM_FACTORS == want & FORM_FACTORS
        and (not memory or not card_memory or memory == card_memory)))
    if same:
        return ""
    return (f"latency.path: the profile was measured on {device_name}, but hardware is "
            f"{hardware.name}: its step times are that device's (hardware sets only the "
            f"memory, the KV blocks and the links here)")
