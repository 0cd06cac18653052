"""Step latency from a hardware spec: a roofline per operation, for hardware never measured.

Each operation's roofline is ``max(FLOPs / peak, bytes / bandwidth)`` on one tensor-parallel
rank. With efficiency curves (the default where the hardware names a curve set,
``latency/efficiency.py``) each operation costs its roofline divided by the efficiency its
class reaches at its size (measured: small GEMMs, short attention and launch-bound pointwise
ops fall far below the roofline); with constant efficiencies every operation costs
``max(FLOPs / (peak · flops_efficiency), bytes / (bandwidth · bandwidth_efficiency))``. The
step is the sum of the operations of every layer, the LM head, the tensor-parallel
all-reduces, KV swap transfers and a fixed per-step overhead. Either way an estimate.
Formulas, notation and the reasons for the defaults: docs/latency.md.

Also two hand-computable models for tests and quick what-ifs: :class:`ConstantLatency` and
:class:`LinearLatency`.
"""

from __future__ import annotations

import math

from simserve.cards import HardwareSpec, ModelCard
from simserve.latency.efficiency import EfficiencyCurves
from simserve.kv.capacity import check_tensor_parallel, kv_block_bytes, kv_heads_per_rank
from simserve.sched.plan import StepPlan

# Labelled assumptions, not measurements (docs/latency.md says why these values).
DEFAULT_FLOPS_EFFICIENCY = 0.6
DEFAULT_BANDWIDTH_EFFICIENCY = 0.8
DEFAULT_STEP_OVERHEAD_S = {"gpu": 2e-3, "cpu": 8.4e-3}
DEFAULT_ALLREDUCE_LATENCY_S = 10e-6

# names of the terms of RooflineModel.breakdown, in the order _parts returns them
PARTS = ("linear", "attention_prefill", "attention_decode", "lm_head", "allreduce", "swap")
# with efficiency curves, one more: norms, RoPE, residual adds and the KV write
CURVE_PARTS = PARTS + ("pointwise",)


