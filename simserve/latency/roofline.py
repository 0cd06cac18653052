"""Step latency from a hardware spec: a roofline per operation, for hardware never measured.

Each operation's roofline is ``max(FLOPs / peak, bytes / bandwidth)`` on one tensor-parallel
rank. With efficiency curves (the default where the hardware names a curve set,
``latency/efficiency.py``) each operation costs its roofline divided by the efficiency its
class reaches at its size (measured: small GEMMs, short attention and launch-bound pointwise
ops fall far below the roofline); with constant efficiencies every operation costs
``max(FLOPs / (peak · flops_efficiency), bytes / (bandwidth · bandwidth_efficiency))``. The
step is the sum of the operations of every layer (mixture-of-experts layers: router, shared
expert, grouped expert GEMMs and the expert all-to-all), the LM head, the tensor-parallel
all-reduces, KV swap transfers and a fixed per-step overhead. Either way an estimate.
Formulas, notation and the reasons for the defaults: docs/latency.md and docs/models.md.

Also two hand-computable models for tests and quick what-ifs: :class:`ConstantLatency` and
:class:`LinearLatency`.
"""

from __future__ import annotations

import math
from bisect import bisect_right

from simserve.cards import HardwareSpec, ModelCard
from simserve.errors import ConfigError
from simserve.kv.capacity import (check_expert_parallel, check_tensor_parallel, kv_block_bytes,
                                  kv_heads_per_rank)
from simserve.latency.efficiency import EfficiencyCurves
from simserve.latency.roofline_stretch import MEMO_MAX, RooflineStretchPricing, left_to_right
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


ALL2ALL_BACKENDS = ("allgather_reducescatter", "deepep_low_latency", "deepep_high_throughput")
DEFAULT_ALL2ALL_LATENCY_S = 10e-6


