"""The engine knobs a scheduler obeys (``SchedulerLimits``) and the step under construction
(``Batch``): what every policy's ``schedule()`` fills and freezes into a StepPlan."""

from __future__ import annotations

from dataclasses import dataclass

from simserve.sched.plan import StepPlan
from simserve.sched.request import Request
from simserve.sched.spec import SpeculativeConfig


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The engine knobs a scheduler obeys (vLLM names and meanings)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool
    long_prefill_token_threshold: int = 0   # 0 = no per-request cap on a prefill chunk
    preemption_mode: str = "recompute"       # recompute | swap
    max_model_len: int = 0                   # 0 = not given (only vllm_native needs it)
    # vLLM v1's scheduler_reserve_full_isl: admit a waiting request only if KV blocks for its
    # whole sequence so far (prompt, plus output before a preemption) are free, not just for
    # its first chunk (read by the vLLM v1 policies)
    reserve_full_sequence: bool = False
    # speculative decoding (#18; sched/spec.py): k drafts verified per decode, KV lookahead
    speculative_config: SpeculativeConfig | None = None
    # vLLM's async scheduling: the engine schedules the next step while this one runs
    # (``Scheduler.launch``/``deliver``; engine/loops.py's batch queue, depth 2)
    async_scheduling: bool = False
    # pipeline parallelism: micro-batches in flight (engine/pipeline.py); a policy that
    # ``pipeline_launch``-es holds them in ``running`` with ``launch``/``deliver``
    pipeline_parallel_size: int = 1

    @property
    def batch_queue_depth(self) -> int:
        """Steps the async engine keeps in flight (vLLM's ``max_concurrent_batches``): 2 with
        async scheduling, else 1 (schedule, run, apply). A pipelined replica's queue is as deep
        as its stages, one more with async scheduling (``pipeline_queue_depth``)."""
        return 2 if self.async_scheduling else 1

    @property
    def pipeline_queue_depth(self) -> int:
        """A pipelined replica's batch queue (vLLM's ``max_concurrent_batches``,
        vllm/config/vllm.py, 0.32): ``p`` micro-batches, ``p + 1`` with async scheduling (which
        vLLM runs with PP on its V2 model runner only)."""
        p = self.pipeline_parallel_size
        return p + 1 if self.async_scheduling and p > 1 else p


class Batch:
    """A StepPlan under construction: the token budget and sequence count left.

    Entries are classified as they are added (a decode feeds back exactly its last sampled
    token; anything else is a prefill chunk), so ``freeze`` only packs tuples.
    """

    __slots__ = ("token_budget", "seq_budget", "entries", "ids", "new_tokens", "scheduled",
                 "prefills", "first_scheduled", "plan", "num_preempted", "swap_out_blocks",
                 "swap_in_blocks", "overlapped_swap_blocks", "prefill_lens", "prefill_ctx",
                 "decode_ctx", "num_sampled", "decode_q")

    def __init__(self, limits: SchedulerLimits):
        self.token_budget = limits.max_num_batched_tokens
        self.seq_budget = limits.max_num_seqs
        self.entries: list[tuple[Request, int]] = []
        self.ids: list[int] = []               # the entries' request ids and new tokens,
        self.new_tokens: list[int] = []        # kept as they are added (freeze packs them)
        self.scheduled: set[int] = set()
        self.prefills: list[tuple[Request, int]] = []   # the entries that are prefill chunks
        self.first_scheduled: list[Request] = []        # requests scheduled for the first time
        self.plan: StepPlan | None = None
        self.num_preempted = 0
        self.swap_out_blocks = 0
        self.swap_in_blocks = 0
        self.overlapped_swap_blocks = 0     # of those, moved alongside the step's compute
        self.prefill_lens: list[int] = []
        self.prefill_ctx: list[int] = []
        self.decode_ctx: list[int] = []
        self.num_sampled = 0
        # with speculative decoding: each decode's query tokens (1 + drafts); None without
        self.decode_q: list[int] | None = [] if limits.speculative_config else None

    def add(self, req: Request, n: int) -> None:
        self.entries.append((req, n))
        self.ids.append(req.id)
        self.new_tokens.append(n)
        self.scheduled.add(req.id)
        self.token_budget -= n
        self.seq_budget -= 1
        computed = req.num_computed_tokens
        num_tokens = req.num_prompt_tokens + req.num_generated
        if req.num_generated and computed + 1 == num_tokens and (
                n == 1 or self.decode_q is not None):   # a decode (a verify: 1 + drafts)
            self.decode_ctx.append(computed)
            if self.decode_q is not None:
                self.decode_q.append(n)
                self.num_sampled += 1
                return
        else:
            self.prefill_lens.append(n)
            self.prefill_ctx.append(computed)
            self.prefills.append((req, n))
            if req.first_scheduled_s is None:   # (a first scheduling is always a prefill)
                self.first_scheduled.append(req)
        if computed + n == num_tokens:
            self.num_sampled += 1

    @property
    def full(self) -> bool:
        return self.token_budget <= 0 or self.seq_budget <= 0

    def freeze(self) -> StepPlan:
        self.plan = StepPlan(   # (positional: the order of StepPlan's fields)
            tuple(self.ids), tuple(self.new_tokens), tuple(self.prefill_lens),
            tuple(self.prefill_ctx), tuple(self.decode_ctx), self.num_sampled,
            self.swap_out_blocks, self.swap_in_blocks, self.num_preempted, 0.0,
            tuple(self.decode_q) if self.decode_q is not None else (), 0,
            self.overlapped_swap_blocks)
        return self.plan