class RooflineModel:
    """Prices a :class:`StepPlan` from model shapes and a hardware spec (per TP rank)."""

    def __init__(self, model: ModelCard, hw: HardwareSpec, *, tensor_parallel_size: int = 1,
                 block_size: int = 16, step_overhead_s: float | None = None,
                 flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
                 bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
                 allreduce_latency_s: float | None = None,
                 curves: EfficiencyCurves | None = None):
        """``curves``: price each operation at its class's measured efficiency by size (the
        constant ``flops_efficiency`` / ``bandwidth_efficiency`` are then unused and must be
        left at their defaults); None: constant efficiencies for every operation."""
        tp = tensor_parallel_size
        check_tensor_parallel(model, tp)
        if not (0 < flops_efficiency <= 1 and 0 < bandwidth_efficiency <= 1):
            raise ValueError("flops_efficiency and bandwidth_efficiency must be in (0, 1]")
        self.model, self.hw, self.tp, self.curves = model, hw, tp, curves
        self.label = (f"roofline ({hw.name} spec)" if curves is None else
                      f"roofline ({hw.name} spec, {curves.name} efficiency curves; estimate)")
        self.step_overhead_s = (DEFAULT_STEP_OVERHEAD_S[hw.kind] if step_overhead_s is None
                                else step_overhead_s)
        if allreduce_latency_s is None:
            allreduce_latency_s = (DEFAULT_ALLREDUCE_LATENCY_S if curves is None
                                   else curves.allreduce_latency_s)
        if curves is not None:             # rates at 100 %: each op divided by its own η
            flops_efficiency = bandwidth_efficiency = 1.0
        flops = hw.peak_flops * flops_efficiency      # achieved FLOP/s
        bw = hw.mem_bandwidth * bandwidth_efficiency  # achieved B/s
        d, h, L = model.dtype_bytes, model.hidden_size, model.num_layers
        q = model.q_dim // tp                               # query width on this rank
        kv = kv_heads_per_rank(model, tp) * model.head_dim  # K (or V) width on this rank
        i = model.intermediate_size // tp

        # Linear ops of one layer: (weight params, activation elements read + written per token)
        linear_ops = [
            (h * (q + 2 * kv), h + q + 2 * kv),  # QKV projection
            (q * h, q + h),                      # O projection
        ]
        if model.mlp == "gated":
            linear_ops += [(h * 2 * i, h + 2 * i),   # gate and up, fused
                           (i * h, 2 * i + h)]       # SiLU·mul fused into down's input, down
        else:
            linear_ops += [(h * i, h + i),           # fc1
                           (i * h, 2 * i + h)]       # activation fused into fc2's input, fc2
        # per op: (seconds per token of FLOPs, seconds of weight bytes, seconds per token of
        # activation bytes)
        self._linear = [(2 * w / flops, w * d / bw, a * d / bw) for w, a in linear_ops]
        self._layers = L
        self._linear_at: dict[int, float] = {}   # linear time by tokens in the step (memo)
        self._decode_terms: dict[int, tuple] = {}   # decode_stretch's terms by batch size

        # Attention, all layers together. FLOPs per (query token · attended token):
        # QKᵀ and PV each 2 · head_dim per query head.
        self._attn_flop_s = L * 4 * (model.num_heads // tp) * model.head_dim / flops
        self._kv_tok_s = L * 2 * kv * d / bw                  # K+V of one token, all layers
        # q-side per new token: read Q, write the output, write its own K and V
        self._q_tok_s = L * (2 * q + 2 * kv) * d / bw

        # LM head (vocab split across ranks) and sampling over fp32 logits
        v = model.vocab_size // tp
        self._lm_flop_s = 2 * h * v / flops
        self._lm_weight_s = h * v * d / bw
        self._lm_row_s = (h * d + v * (d + 4)) / bw

        # Two all-reduces per layer (after attention's O and after the MLP's down): ring cost
        # 2 (TP − 1) / TP · bytes / link, plus a fixed latency per collective.
        if tp > 1:
            self._ar_tok_s = 2 * L * 2 * (tp - 1) / tp * h * d / hw.interconnect_bandwidth
            self._ar_fixed_s = 2 * L * allreduce_latency_s
        else:
            self._ar_tok_s = self._ar_fixed_s = 0.0
        self._swap_block_s = kv_block_bytes(model, block_size, tp) / hw.host_link_bandwidth
        self._kv_heads = kv_heads_per_rank(model, tp)
        self._decode_rows: dict = {}       # decode η by context, per batch size (curves)
        # Pointwise ops of one layer (curves only; the constant model folds them into the
        # overhead): bytes per token = two RMSNorms (read, write h), two residual adds (read
        # 2h, write h), RoPE (read, write Q and K), KV write (read K, V; write them to the cache)
        self._pw_tok_s = L * (10 * h + 2 * (q + kv) + 4 * kv) * d / bw
        self._pw_fixed_s = 0.0 if curves is None else L * curves.pointwise_layer_s

    def step_time(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        parts = self._parts(plan) if self.curves is None else self._curve_parts(plan)
        t = sum(parts) + self.step_overhead_s
        if plan.overlapped_swap_blocks:
            t += self._hidden_swap(plan, t)
        return t + plan.extra_s

    def _hidden_swap(self, plan: StepPlan, step_s: float) -> float:
        """What overlapped swaps add to a step of ``step_s`` seconds: their transfer time on
        the host link beyond the step's own (they run on a separate stream alongside)."""
        return max(0.0, plan.overlapped_swap_blocks * self._swap_block_s - step_s)

    def decode_stretch(self, plan: StepPlan):
        """Prices of a decode stretch starting with ``plan`` (step i: every context grown by
        i): a function ``(i, n) -> list`` of the ``step_time`` of steps i .. i + n - 1.
        Mirrors ``_parts`` operation for operation, so each value is
        bit-identical to ``step_time`` of that step (fast-forward relies on it)."""
        if plan.padding or plan.overlapped_swap_blocks:    # rare shapes: step by step
            return self._stepwise(plan)
        if self.curves is not None:
            return self._curve_stretch(plan)
        b = len(plan.decode_ctx)
        if not (plan.prefill_lens or plan.swap_in_blocks or plan.swap_out_blocks
                or plan.num_sampled != b or plan.extra_s):
            return self.decode_stretch_sum(b, sum(plan.decode_ctx))
        base = sum(plan.decode_ctx) + b    # Σ (c + i) + b = base + b·i: exact integers
        flop_s, kv_s, overhead, extra = (self._attn_flop_s, self._kv_tok_s,
                                         self.step_overhead_s, plan.extra_s)
        linear, prefill, _, lm_head, comm, swap = self._parts(plan)
        before = linear + prefill          # sum(parts) adds left to right: 0 + linear + ...
        q_part = b * self._q_tok_s

        def prices(i: int, n: int) -> list[float]:
            attended = range(base + b * i, base + b * (i + n), b) if b else [0] * n
            return [(((((before + max(a * flop_s, a * kv_s + q_part)) + lm_head) + comm)
                      + swap) + overhead) + extra for a in attended]

        return prices

    def _stepwise(self, plan: StepPlan):
        def prices(i: int, n: int) -> list[float]:
            return [self.step_time(plan._replace(decode_ctx=tuple(c + k for c in
                                                                  plan.decode_ctx)))
                    for k in range(i, i + n)]
        return prices

    def decode_stretch_sum(self, b: int, total_ctx: int):
        """``decode_stretch`` of a plain decode step of ``b`` requests whose contexts sum to
        ``total_ctx`` (a roofline decode step depends on nothing else), without building the
        plan: what the engine prices a stretch's later segments with."""
        if self.curves is not None:
            return self._curve_stretch_sum(b, total_ctx)
        base = total_ctx + b               # Σ (c + i) + b = base + b·i: exact integers
        terms = self._decode_terms.get(b)
        if terms is None:                  # the terms that depend on b alone (memoised)
            linear = self._linear_s(b)
            lm_head = max(b * self._lm_flop_s, self._lm_weight_s + b * self._lm_row_s) \
                if b else 0.0
            comm = b * self._ar_tok_s + self._ar_fixed_s if b else 0.0
            # memory-bound at every context and nothing to add but the LM head: the short
            # formula below gives the same values
            fast = bool(self._kv_tok_s >= self._attn_flop_s and b and not comm)
            terms = self._decode_terms[b] = (linear + 0.0, lm_head, comm, b * self._q_tok_s,
                                             fast)
        before, lm_head, comm, q_part, fast = terms
        flop_s, kv_s, overhead = self._attn_flop_s, self._kv_tok_s, self.step_overhead_s

        if fast:
            # the usual decode step, in fewer operations but the same values: a·kv_s + q_part
            # >= a·flop_s for every a (kv_s >= flop_s; rounding is monotone), so max() picks
            # its second term, and x + 0.0 is x for any x >= 0
            def prices(i: int, n: int) -> list[float]:
                return [((before + (a * kv_s + q_part)) + lm_head) + overhead
                        for a in range(base + b * i, base + b * (i + n), b)]
        else:
            def prices(i: int, n: int) -> list[float]:
                attended = range(base + b * i, base + b * (i + n), b) if b else [0] * n
                return [((((before + max(a * flop_s, a * kv_s + q_part)) + lm_head) + comm)
                         + 0.0) + overhead for a in attended]

        return prices

    def allreduce_s(self, num_tokens: int) -> float:
        """Tensor-parallel communication of a step of ``num_tokens`` tokens: two ring
        all-reduces per layer of ``num_tokens · hidden · dtype`` bytes each, every rank sending
        and receiving ``2 (TP - 1) / TP`` of the message over its link, plus a fixed latency per
        collective (0 without TP). The ``allreduce`` term of :meth:`breakdown`."""
        return num_tokens * self._ar_tok_s + self._ar_fixed_s if num_tokens else 0.0

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        """Seconds per component (they sum to :meth:`step_time`)."""
        names = PARTS if self.curves is None else CURVE_PARTS
        if plan.is_empty:
            return dict.fromkeys(names + ("overhead",), 0.0)
        parts = self._parts(plan) if self.curves is None else self._curve_parts(plan)
        out = {**dict(zip(names, parts)), "overhead": self.step_overhead_s}
        if plan.overlapped_swap_blocks:
            out["swap"] += self._hidden_swap(plan, sum(parts) + self.step_overhead_s)
        return out

    def _linear_s(self, n: int) -> float:
        """The GEMMs of a step of ``n`` tokens, all layers (memoised: the same few token
        counts recur step after step)."""
        linear = self._linear_at.get(n)
        if linear is None:
            linear = 0.0
            if n:
                for flop_s, weight_s, act_s in self._linear:
                    linear += max(n * flop_s, weight_s + n * act_s)
                linear *= self._layers
            self._linear_at[n] = linear
        return linear

    def _parts(self, plan: StepPlan) -> tuple[float, float, float, float, float, float]:
        if plan.padding:                   # padded rows: decodes the device computes too
            plan = plan._replace(decode_ctx=plan.padded_ctx, padding=0,
                                 num_sampled=plan.num_sampled + plan.padding)
        prefill_tokens = sum(plan.prefill_lens)
        n = prefill_tokens + len(plan.decode_ctx)      # plan.num_batched_tokens
        linear = self._linear_s(n)

        # prefill chunk of q tokens after c cached ones: causal, so the chunk's i-th token
        # attends c + i tokens; Σ_{i=1..q} (c + i) = q · (c + (q + 1) / 2)
        prefill = 0.0
        if plan.prefill_lens:
            pairs = kv_toks = 0.0
            for q, c in zip(plan.prefill_lens, plan.prefill_ctx):
                pairs += q * (c + (q + 1) / 2)
                kv_toks += c + q
            prefill = max(pairs * self._attn_flop_s,
                          kv_toks * self._kv_tok_s + prefill_tokens * self._q_tok_s)

        # decode: each sequence's new token attends ctx + 1 tokens, reading their K and V
        decode = 0.0
        if plan.decode_ctx:
            attended = sum(plan.decode_ctx) + len(plan.decode_ctx)
            decode = max(attended * self._attn_flop_s,
                          attended * self._kv_tok_s + len(plan.decode_ctx) * self._q_tok_s)

        r = plan.num_sampled
        lm_head = max(r * self._lm_flop_s, self._lm_weight_s + r * self._lm_row_s) if r else 0.0
        comm = n * self._ar_tok_s + self._ar_fixed_s if n else 0.0
        # on the critical path: every swapped block but those moved alongside the compute
        swap = (plan.swap_out_blocks + plan.swap_in_blocks - plan.overlapped_swap_blocks) \
            * self._swap_block_s
        return linear, prefill, decode, lm_head, comm, swap


    # ----------------------------------------------------------------------------------------
    # With efficiency curves: every term is its roofline at 100 % divided by its class's η.
    # Decode-only terms depend on (batch, Σ contexts) alone, which is what lets a stretch be
    # priced without building plans; step_time and the stretches share these helpers, so the
    # values are bit-identical (fast-forward relies on it).

    def _curve_linear_s(self, n: int) -> float:
        """GEMMs of a step of ``n`` tokens, all layers (memoised)."""
        linear = self._linear_at.get(n)
        if linear is None:
            linear = 0.0
            if n:
                eta = self.curves.gemm(n)
                for flop_s, weight_s, act_s in self._linear:
                    linear += max(n * flop_s, weight_s + n * act_s) / eta
                linear *= self._layers
            self._linear_at[n] = linear
        return linear

    def _curve_pointwise_s(self, n: int) -> float:
        return self._pw_fixed_s + n * self._pw_tok_s / self.curves.pointwise_eta if n else 0.0

    def _curve_lm_s(self, r: int) -> float:
        if not r:
            return 0.0
        return (max(r * self._lm_flop_s, self._lm_weight_s + r * self._lm_row_s)
                / self.curves.lm_head(r))

    def _curve_decode_s(self, b: int, attended: int) -> float:
        """Decode attention of ``b`` sequences attending ``attended`` tokens in all, priced at
        the efficiency of ``b`` × KV heads (sequence, head) pairs at the mean context."""
        if not b:
            return 0.0
        row = self._decode_rows.get(b)
        if row is None:                    # η by context at this batch (memo: stretches)
            row = self._decode_rows[b] = self.curves.attn_decode.row(b * self._kv_heads)
        roof = max(attended * self._attn_flop_s, attended * self._kv_tok_s + b * self._q_tok_s)
        # mean context c = attended / b - 1, on the axis as log2(1 + c) = log2(attended / b)
        return roof / row.at_log2(math.log2(attended / b))

    def _curve_parts(self, plan: StepPlan) -> tuple[float, ...]:
        if plan.padding:                   # padded rows: decodes the device computes too
            plan = plan._replace(decode_ctx=plan.padded_ctx, padding=0,
                                 num_sampled=plan.num_sampled + plan.padding)
        n = sum(plan.prefill_lens) + len(plan.decode_ctx)
        prefill = 0.0
        eta = self.curves.attn_prefill
        for q, c in zip(plan.prefill_lens, plan.prefill_ctx):
            # one chunk: causal pairs q · (c + (q + 1) / 2); K, V of c + q tokens read
            roof = max(q * (c + (q + 1) / 2) * self._attn_flop_s,
                       (c + q) * self._kv_tok_s + q * self._q_tok_s)
            prefill += roof / eta(q, c)
        b = len(plan.decode_ctx)
        decode = self._curve_decode_s(b, sum(plan.decode_ctx) + b)
        comm = n * self._ar_tok_s + self._ar_fixed_s if n else 0.0
        swap = (plan.swap_out_blocks + plan.swap_in_blocks - plan.overlapped_swap_blocks) \
            * self._swap_block_s
        return (self._curve_linear_s(n), prefill, decode, self._curve_lm_s(plan.num_sampled),
                comm, swap, self._curve_pointwise_s(n))

    def _curve_stretch(self, plan: StepPlan):
        b = len(plan.decode_ctx)
        linear, prefill, _, lm_head, comm, swap, pw = self._curve_parts(plan)
        before, overhead, extra = linear + prefill, self.step_overhead_s, plan.extra_s
        base = sum(plan.decode_ctx) + b    # Σ (c + i + 1) = base + b·i: exact integers
        dec = self._curve_decode_s

        def prices(i: int, n: int) -> list[float]:
            return [((((((before + dec(b, base + b * k)) + lm_head) + comm) + swap) + pw)
                     + overhead) + extra for k in range(i, i + n)]

        return prices

    def _curve_stretch_sum(self, b: int, total_ctx: int):
        # a plain decode step: n = b tokens, b rows sampled, no prefill, swap or extra cost
        linear = self._curve_linear_s(b)
        lm_head = self._curve_lm_s(b)
        comm = b * self._ar_tok_s + self._ar_fixed_s if b else 0.0
        pw = self._curve_pointwise_s(b)
        before, overhead = linear + 0.0, self.step_overhead_s
        base = total_ctx + b
        dec = self._curve_decode_s

        def prices(i: int, n: int) -> list[float]:
            return [((((((before + dec(b, base + b * k)) + lm_head) + comm) + 0.0) + pw)
                     + overhead) + 0.0 for k in range(i, i + n)]

        return prices


class ConstantLatency:
    """Every non-empty step takes ``step_s`` seconds."""

    label = "constant"

    def __init__(self, step_s: float):
        self.step_s = step_s

    def step_time(self, plan: StepPlan) -> float:
        return 0.0 if plan.is_empty else self.step_s + plan.extra_s


class LinearLatency:
    """``base_s + per_token_s · batched tokens + per_seq_s · sequences`` per non-empty step."""

    label = "linear"

    def __init__(self, base_s: float, per_token_s: float = 0.0, per_seq_s: float = 0.0):
        self.base_s, self.per_token_s, self.per_seq_s = base_s, per_token_s, per_seq_s

    def step_time(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        return (self.base_s + self.per_token_s * (plan.num_batched_tokens + plan.padding)
                + self.per_seq_s * (plan.num_seqs + plan.padding)) + plan.extra_s