def allreduce_collective(hw: HardwareSpec, tp: int, latency_s: float) -> tuple[float, float]:
    """The link rate (B/s) and the fixed seconds of one ring all-reduce over ``tp`` ranks.

    Within a node (``tp <= devices_per_node``): the interconnect's rate and ``latency_s`` (the
    NVLink-class cost of a small collective). A group spanning ``N = ceil(tp / devices_per_node)``
    nodes where the hardware declares a scale-out link: the ring's bytes go at its slowest hop,
    ``scaleout_bandwidth``, and of the ring's ``2 (tp − 1)`` steps the ``2 (N − 1)`` that cross
    a node boundary each add the link's hop latency ``scaleout_latency`` (0 where not given)::

        fixed = latency_s + 2 (N − 1) · scaleout_latency

    That split is NCCL's own ring latency model (NVIDIA/nccl ``src/graph/tuning.cc``,
    ``ncclTopoTuneModel``: ``(nsteps − nInterSteps) · intraLat + nInterSteps · interLat``, with
    ``nsteps = 2 (nRanks − 1)``, ``nInterSteps = 2 (nNodes − 1)`` for an all-reduce): the
    data of a step is forwarded as it arrives, so only the inter-node steps pay the network's
    latency; the intra-node steps are inside ``latency_s``. Without ``scaleout_bandwidth`` a
    group spanning nodes is priced as within one (the behaviour before the scale-out fields).
    """
    if tp <= hw.devices_per_node or hw.scaleout_bandwidth is None:
        return hw.interconnect_bandwidth, latency_s
    nodes = -(-tp // hw.devices_per_node)
    hop = hw.scaleout_latency or 0.0
    return hw.scaleout_bandwidth, latency_s + 2 * (nodes - 1) * hop


class RooflineModel(RooflineStretchPricing):
    """Prices a :class:`StepPlan` from model shapes and a hardware spec (per TP rank).

    Mixture-of-experts cards add, per MoE layer, the router, the shared expert and the routed
    experts as grouped GEMMs over the experts a step actually touches (:meth:`moe_terms`);
    MLA cards price the absorbed decode over the latent cache. Parallelism follows vLLM 0.32:
    ``tensor_parallel_size`` shards attention (and, without ``enable_expert_parallel``, every
    expert); with ``enable_expert_parallel`` each of the ``tp × dp`` ranks holds whole experts.
    With ``data_parallel_size`` > 1 the plan is one DP rank's batch, and the MoE layers see the
    tokens of every DP rank, priced as if each carried the same batch (vLLM steps DP ranks in
    lockstep; the busiest rank's batch is not known to one rank's plan).
    """

    def __init__(self, model: ModelCard, hw: HardwareSpec, *, tensor_parallel_size: int = 1,
                 block_size: int = 16, step_overhead_s: float | None = None,
                 per_output_token_s: float = 0.0,
                 flops_efficiency: float = DEFAULT_FLOPS_EFFICIENCY,
                 bandwidth_efficiency: float = DEFAULT_BANDWIDTH_EFFICIENCY,
                 allreduce_latency_s: float | None = None,
                 curves: EfficiencyCurves | None = None,
                 data_parallel_size: int = 1, enable_expert_parallel: bool = False,
                 all2all_backend: str = "allgather_reducescatter",
                 expert_balancedness: float = 1.0,
                 all2all_latency_s: float = DEFAULT_ALL2ALL_LATENCY_S,
                 frontend_delay_s: float = 0.0, swap_block_bytes: int | None = None):
        """``curves``: price each operation at its class's measured efficiency by size (the
        constant ``flops_efficiency`` / ``bandwidth_efficiency`` are then unused and must be
        left at their defaults); None: constant efficiencies for every operation.
        ``per_output_token_s``: the engine's CPU cost per sequence sampled in a step (its
        inputs, sampling bookkeeping, detokenisation, output shipped to the front end), added
        to the step overhead as a calibrated profile's ``per_output_token_s`` is.
        ``frontend_delay_s``: a constant per-request delay outside the engine steps
        (``latency.frontend_delay_ms``, applied by ``runner.collect`` as a calibrated
        profile's). ``swap_block_bytes``: one swapped block on one rank (the scenario's
        ``ReplicaSpec.model_block_bytes``; by default the card's at ``block_size``)."""
        tp, dp = tensor_parallel_size, data_parallel_size
        check_tensor_parallel(model, tp)
        if not (0 < flops_efficiency <= 1 and 0 < bandwidth_efficiency <= 1):
            raise ValueError("flops_efficiency and bandwidth_efficiency must be in (0, 1]")
        if not 0 < expert_balancedness <= 1:
            raise ValueError("expert_balancedness must be in (0, 1]")
        if not per_output_token_s >= 0:
            raise ValueError("per_output_token_s must be >= 0")
        if all2all_backend not in ALL2ALL_BACKENDS:
            raise ValueError(f"all2all_backend must be one of {ALL2ALL_BACKENDS}")
        ep = tp * dp if enable_expert_parallel else 1
        check_expert_parallel(model, ep)
        self.model, self.hw, self.tp, self.dp, self.ep = model, hw, tp, dp, ep
        self.curves = curves
        self.label = (f"roofline ({hw.name} spec; estimate)" if curves is None else
                      f"roofline ({hw.name} spec, {curves.name} efficiency curves; estimate)")
        self.step_overhead_s = (DEFAULT_STEP_OVERHEAD_S[hw.kind] if step_overhead_s is None
                                else step_overhead_s)
        self.per_output_token_s = float(per_output_token_s)
        self.frontend_delay_s = float(frontend_delay_s)
        if allreduce_latency_s is None:
            allreduce_latency_s = (DEFAULT_ALLREDUCE_LATENCY_S if curves is None
                                   else curves.allreduce_latency_s)
        if curves is not None:             # rates at 100 %: each op divided by its own η
            flops_efficiency = bandwidth_efficiency = 1.0
        flops = hw.peak_flops * flops_efficiency      # achieved FLOP/s
        bw = hw.mem_bandwidth * bandwidth_efficiency  # achieved B/s
        # GEMMs of quantized linears: FP8 (W8A8) on FP8 tensor cores where the device has them
        lin_flops = (hw.fp8_flops if model.fp8_compute else hw.peak_flops) * flops_efficiency
        d, h, L = model.dtype_bytes, model.hidden_size, model.num_layers
        w = model.linear_bytes                               # bytes per linear weight
        kvb = model.kv_bytes                                 # bytes per KV element
        q = model.q_dim // tp                               # query width on this rank
        kv = kv_heads_per_rank(model, tp) * model.head_dim  # K (or V) width on this rank
        i = model.intermediate_size // tp
        H = model.num_heads // tp                            # query heads on this rank

        # Linear ops of one layer: (weight params, activation elements read + written per token)
        if model.is_mla:
            r, lq, lkv = model.qk_rope_head_dim, model.q_lora_rank, model.kv_lora_rank
            qk, v = model.head_dim, model.v_head_dim
            attn_ops = [
                *([(h * lq, h + lq), (lq * H * qk, lq + H * qk)] if lq
                  else [(h * H * qk, h + H * qk)]),            # q_a, q_b (or q) projections
                (h * (lkv + r), h + lkv + r),                   # kv_a (replicated)
                (lkv * H * (model.qk_nope_head_dim + v),        # kv_b = W_UK, W_UV: absorbed
                 2 * H * lkv + H * (model.qk_nope_head_dim + v)),  # into q and the output
                (H * v * h, H * v + h),                         # O projection
            ]
        else:
            attn_ops = [
                (h * (q + 2 * kv), h + q + 2 * kv),  # QKV projection
                (q * h, q + h),                      # O projection
            ]
        if model.mlp == "gated":
            mlp_ops = [(h * 2 * i, h + 2 * i),       # gate and up, fused
                       (i * h, 2 * i + h)]           # SiLU·mul fused into down's input, down
        else:
            mlp_ops = [(h * i, h + i),               # fc1
                       (i * h, 2 * i + h)]           # activation fused into fc2's input, fc2
        # per op: (seconds per token of FLOPs, seconds of weight bytes, seconds per token of
        # activation bytes)
        self._linear = [(2 * p / lin_flops, p * w / bw, a * d / bw)
                        for p, a in attn_ops + mlp_ops]
        self._num_attn_ops = len(attn_ops)
        self._layers = L
        self._linear_at: dict[int, float] = {}   # linear time by tokens in the step (memo)
        self._decode_terms: dict[int, tuple] = {}   # decode_stretch's terms by batch size
        # mixed_step_sum's, by (b, prompt chunk, its cached prefix)
        self._join_terms: dict[tuple[int, int, int], tuple] = {}

        # Attention, all layers together. GQA FLOPs per (query token · attended token):
        # QKᵀ and PV each 2 · head_dim per query head.
        self._attn_flop_s = L * 4 * (model.num_heads // tp) * model.head_dim / flops
        self._kv_tok_s = L * 2 * kv * kvb / bw                  # K+V of one token, all layers
        # q-side per new token: read Q, write the output, write its own K and V
        self._q_tok_s = L * (2 * q * d + 2 * kv * kvb) / bw
        self._dec_flop_s = self._attn_flop_s      # decode path (MLA: absorbed MQA)
        self._ctx_flop_s = 0.0                    # prefill, per context token (MLA: up-proj.)
        # Pointwise ops of one layer (curves only; the constant model folds them into the
        # overhead), bytes per token: two norms (read, write h), two residual adds (read 2h,
        # write h), RoPE (read, write Q and K), the KV write (read K and V, write them to the
        # cache at the KV dtype)
        pw_bytes = (10 * h + 2 * (q + kv)) * d + 2 * kv * (d + kvb)
        if model.is_mla:
            lat, nope, v = model.kv_latent_dim, model.qk_nope_head_dim, model.v_head_dim
            # prefill ("compute friendly", mla_attention.py): MHA with QK width nope + rope,
            # V width v, after up-projecting every context token's latent through kv_b
            self._attn_flop_s = L * 2 * H * (model.head_dim + v) / flops
            self._ctx_flop_s = L * 2 * lkv * H * (nope + v) / flops
            # decode ("data-movement friendly"): MQA over the latent, QK width lkv + rope,
            # V width lkv; reads the latent row once for all heads (not divided by TP)
            self._dec_flop_s = L * 2 * H * (lat + lkv) / flops
            self._kv_tok_s = L * lat * kvb / bw
            self._q_tok_s = L * ((H * lat + H * lkv) * d + lat * kvb) / bw
            # MLA: RoPE on the query's and key's rotary parts, RMSNorms on the two latents,
            # the latent row written to the cache
            pw_bytes = ((10 * h + 2 * (H * r + r) + 2 * (lq + lkv)) * d
                        + lat * (d + kvb))
        self._pw_tok_s = L * pw_bytes / bw
        # fixed device costs of a step: the pointwise ops' launches per layer, an MoE
        # layer's own, and the step's own (graph launch, input copies, sampling)
        self._pw_fixed_s = 0.0 if curves is None else (
            L * curves.pointwise_layer_s + model.moe_layers * curves.moe_layer_s
            + curves.device_step_s)

        # LM head (vocab split across ranks) and sampling over fp32 logits
        vv = model.vocab_size // tp
        self._lm_flop_s = 2 * h * vv / flops
        self._lm_weight_s = h * vv * d / bw
        self._lm_row_s = (h * d + vv * (d + 4)) / bw

        # Two all-reduces per layer (after attention's O and after the MLP's down): ring cost
        # 2 (TP − 1) / TP · bytes / link, plus a fixed latency per collective
        # (allreduce_collective, which prices a group spanning nodes).
        if tp > 1:
            link, fixed = allreduce_collective(hw, tp, allreduce_latency_s)
            self._ar_tok_s = 2 * L * 2 * (tp - 1) / tp * h * d / link
            self._ar_fixed_s = 2 * L * fixed
        else:
            self._ar_tok_s = self._ar_fixed_s = 0.0
        if swap_block_bytes is None:
            swap_block_bytes = kv_block_bytes(model, block_size, tp)
        self._swap_block_s = swap_block_bytes / hw.host_link_bandwidth
        self._kv_heads = kv_heads_per_rank(model, tp)
        self._decode_rows: dict = {}       # decode η by context, per batch size (curves)
        self._curve_sum_prices: dict = {}  # _curve_stretch_sum's prices by batch size
        self._curve_lm_at: dict[int, float] = {}   # _curve_lm_s by rows sampled
        self._prefill_at: dict[tuple[int, int], float] = {}   # _curve_chunk_s by (q, c)
        self._moe = None
        if model.is_moe:
            self._moe = self._moe_setup(model, hw, flops, lin_flops, bw, expert_balancedness,
                                        all2all_backend, all2all_latency_s)
            self.label = self.label[:-1] + f", MoE {_parallel_label(tp, dp, ep)})"

    def _moe_setup(self, m: ModelCard, hw: HardwareSpec, flops: float, lin_flops: float,
                   bw: float, balancedness: float, backend: str, latency_s: float) -> dict:
        """Constants of :meth:`moe_terms` (per MoE layer, this rank)."""
        h, d, E, k = m.hidden_size, m.dtype_bytes, m.num_experts, m.experts_per_token
        tp_e = 1 if self.ep > 1 else self.tp          # an expert's shards: TP without EP
        ie = m.expert_intermediate / tp_e
        si = m.shared_expert_intermediate / self.tp
        link = hw.interconnect_bandwidth
        if self.ep > hw.devices_per_node:
            if hw.scaleout_bandwidth is None:
                raise ConfigError("hardware.scaleout_bandwidth",
                                  f"expert parallelism over {self.ep} devices spans nodes of "
                                  f"{hw.devices_per_node}; {hw.name} gives no scale-out rate")
            link = hw.scaleout_bandwidth
        return dict(
            E=E, k=k, local=E / self.ep, bal=balancedness if self.ep > 1 else 1.0,
            # grouped GEMMs: FLOP seconds per routed token, weight seconds per expert touched,
            # activation seconds per routed token (gate/up then down, as the dense MLP)
            exp_flop_s=2 * 3 * h * ie / lin_flops,
            exp_weight_s=3 * h * ie * m.expert_bytes / bw,
            exp_act_s=(h + 2 * ie + 2 * ie + h) * d / bw,
            # router: a 16-bit GEMM h × E replicated on every rank, over the rank's own tokens
            router=(2 * h * E / flops, m.router_params * d / bw, (h + E) * d / bw),
            shared=((2 * 3 * h * si / lin_flops, 3 * h * si * m.linear_bytes / bw,
                     (h + 4 * si + h) * d / bw) if si else None),
            backend=backend, link=link, latency=latency_s,
        )

    def moe_terms(self, n: int) -> dict[str, float]:
        """Seconds of one MoE layer on this rank for a step of ``n`` tokens (this DP rank's):

        * ``router``: the gate GEMM over the rank's tokens;
        * ``shared``: the shared expert, a dense gated MLP (TP-sharded);
        * ``experts``: grouped GEMMs. The MoE sees ``N = n · DP`` tokens (every DP rank's,
          symmetric load), ``N · top-k`` routed rows, ``a`` of them on the busiest rank: ``N·k
          / EP / balancedness`` (balancedness = mean / max load, 1 = uniform; capped at every
          token picking all the rank's experts). Weight bytes are those of the experts the
          step touches: ``(E / EP) · (1 − (1 − k/E)^N)`` expected under uniform routing
          (balls in bins: few tokens touch few experts, a large step all of them). Time
          ``max(a · FLOPs, touched · weight bytes + a · activation bytes)``;
        * ``all2all``: DP + EP only: ``allgather_reducescatter`` moves every other rank's
          tokens in and the partial outputs back, ``2 · (DP−1)/DP · N · hidden · 2 B``;
          DeepEP sends each routed copy once, FP8 dispatch (``hidden + hidden/128 · 4`` B) and
          bf16 combine (``hidden · 2`` B) per row of the rank's ``n · k``, on NVLink within a
          node and ``scaleout_bandwidth`` beyond; plus a fixed latency per collective.

        With efficiency curves, the router and the shared expert are divided by the GEMM
        curve's η at ``n`` rows (the rank's tokens), the grouped expert GEMMs by its η at the
        rows each touched expert computes (``a / touched``, at least 1: a grouped GEMM is one
        small-M GEMM per expert, not one GEMM of ``a`` rows); the all-to-all is a transfer on
        the link, priced as without curves.
        """
        c = self._moe
        if c is None or not n:
            return dict.fromkeys(("router", "shared", "experts", "all2all"), 0.0)
        big_n = n * self.dp
        a = min(big_n * c["k"] / self.ep / c["bal"], big_n * min(c["k"], c["local"]))
        touched = c["local"] * (1.0 - (1.0 - c["k"] / c["E"]) ** big_n)
        experts = max(a * c["exp_flop_s"], touched * c["exp_weight_s"] + a * c["exp_act_s"])
        fl, ws, act = c["router"]
        router = max(n * fl, ws + n * act)
        shared = 0.0
        if c["shared"]:
            fl, ws, act = c["shared"]
            shared = max(n * fl, ws + n * act)
        if self.curves is not None:
            eta = self.curves.gemm(n)
            router, shared = router / eta, shared / eta
            experts /= self.curves.gemm(max(1.0, a / touched))
        all2all = 0.0
        if self.dp > 1:
            h = self.model.hidden_size
            if c["backend"] == "allgather_reducescatter":
                moved = 2 * (self.dp - 1) / self.dp * big_n * h * 2
            else:
                moved = n * c["k"] * ((h + h / 128 * 4) + h * 2)
            all2all = moved / c["link"] + 2 * c["latency"]
        return {"router": router, "shared": shared, "experts": experts, "all2all": all2all}

    def step_time(self, plan: StepPlan) -> float:
        if plan.is_empty:
            return 0.0
        parts = self._parts(plan) if self.curves is None else self._curve_parts(plan)
        # padded rows are computed and sampled too (plan.as_computed, as _parts prices them)
        t = left_to_right(parts) + self._cpu_s(plan.num_sampled + plan.padding)
        if plan.overlapped_swap_blocks:
            t += self._hidden_swap(plan, t)
        return t + plan.extra_s

    def _cpu_s(self, num_sampled: int) -> float:
        """The engine's CPU time in a step that samples ``num_sampled`` sequences: the step
        overhead, plus ``per_output_token_s`` for each (one term of the step's sum, the same
        value in every path that prices a step)."""
        if self.per_output_token_s:
            return self.step_overhead_s + self.per_output_token_s * num_sampled
        return self.step_overhead_s

    def cpu_s(self, plan: StepPlan) -> float:
        """The engine's CPU time within ``step_time(plan)`` (what async scheduling overlaps
        with the step before): the step overhead and the cost of each sampled row."""
        return 0.0 if plan.is_empty else self._cpu_s(plan.num_sampled + plan.padding)

    def _hidden_swap(self, plan: StepPlan, step_s: float) -> float:
        """What overlapped swaps add to a step of ``step_s`` seconds: their transfer time on
        the host link beyond the step's own (they run on a separate stream alongside)."""
        return max(0.0, plan.overlapped_swap_blocks * self._swap_block_s - step_s)

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
        cpu = self._cpu_s(plan.num_sampled + plan.padding)
        out = {**dict(zip(names, parts)), "overhead": cpu}
        if plan.overlapped_swap_blocks:
            out["swap"] += self._hidden_swap(plan, left_to_right(parts) + cpu)
        return out

    def _linear_s(self, n: int) -> float:
        """The GEMMs of a step of ``n`` tokens, all layers, at the constant efficiency or
        each divided by the GEMM curve's η (memoised: the same few token counts recur step
        after step). An MoE card: attention linears in every layer, the dense MLP in the
        dense layers, the MoE block (with its all-to-all, which occupies the step) in the
        others."""
        linear = self._linear_at.get(n)
        if linear is None:
            linear = 0.0
            if n:
                ops = [max(n * f, ws + n * a) for f, ws, a in self._linear]
                if self.curves is not None:
                    eta = self.curves.gemm(n)
                    ops = [op / eta for op in ops]
                if self._moe is None:
                    for op in ops:
                        linear += op
                    linear *= self._layers
                else:
                    m, k = self.model, self._num_attn_ops
                    moe = sum(self.moe_terms(n).values())
                    linear = (m.num_layers * sum(ops[:k]) + m.dense_layers * sum(ops[k:])
                              + m.moe_layers * moe)
            self._linear_at[n] = linear
        return linear

    def _parts(self, plan: StepPlan) -> tuple[float, float, float, float, float, float]:
        if plan.padding:                   # padded rows: decodes the device computes too
            plan = plan.as_computed()
        if plan.decode_q:
            return self._verify_parts(plan)
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
            flops = pairs * self._attn_flop_s
            if self._ctx_flop_s:          # MLA: every context token's latent up-projected
                flops += kv_toks * self._ctx_flop_s
            prefill = max(flops, kv_toks * self._kv_tok_s + prefill_tokens * self._q_tok_s)

        # decode: each sequence's new token attends ctx + 1 tokens, reading their K and V
        decode = 0.0
        if plan.decode_ctx:
            attended = sum(plan.decode_ctx) + len(plan.decode_ctx)
            decode = max(attended * self._dec_flop_s,
                          attended * self._kv_tok_s + len(plan.decode_ctx) * self._q_tok_s)

        r = plan.num_sampled
        lm_head = max(r * self._lm_flop_s, self._lm_weight_s + r * self._lm_row_s) if r else 0.0
        comm = n * self._ar_tok_s + self._ar_fixed_s if n else 0.0
        return linear, prefill, decode, lm_head, comm, self._swap_s(plan)

    def _swap_s(self, plan: StepPlan) -> float:
        """Swaps on the critical path: every swapped block but those moved alongside the
        compute (``overlapped_swap_blocks``, priced by :meth:`_hidden_swap`)."""
        return (plan.swap_out_blocks + plan.swap_in_blocks - plan.overlapped_swap_blocks) \
            * self._swap_block_s

    def _verify_parts(self, plan: StepPlan) -> tuple[float, float, float, float, float, float]:
        """``_parts`` of a step with speculative verifies: a decode sequence of context c
        feeding q tokens (1 + drafts) is a q-token causal chunk after c cached tokens, on the
        decode kernel (vLLM routes short queries there; MLA: the absorbed path):
        ``q · (c + (q + 1) / 2)`` attended pairs, its K/V (latent) read once; the LM head
        scores every verified position (q rows per sequence)."""
        plain = plan._replace(decode_q=(), decode_ctx=())
        linear, prefill, _, _, _, swap = self._parts(plain)
        n = plan.num_batched_tokens
        linear = self._linear_s(n)
        pairs, kv_toks = self._verify_sizes(plan)
        decode = max(pairs * self._dec_flop_s,
                     kv_toks * self._kv_tok_s + plan.num_decode_tokens * self._q_tok_s)
        r = self._verify_rows(plan)
        lm_head = max(r * self._lm_flop_s, self._lm_weight_s + r * self._lm_row_s) if r else 0.0
        comm = n * self._ar_tok_s + self._ar_fixed_s if n else 0.0
        return linear, prefill, decode, lm_head, comm, swap

    @staticmethod
    def _verify_sizes(plan: StepPlan) -> tuple[float, float]:
        """Attended (query, key) pairs and K/V tokens read by a step's verifies."""
        pairs = kv_toks = 0.0
        for q, c in zip(plan.decode_q, plan.decode_ctx):
            pairs += q * (c + (q + 1) / 2)
            kv_toks += c + q
        return pairs, kv_toks

    @staticmethod
    def _verify_rows(plan: StepPlan) -> int:
        """LM-head rows of a step with verifies: every verified position is scored."""
        return plan.num_sampled + plan.num_decode_tokens - len(plan.decode_ctx)

    # ----------------------------------------------------------------------------------------
    # With efficiency curves: every term is its roofline at 100 % divided by its class's η.
    # Decode-only terms depend on (batch, Σ contexts) alone, which is what lets a stretch be
    # priced without building plans; step_time and the stretches share these helpers, so the
    # values are bit-identical (fast-forward relies on it). The GEMMs (dense, MoE, MLA's
    # projections, FP8 at lin_flops) go through _linear_s, which divides by the GEMM curve.

    def _curve_chunk_s(self, q: int, c: int) -> float:
        """Prefill attention of one chunk of ``q`` tokens after ``c`` cached ones: causal
        pairs q · (c + (q + 1) / 2) (MLA: plus the up-projection of its c + q latents); K, V of
        c + q tokens read; at the prefill curve's η for (q, c)."""
        flops = q * (c + (q + 1) / 2) * self._attn_flop_s
        if self._ctx_flop_s:
            flops += (c + q) * self._ctx_flop_s
        roof = max(flops, (c + q) * self._kv_tok_s + q * self._q_tok_s)
        return roof / self.curves.attn_prefill(q, c)

    def _curve_pointwise_s(self, n: int) -> float:
        return self._pw_fixed_s + n * self._pw_tok_s / self.curves.pointwise_eta if n else 0.0

    def _curve_lm_s(self, r: int) -> float:
        lm = self._curve_lm_at.get(r)
        if lm is None:                     # (memoised by rows: every step prices its LM head)
            lm = self._curve_lm_at[r] = (
                max(r * self._lm_flop_s, self._lm_weight_s + r * self._lm_row_s)
                / self.curves.lm_head(r)) if r else 0.0
        return lm

    def _decode_eta(self, b: int, kv_toks: float) -> float:
        """η of decode attention for ``b`` sequences reading ``kv_toks`` K/V tokens in all:
        the curve at ``b`` × KV heads (sequence, head) pairs and the mean context."""
        row = self._decode_rows.get(b)
        if row is None:                    # η by context at this batch (memo: stretches)
            row = self._decode_rows[b] = self.curves.attn_decode.row(b * self._kv_heads)
        # mean context c = kv_toks / b - 1, on the axis as log2(1 + c) = log2(kv_toks / b);
        # row.at_log2(x) written out (the same operations: _curve_decode_prices does so too)
        xs, ys = row.xs, row.eta
        if len(xs) == 1:
            return ys[0]
        x = math.log2(kv_toks / b)
        if x <= xs[0]:
            i, w = 0, 0.0
        elif x >= xs[-1]:
            i, w = len(xs) - 2, 1.0
        else:
            i = bisect_right(xs, x) - 1
            w = (x - xs[i]) / (xs[i + 1] - xs[i])
        return ys[i] + w * (ys[i + 1] - ys[i])

    def _curve_decode_s(self, b: int, attended: int) -> float:
        """Decode attention of ``b`` sequences attending ``attended`` tokens in all, priced at
        the efficiency of ``b`` × KV heads (sequence, head) pairs at the mean context."""
        if not b:
            return 0.0
        roof = max(attended * self._dec_flop_s, attended * self._kv_tok_s + b * self._q_tok_s)
        return roof / self._decode_eta(b, attended)

    def _curve_parts(self, plan: StepPlan) -> tuple[float, ...]:
        if plan.padding:                   # padded rows: decodes the device computes too
            plan = plan.as_computed()
        n = plan.num_batched_tokens
        prefill = 0.0
        if plan.prefill_lens:
            chunks = self._prefill_at
            for q, c in zip(plan.prefill_lens, plan.prefill_ctx):
                s = chunks.get((q, c))
                if s is None:
                    s = self._curve_chunk_s(q, c)
                    if len(chunks) >= MEMO_MAX:
                        chunks.clear()
                    chunks[q, c] = s
                prefill += s
        b = len(plan.decode_ctx)
        if plan.decode_q:
            # verifies: q-token chunks on the decode kernel (as _verify_parts), at the decode
            # curve's η for b sequences at the mean context they read
            pairs, kv_toks = self._verify_sizes(plan)
            decode = max(pairs * self._dec_flop_s,
                         kv_toks * self._kv_tok_s + plan.num_decode_tokens * self._q_tok_s)
            decode /= self._decode_eta(b, kv_toks)
            lm_head = self._curve_lm_s(self._verify_rows(plan))
        else:
            decode = self._curve_decode_s(b, sum(plan.decode_ctx) + b)
            lm_head = self._curve_lm_s(plan.num_sampled)
        comm = n * self._ar_tok_s + self._ar_fixed_s if n else 0.0
        return (self._linear_s(n), prefill, decode, lm_head, comm, self._swap_s(plan),
                self._curve_pointwise_s(n))

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


def _parallel_label(tp: int, dp: int, ep: int) -> str:
    parts = [f"TP {tp}"] if tp > 1 else []
    if dp > 1:
        parts.append(f"DP {dp}")
    parts.append(f"EP {ep}" if ep > 1 else "experts TP-sharded" if tp > 1 else "1 device")
    return " ".join(parts)
