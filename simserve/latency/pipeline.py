"""A micro-batch's time on each stage of a pipeline-parallel replica (``pipeline_parallel_size``)
and each send between stages, from the base model's breakdown: the formulas and what is
assumed are in docs/latency.md (pipeline stages)."""

from __future__ import annotations

from simserve.cards import HardwareSpec, ModelCard
from simserve.errors import ConfigError
from simserve.kv.capacity import pipeline_layers
from simserve.latency.base import Breakdown, LatencyModel, Pricing
from simserve.latency.roofline import DEFAULT_ALLREDUCE_LATENCY_S
from simserve.sched.plan import StepPlan

# breakdown parts that scale with the layers a stage holds (roofline and profile names)
LAYER_PARTS = frozenset({"linear", "attention_prefill", "attention_decode", "allreduce",
                         "pointwise", "swap", "attn_prefill", "attn_decode", "moe"})
LAST_PARTS = frozenset({"lm_head"})          # the rest (overhead, embedding, ...) on the first


class PipelineLatency:
    """Wraps a latency model with a ``breakdown(plan)`` (roofline, profile): ``stages(plan)``
    gives a micro-batch's time on each stage and each inter-stage send; ``step_time`` is its
    latency through an idle pipeline (their sum)."""

    def __init__(self, base: LatencyModel, model: ModelCard, hw: HardwareSpec, *,
                 pipeline_parallel_size: int,
                 tensor_parallel_size: int = 1,
                 send_latency_s: float = DEFAULT_ALLREDUCE_LATENCY_S):
        if not isinstance(base, Breakdown):
            raise ConfigError("latency.model", "pipeline parallelism splits a step's per-layer "
                                               "costs over stages: use roofline or profile")
        pp, tp = pipeline_parallel_size, tensor_parallel_size
        self.base, self.pp, self.tp = base, pp, tp
        self._base = Pricing.of(base)
        self._breakdown = base.breakdown
        self.label = base.label[:-1] + f", PP {pp})"
        layers = pipeline_layers(model.num_layers, pp)
        self.shares = [n / model.num_layers for n in layers]
        msg = 2 * model.hidden_size * model.dtype_bytes     # hidden states + residual, a token
        self._send_tok_s: list[float] = []
        self._send_fixed_s: list[float] = []
        for j in range(pp - 1):
            link, fixed = hw.interconnect_bandwidth, send_latency_s
            if (j + 1) * tp % hw.devices_per_node == 0:     # stage j + 1 starts a new node
                if hw.scaleout_bandwidth is None:
                    raise ConfigError("hardware.scaleout_bandwidth",
                                      f"pipeline stage {j + 1} starts a new node of "
                                      f"{hw.devices_per_node} devices; {hw.name} gives no "
                                      "scale-out rate between nodes")
                link = hw.scaleout_bandwidth
                if hw.scaleout_latency is not None:     # one hop on the scale-out link
                    fixed = hw.scaleout_latency
            self._send_fixed_s.append(fixed)
            gather = (tp - 1) / tp * msg / hw.interconnect_bandwidth
            self._send_tok_s.append(msg / tp / link + gather)
        self.send_latency_s = send_latency_s
        # a calibrated profile's per-request delay outside the steps (runner.collect)
        self.frontend_delay_s = self._base.frontend_delay_s

    def stages(self, plan: StepPlan) -> tuple[list[float], list[float]]:
        """Seconds of ``plan`` on each stage, and of each send between stages."""
        if plan.is_empty:
            return [0.0] * self.pp, [0.0] * (self.pp - 1)
        parts = self._breakdown(plan)
        layered = first = last = 0.0
        for name, v in parts.items():
            if name in LAYER_PARTS:
                layered += v
            elif name in LAST_PARTS:
                last += v
            else:
                first += v
        times = [share * layered for share in self.shares]
        times[0] += first + plan.extra_s
        times[-1] += last
        n = plan.num_batched_tokens + plan.padding
        sends = [n * s + f for s, f in zip(self._send_tok_s, self._send_fixed_s)]
        return times, sends

    def step_time(self, plan: StepPlan) -> float:
        times, sends = self.stages(plan)
        return sum(times) + sum(sends)

    def cpu_s(self, plan: StepPlan) -> float:
        """The base model's CPU part of ``plan`` (its overhead and per-sequence costs, on the
        first stage): what async scheduling runs ahead of stage 0."""
        return self._base.cpu_s(plan)

    def warnings(self) -> list[str]:
        return self._base.warnings()
