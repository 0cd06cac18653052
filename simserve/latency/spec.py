"""The drafter's cost in a speculative-decoding step (issue #18), added to the target's.

vLLM's EAGLE/MTP/draft-model proposers (``v1/spec_decode/llm_base_proposer.py``) run, after
the target's forward, one drafter forward over the step's scheduled tokens (it keeps the
drafter's KV in sync and proposes each sampled request's first draft), then ``k − 1``
single-token passes for every request that sampled, each scoring the LM head::

    draft(step) = drafter(step's tokens) + (k − 1) · drafter(one token per sampled request)

priced by a roofline of the drafter's card (labelled: no profile measures a drafter). The
drafter cards are assumptions where no head is published: EAGLE/EAGLE3 one dense decoder
layer of the target's shapes (the speculators docs: one Llama-style layer) at 16 bits, MTP
one layer of the target itself, ``draft_model`` the card named. n-gram proposing costs 0.
"""

from __future__ import annotations

from dataclasses import replace

from simserve.cards import HardwareSpec, ModelCard, load_model, serving_card
from simserve.latency.base import LatencyModel, Pricing
from simserve.sched.plan import StepPlan
from simserve.sched.spec import SpeculativeConfig


def drafter_card(target: ModelCard, cfg: SpeculativeConfig, path: str = "engine.speculative_config"
                 ) -> ModelCard | None:
    """The card the drafter is priced with (None: n-gram, no model)."""
    if cfg.method == "ngram":
        return None
    if cfg.method == "draft_model":
        card = load_model(cfg.model, f"{path}.model")
        return serving_card(card, None, target.kv_cache_dtype)
    if cfg.method == "mtp":
        return replace(target, name=f"{target.name} MTP layer", num_layers=1,
                       first_dense_layers=0)
    # EAGLE / EAGLE3 head: one dense layer of the target's attention and dense MLP shapes
    return replace(target, name=f"{target.name} EAGLE head (assumed 1 dense layer)",
                   num_layers=1, num_experts=0, experts_per_token=0, expert_intermediate=0,
                   shared_expert_intermediate=0, first_dense_layers=0, expert_bias=False,
                   router_bias=False, expert_weight_dtype=None, weight_dtype=None,
                   quantization=None)


def drafter_weight_bytes(drafter: ModelCard, cfg: SpeculativeConfig, tp: int) -> float:
    """The drafter's weights on one rank. EAGLE heads and MTP modules share the target's
    embedding and LM head (DeepSeek-V3's MTP: "excluding the shared 0.9B Embedding and 0.9B
    output Head"), so only their layer counts; a draft model brings its own."""
    total = drafter.weight_bytes_per_rank(tp)
    if cfg.method == "draft_model":
        return total
    shared = drafter.embedding_params * (1 if drafter.tie_word_embeddings else 2)
    return total - shared * drafter.dtype_bytes / tp


class SpeculativeLatency:
    """A latency model plus the drafter's cost of each step. It offers the base model's CPU
    part, front-end delay, warnings and breakdown (plus ``draft``), never its stretch pricing
    (a speculative replica steps: sched/stretch.py)."""

    def __init__(self, base: LatencyModel, cfg: SpeculativeConfig, target: ModelCard,
                 hw: HardwareSpec, *, tensor_parallel_size: int = 1, block_size: int = 16,
                 **roofline_kw):
        from simserve.latency.roofline import RooflineModel
        self.base, self.cfg = base, cfg
        self._base = Pricing.of(base)
        card = drafter_card(target, cfg)
        curves = roofline_kw.get("curves")
        if curves is not None and curves.device_step_s:
            # a step's fixed device time (graph launch, input copies, sampling) is the
            # engine step's, paid once by the target's pricing: the drafter's passes run
            # inside that step
            roofline_kw["curves"] = replace(curves, device_step_s=0.0)
        self.drafter = None if card is None else RooflineModel(
            card, hw, tensor_parallel_size=tensor_parallel_size, block_size=block_size,
            step_overhead_s=0.0, **roofline_kw)
        what = "n-gram" if card is None else f"{cfg.method} drafter on the roofline"
        self.label = f"{base.label} + {what} (k={cfg.k})"

    @property
    def frontend_delay_s(self) -> float:
        """The target model's per-request front-end delay (runner.frontend_delays)."""
        return self._base.frontend_delay_s

    def cpu_s(self, plan: StepPlan) -> float:
        """The target engine's CPU part of the step (the drafter's is priced with none)."""
        return self._base.cpu_s(plan)

    def step_time(self, plan: StepPlan) -> float:
        t = self.base.step_time(plan)
        return t + self.draft_s(plan) if t else t

    def draft_s(self, plan: StepPlan) -> float:
        """Seconds of the drafter in this step (0 for n-gram or a step that samples nothing)."""
        if self.drafter is None or plan.is_empty or not plan.num_sampled:
            return 0.0
        first = self.drafter.step_time(plan._replace(extra_s=0.0, swap_in_blocks=0,
                                                     swap_out_blocks=0,
                                                     overlapped_swap_blocks=0))
        if self.cfg.k == 1:
            return first
        # one token per sampled request: decodes at their context after this step's tokens,
        # requests finishing a prefill chunk at the chunk's end (the last ones scheduled)
        q = plan.decode_q or (1,) * len(plan.decode_ctx)
        ctx = [c + n for c, n in zip(plan.decode_ctx, q)]
        chunks = [c + n for c, n in zip(plan.prefill_ctx, plan.prefill_lens)]
        extra = plan.num_sampled - len(ctx)
        ctx += chunks[len(chunks) - extra:] if extra > 0 else []
        rows = tuple(ctx[:plan.num_sampled])
        one = StepPlan(tuple(range(len(rows))), (1,) * len(rows), (), (), rows, len(rows))
        return first + (self.cfg.k - 1) * self.drafter.step_time(one)

    def breakdown(self, plan: StepPlan) -> dict[str, float]:
        if self._base.breakdown is None:
            raise TypeError(f"{self.base.label} gives no breakdown of a step")
        parts = dict(self._base.breakdown(plan))
        parts["draft"] = self.draft_s(plan)
        return parts

    def warnings(self) -> list[str]:
        return self._base.warnings()
