"""The token-budget core every policy is written over.

A policy's ``schedule()`` only decides *who gets how many tokens* this iteration, by calling a
few shared verbs on a :class:`Batch` under construction:

* ``grow(batch, req, n)``      give a running request ``n`` new tokens if its KV blocks fit
* ``grow_or_preempt(...)``     the same, preempting ``preemption_victim`` (a hook) until it fits
* ``preempt(batch, req)``      evict a running request (recompute: back to the waiting head;
                                swap: its blocks to host memory)
* ``admit(batch, req, n)``     move a waiting request to running with ``n`` tokens, while
                                ``may_admit(batch)`` (the shared admission guard)
* ``resume_swapped(batch)``    swap requests back in, oldest first

``complete(plan, t_end)`` is shared: it advances the counters, samples tokens and frees
finished requests (with async scheduling in two halves: ``launch(plan)`` when the step is
scheduled, ``deliver(step, t_end)`` when its output is processed). So static batching, Orca,
vLLM v0/v1 and Sarathi differ only in admission, ordering and clipping rules, each in a short
module.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from heapq import merge
from typing import Any, ClassVar, NamedTuple, cast

from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status
from simserve.sched.spec import Acceptance, SpeculativeConfig


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


class InFlight(NamedTuple):
    """A launched step whose output is not yet delivered (async scheduling)."""

    plan: StepPlan
    entries: list[tuple[Request, int]]      # (request, new tokens), in plan order
    sampled: list[Request]                  # the requests whose token it samples


def done_in_flight(req: Request) -> bool:
    """Its last token is being sampled by a step in flight: vLLM's AsyncScheduler schedules it
    no more (it keeps its blocks and its place in ``running`` until that output is in)."""
    return bool(req.num_pending) and req.num_generated >= req.num_output_tokens


class Scheduler:
    """Queues, the block manager and the shared verbs; subclasses implement ``schedule``."""

    name: ClassVar[str] = ""
    chunked: ClassVar[bool | None] = None   # True/False: fixed by the policy; None: follows config
    reserves_full_length: ClassVar[bool] = False  # KV for prompt + output reserved at admission
    # True if, once a step decodes every running request with no preemption, swap or admission,
    # the same decision repeats for as long as no request finishes or arrives and free KV blocks
    # only shrink: admission can only get harder. The engine then fast-forwards such stretches
    # without calling schedule() (sched/stretch.py). Policies that count steps or use
    # timers must leave it False.
    monotone_admission: ClassVar[bool] = False
    # True if, moreover, with nothing waiting or swapped, a step right after some requests
    # finish decodes every request left (the same decision, minus the finished): a stretch may
    # then run on past a finish (``Stretch.plan(..., past_finish=True)``); and a step
    # after one in which every running request sampled decodes them all: a stretch may then
    # start with a mixed step that ends some prefills.
    continues_past_finish: ClassVar[bool] = False
    # True if the policy says, by ``stretch_admits``, when requests that arrive during a
    # stretch planned past finishes would be admitted whole at the step that first sees them;
    # the solo loop then lets them join the stretch (``Stretch.price``'s ``join``) instead of
    # ending it there
    joins_stretch: ClassVar[bool] = False
    # the policy's knobs (a frozen dataclass read by sched.params.read_params), if it has any
    params_type: ClassVar[type | None] = None
    # KV blocks the engine keeps out of use (vLLM v1's block pool holds block 0 back as its
    # "null block"): the policy's block manager gets num_gpu_blocks minus these
    reserved_blocks: ClassVar[int] = 0
    # True if the policy schedules decodes through the shared verbs (grow, grow_or_preempt,
    # decode_all), which verify speculative drafts (engine.speculative_config)
    speculates: ClassVar[bool] = False
    # True if the engine may hold a step's requests out of the queues while the step is in
    # flight and schedule the next micro-batch from the rest (pipeline parallelism: ``park``)
    pipelines: ClassVar[bool] = False
    # True if, under pipeline parallelism, the policy keeps a micro-batch's requests in
    # ``running`` as vLLM v1's scheduler does instead of being parked: counters advance when
    # the micro-batch is scheduled (``launch``), its output is applied when it is back
    # (``deliver``), and a request waits only while a token it samples is in flight
    # (``held_in_flight``): a prompt's next chunk may be scheduled while its previous chunk is
    # still in flight, and a request in flight may be preempted
    pipeline_launch: ClassVar[bool] = False

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, params: Any = None,
                 seed: int = 0):
        self.limits = limits
        self.blocks = blocks
        self.params = params if params is not None or self.params_type is None \
            else self.params_type()
        self.seed = seed   # root seed of the run, for policies that draw random numbers
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        # what the last completed step did, for the metrics layer's token log: the requests
        # that sampled a token in it, in plan order
        self.sampled: list[Request] = []
        # with speculative decoding, the tokens each of ``sampled`` got (None: one each)
        self.sampled_tokens: list[int] | None = None
        spec = limits.speculative_config
        self.speculative = spec
        self.acceptance = Acceptance(spec, seed) if spec is not None else None
        self._lookahead = spec.lookahead if spec is not None else 0
        # asks the engine to keep every output token's time (tokens.csv, Result.token_times);
        # read when the run starts
        self.record_tokens = False
        self._batch: Batch | None = None
        # requests the last plan schedules for the first time (each with a prefill chunk)
        self.newly_scheduled: list[Request] = []
        # pipeline parallelism: running requests held out of ``running`` while their
        # micro-batch is in flight (``park``); they count against max_num_seqs all the same
        self.num_parked = 0
        self._run_seq = 0
        # the replica's latency model (engine/replica.py binds it), for policies that decide by
        # predicted time (FastServe's time quanta and skip-join); None until bound
        self.latency: Any = None
        # async scheduling, and pipeline parallelism for a policy that ``pipeline_launch``-es:
        # steps launched and not yet delivered (launch/deliver)
        pipelined = limits.pipeline_parallel_size > 1 and self.pipeline_launch
        self.overlap = limits.async_scheduling or pipelined
        # (pipelined, synchronous: a request whose sampled token is in flight is not
        # scheduled at all)
        self.holds_sampled = pipelined and not limits.async_scheduling
        # pipelined with async scheduling (vLLM's AsyncScheduler on its V2 model runner): a
        # request that samples in the step of ``schedule()`` call n may run again from call
        # n + p on (``launch``, ``held_in_flight``); 0: no such rule
        self.decode_stagger = limits.pipeline_parallel_size \
            if pipelined and limits.async_scheduling else 0
        # ``schedule()`` calls so far, an empty schedule's too (vLLM's current_step;
        # ``new_batch`` counts them)
        self.current_step = 0
        self.steps_in_flight = 0

    # -- queue state -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def held_requests(self) -> list[Request]:
        """Every request this scheduler holds, in any queue (what a failure loses)."""
        return [*self.running, *self.waiting, *self.swapped]

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.swapped)

    @property
    def chunks_prefill(self) -> bool:
        return self.limits.enable_chunked_prefill if self.chunked is None else self.chunked

    def schedule(self) -> StepPlan:
        raise NotImplementedError

    # -- shared verbs ----------------------------------------------------------------------
    def grow(self, batch: Batch, req: Request, n: int) -> bool:
        """Schedule ``n`` tokens of a running request if its blocks can grow; no eviction."""
        if self.speculative is not None:
            n = self.verify_tokens(batch, req, n)
        if self.blocks.allocate(req.id, self.slots(req, n)) is None:
            return False
        batch.add(req, n)
        return True

    # -- speculative decoding (sched/spec.py) ----------------------------------------------
    def verify_tokens(self, batch: Batch, req: Request, n: int) -> int:
        """A decode's tokens with speculation: its last sampled token and up to k drafts,
        fewer when the token budget (or max_model_len) runs out, as vLLM clips them."""
        if n != 1 or not req.is_decoding:
            return n
        assert self.speculative is not None     # (called only when speculating)
        drafts = min(self.speculative.k, batch.token_budget - 1)
        if self.limits.max_model_len:
            drafts = min(drafts, self.limits.max_model_len - req.num_tokens)
        return 1 + max(0, drafts)

    def slots(self, req: Request, n: int) -> int:
        """Tokens whose KV a request must hold to compute ``n`` more: with EAGLE/MTP/draft
        proposers, ``k`` lookahead slots beyond them (vLLM's num_lookahead_tokens), capped
        at max_model_len::

            computed | n scheduled (1 + drafts) | lookahead k |
            [x x x x | v d d d                  | l l l       ]   blocks cover all of it
        """
        return self._with_lookahead(req.num_computed_tokens + n)

    def _with_lookahead(self, need: int) -> int:
        if self._lookahead:
            cap = self.limits.max_model_len or need + self._lookahead
            need = max(need, min(need + self._lookahead, cap))
        return need

    def new_batch(self) -> Batch:
        """An empty batch for this step; ``complete`` reads its entries back."""
        self._batch = batch = Batch(self.limits)
        self.newly_scheduled = batch.first_scheduled
        self.current_step += 1
        return batch

    def grow_or_preempt(self, batch: Batch, req: Request, n: int) -> bool:
        """Like ``grow``, but preempts running requests (``preemption_victim`` picks each)
        until the blocks fit. If the victim is ``req`` itself it is not scheduled and False is
        returned.
        """
        if self.speculative is not None:
            n = self.verify_tokens(batch, req, n)
        while self.blocks.allocate(req.id, self.slots(req, n)) is None:
            victim = self.preemption_victim(batch, req)
            self.preempt(batch, victim)
            if victim is req:
                return False
        batch.add(req, n)
        return True

    def preemption_victim(self, batch: Batch, req: Request) -> Request:
        """The running request ``grow_or_preempt`` evicts next (a policy's hook).

        vLLM's rule (v0 ``_schedule_running``, v1 ``schedule``): the last request in the
        running list. Requests already scheduled in this step are never victims (when the
        running list is walked front to back, as in vLLM, the last one never is).
        """
        return next(r for r in reversed(self.running) if r.id not in batch.scheduled)

    def held_in_flight(self, req: Request) -> bool:
        """A running request the step skips for a step in flight (only with ``overlap``).

        Pipelined with async scheduling (``decode_stagger`` p; vLLM 0.32's AsyncScheduler with
        its V2 model runner: ``_update_after_schedule`` in vllm/v1/core/sched/
        async_scheduler.py sets ``next_decode_eligible_step``, ``Scheduler.schedule`` in
        scheduler.py skips a running request before it): also until ``p`` ``schedule()`` calls
        after the last one that made it sample, its output back or not (a decode then runs
        with its previous token still in flight, as under async scheduling); the rule reads
        only the counter, so it also holds back a request preempted and re-admitted since.

        Pipelined (vLLM v1's ``Scheduler.schedule`` under PP, vllm/v1/core/sched/scheduler.py,
        0.32: a scheduled request's ``num_computed_tokens`` advances at once, so one whose
        scheduled tokens reach its ``num_tokens`` asks for 0 new tokens and is skipped until
        the token it samples is back; a chunk that leaves some of the prompt samples nothing,
        and the next chunk is asked for at once): while a token it samples is in flight. With
        async scheduling (AsyncScheduler: output placeholders) only when that token is its last
        (:func:`done_in_flight`)."""
        if self.current_step < req.next_decode_step:
            return True
        return bool(req.num_pending) and (self.holds_sampled
                                          or req.num_generated >= req.num_output_tokens)

    def may_admit(self, batch: Batch) -> bool:
        """The admission guard: someone waits, the step has token and sequence budget left,
        and the running list is below ``max_num_seqs``."""
        return bool(self.waiting) and not batch.full \
            and len(self.running) + self.num_parked < self.limits.max_num_seqs

    def decode_all(self, batch: Batch) -> bool:
        """Give every running request one token, oldest first, evicting the newest on block
        shortage (``grow_or_preempt``'s rule). Returns False if a request preempted itself.

        The common case of vLLM's running loop when every running request is decoding,
        written as one tight loop: a decode needs a new block only once per ``block_size``
        steps, so most iterations are a division and an append.
        """
        if self.speculative is not None:    # every decode a verify: the general path
            return self._decode_all_verifying(batch)
        if self._decode_all_at_once(batch):
            return True
        bs = self.blocks.block_size
        # with named blocks every decode goes through allocate(): a block its token fills
        # becomes cached now, as in vLLM (allocate_slots caches the blocks a step fills)
        held = {} if self.blocks.caches_prefixes else self.blocks.blocks_held
        entries, scheduled, decode_ctx = batch.entries, batch.scheduled, batch.decode_ctx
        i = 0
        running = self.running
        overlap = self.overlap
        while i < len(running):
            if batch.token_budget <= 0 or batch.seq_budget <= 0:
                return True
            req = running[i]
            if overlap and self.held_in_flight(req):
                i += 1
                continue
            c = req.num_computed_tokens
            if req.num_generated == 0 or c + 1 != req.num_prompt_tokens + req.num_generated:
                # not a decode (a prefill in progress): the general path
                n = self.clip(req, req.num_remaining, batch)
                if not self.grow_or_preempt(batch, req, n):
                    return False
            elif -(-(c + 1) // bs) <= held.get(req.id, 0):
                entries.append((req, 1))
                batch.ids.append(req.id)
                batch.new_tokens.append(1)
                scheduled.add(req.id)
                decode_ctx.append(c)
                batch.token_budget -= 1
                batch.seq_budget -= 1
                batch.num_sampled += 1
            elif not self.grow_or_preempt(batch, req, 1):
                return False
            i += 1
        return True

    def _decode_all_verifying(self, batch: Batch) -> bool:
        """``decode_all`` with speculative decoding: each request through
        ``grow_or_preempt`` (which makes a decode a verify of its drafts)."""
        i = 0
        while i < len(self.running):
            if batch.token_budget <= 0 or batch.seq_budget <= 0:
                return True
            req = self.running[i]
            n = 1 if req.is_decoding else self.clip(req, req.num_remaining, batch)
            if not self.grow_or_preempt(batch, req, n):
                return False
            i += 1
        return True

    def _decode_all_at_once(self, batch: Batch) -> bool:
        """``decode_all``'s usual case in a few list passes instead of one branchy loop: the
        budgets cover every running request, every one is decoding, and the new blocks they
        need all fit (so no one is preempted and, a counting block manager being a counter,
        allocating them one by one in order or all at once ends the same). Returns False,
        having changed nothing, if any condition fails."""
        running = self.running
        n = len(running)
        blocks = self.blocks
        if not n or n > batch.token_budget or n > batch.seq_budget or blocks.caches_prefixes \
                or self.speculative is not None or self.overlap:
            return False
        ctx = [r.num_computed_tokens for r in running]
        # each decoding: it has sampled a token and computed all but that one (-1: it has not)
        if ctx != [r.num_prompt_tokens + r.num_generated - 1 if r.num_generated else -1
                   for r in running]:
            return False
        ids = [r.id for r in running]
        if not blocks.grow_decodes(ids, ctx):   # (a running request's blocks hold its ctx)
            return False
        ones = [1] * n
        if batch.entries:
            batch.entries.extend(zip(running, ones))
            batch.ids.extend(ids)
            batch.new_tokens.extend(ones)
            batch.scheduled.update(ids)
            batch.decode_ctx.extend(ctx)
        else:   # (the usual: the step's first verb) the lists just made become the batch's
            batch.entries = list(zip(running, ones))
            batch.ids, batch.new_tokens, batch.decode_ctx = ids, ones, ctx
            batch.scheduled = set(ids)
        batch.token_budget -= n
        batch.seq_budget -= n
        batch.num_sampled += n
        return True

    def preempt(self, batch: Batch, req: Request) -> None:
        self.running.remove(req)
        req.num_preemptions += 1
        batch.num_preempted += 1
        if self.limits.preemption_mode == "swap":
            moved = self.blocks.swap_out(req.id)
            if moved is not None:
                req.status = Status.SWAPPED
                self.swapped.append(req)
                batch.swap_out_blocks += moved
                return
        # recompute (or swap space full): drop the KV and start over from the waiting head
        self.blocks.free(req.id)
        req.num_computed_tokens = 0
        # (async scheduling: a token its step in flight samples is still delivered, so it
        # stays in num_generated, but it is no longer this request's pending output; it
        # waits until that step drains: ``stale``)
        req.num_pending = 0
        req.status = Status.WAITING
        self.waiting.appendleft(req)

    def admit(self, batch: Batch, req: Request, n: int, reserve_tokens: int | None = None,
              gate_tokens: int | None = None) -> bool:
        """Waiting head → running with ``n`` new tokens, if its blocks fit (no eviction).

        With prefix caching the request first takes its cached prefix: it starts with
        ``num_computed_tokens`` = the cached tokens, and ``n`` is cut to what is left.
        ``reserve_tokens`` allocates blocks for that many tokens at once (full-length
        reservation); ``gate_tokens`` only checks that blocks for that many could be held now
        (vLLM v1's ``scheduler_reserve_full_isl``) and allocates for ``n``.
        """
        if self.blocks.caches_prefixes:
            return self._admit_cached(batch, req, n, reserve_tokens, gate_tokens)
        need = reserve_tokens if reserve_tokens is not None else self.slots(req, n)
        if gate_tokens is not None and not self.blocks.can_hold(req.id, gate_tokens):
            return False
        if self.blocks.allocate(req.id, need) is None:
            return False
        self.waiting.popleft()
        self._join(req)
        batch.add(req, n)
        return True

    def cached_prefix(self, req: Request) -> int:
        """Tokens at the start of a waiting request already in the prefix cache (0 without
        prefix caching): what admitting it now would start it with."""
        if not self.blocks.caches_prefixes:
            return 0
        blocks = cast(PrefixBlockManager, self.blocks)
        blocks.register(req.id, req.num_prompt_tokens, req.spec.hash_ids)
        return blocks.cached_tokens(req.id, req.num_tokens)

    def _admit_cached(self, batch: Batch, req: Request, n: int, reserve_tokens: int | None,
                      gate_tokens: int | None) -> bool:
        blocks = self.blocks
        cached = self.cached_prefix(req)
        n = min(n, req.num_tokens - cached)
        need = max(reserve_tokens or 0, self._with_lookahead(cached + n))
        if gate_tokens is not None and not blocks.can_hold(req.id, gate_tokens, cached):
            return False
        # a cached prefix implies the prefix-caching block manager (cached_prefix)
        if (cast(PrefixBlockManager, blocks).allocate_cached(req.id, need, cached) if cached
                else blocks.allocate(req.id, need)) is None:
            return False
        if req.num_preemptions == 0:
            req.num_cached_tokens = cached
        req.num_computed_tokens = cached
        # prefix blocks loaded from a host tier (KV offload): moved in this step
        batch.swap_in_blocks += blocks.take_loaded()
        self.waiting.popleft()
        self._join(req)
        batch.add(req, n)
        return True

    def stretch_admits(self, prompts: list[int], decoding: int) -> bool:
        """With ``joins_stretch``: True if ``schedule()``, at a step where the ``decoding``
        running requests all decode and nothing else is running, swapped or waiting but
        requests that just arrived (in that order, none with anything computed) whose prompts
        past their cached prefixes are ``prompts`` tokens, would admit every one of them with
        all of those, KV blocks aside (the stretch makes sure of those:
        ``Stretch.join_hits``)."""
        raise NotImplementedError

    def admission_order(self, specs: list[Any]) -> list[Any]:
        """With ``joins_stretch``: the requests ``specs``, arriving at once to an empty waiting
        queue, in the order ``schedule()`` would admit them (arrival order unless the policy
        orders its queue)."""
        return specs

    def admits_whole(self, prompts: list[int], decoding: int, threshold: int) -> bool:
        """``stretch_admits`` for a policy that, after the ``decoding`` decodes, admits the
        waiting head while ``may_admit`` allows, each with its prompt cut to ``threshold``
        (0: none) and the token budget left (``clip``): all of ``prompts`` come in whole if
        no cut falls on any of them and the budgets and ``max_num_seqs`` hold them all (a
        prompt cut, and those behind it find the budget spent: they do not all join)."""
        limits = self.limits
        budget = limits.max_num_batched_tokens - decoding
        seqs = limits.max_num_seqs - decoding
        for p in prompts:
            if budget <= 0 or seqs <= 0 or 0 < threshold < p or p > budget:
                return False
            budget -= p
            seqs -= 1
        return True

    def join_stretch(self, req: Request, n: int, start: float) -> int:
        """Admit the waiting head ``req`` with its ``n`` prompt tokens at a stretch's step
        starting at ``start`` (``stretch_admits`` said ``schedule()`` would); the KV blocks
        it holds then. Its counters, and those blocks, are the stretch's to apply
        (``Stretch.apply``: the block manager still holds the blocks of members that finished
        before this step)."""
        assert self.waiting[0] is req
        self.waiting.popleft()
        self._join(req)
        req.first_scheduled_s = start
        return self.blocks.blocks_for(self.slots(req, n))

    def _join(self, req: Request) -> None:
        """A request joins the end of the running list."""
        req.status = Status.RUNNING
        req.run_seq = self._run_seq
        self._run_seq += 1
        self.running.append(req)

    # -- pipeline parallelism: micro-batches in flight -------------------------------------
    def park(self) -> Batch:
        """Hold the last plan's requests out of ``running`` while its micro-batch is in flight
        (they are not scheduled again until its output returns: ``unpark``), as Sarathi-Serve's
        pipeline engine does for every policy it runs (policies without ``pipeline_launch``).
        Returns the batch, which ``unpark`` takes back. The requests still count against
        ``max_num_seqs`` and are never preemption victims (a deviation: Sarathi-Serve's
        schedulers may preempt a sequence still executing, ``base_sequence_manager.py``)."""
        batch = self._batch
        assert batch is not None and batch.plan is not None
        ids = batch.scheduled
        before = len(self.running)
        self.running = [r for r in self.running if r.id not in ids]
        assert before - len(self.running) == len(batch.entries)   # every entry was running
        self.num_parked += len(batch.entries)
        self._batch = None
        return batch

    def unpark(self, batch: Batch) -> None:
        """A parked micro-batch's output is back: its requests rejoin ``running`` at their
        places (by the order they joined it), and ``complete(batch.plan, t)`` applies it."""
        self.num_parked -= len(batch.entries)
        back = sorted((req for req, _ in batch.entries), key=_run_seq)
        self.running = list(merge(self.running, back, key=_run_seq))
        self._batch = batch

    def resume_swapped(self, batch: Batch) -> None:
        """Swap requests back in, oldest first, while blocks and budgets allow."""
        while self.swapped and not batch.full:
            req = self.swapped[0]
            need = self.blocks.swapped_blocks(req.id)
            if need > self.blocks.num_free or \
                    len(self.running) + self.num_parked >= self.limits.max_num_seqs:
                return
            n = self.joining_tokens(req, req.num_remaining, batch)
            if n is None:
                return
            moved = self.blocks.swap_in(req.id)
            assert moved is not None
            batch.swap_in_blocks += moved
            self.swapped.popleft()
            self._join(req)
            if n and self.blocks.allocate(req.id, req.num_computed_tokens + n) is not None:
                batch.add(req, n)

    def joining_tokens(self, req: Request, n: int, batch: Batch) -> int | None:
        """Tokens a request joining the batch (admitted, or swapped back in) gets of the ``n``
        it needs: clipped to the threshold and the budget; None if that would cut its prefill
        and the policy does not chunk (it waits)."""
        clipped = self.clip(req, n, batch)
        return None if clipped < n and not self.chunks_prefill else clipped

    def clip(self, req: Request, n: int, batch: Batch) -> int:
        """Cap a request's new tokens by the long-prefill threshold and the budget left."""
        threshold = self.limits.long_prefill_token_threshold
        if 0 < threshold < n:
            n = threshold
        return max(0, min(n, batch.token_budget))

    # -- async scheduling: a step in two halves ---------------------------------------------
    def launch(self, plan: StepPlan) -> InFlight:
        """The half of ``complete`` that happens when a step is scheduled, with async
        scheduling (vLLM's ``_update_after_schedule`` and AsyncScheduler's output
        placeholders): counters advance now, so the next ``schedule()`` can run while this step
        computes. A request whose catch-up this step completes counts the token it will sample
        in ``num_generated`` at once and as ``num_pending`` until ``deliver``::

            schedule n+1 ─ launch n+1 ─┐            (step n on the device)
                                        deliver n ─ schedule n+2 ─ launch n+2 ─┐
                                                       (step n+1 on the device)  deliver n+1

        Returns what ``deliver`` needs: the step's requests, and those it samples.
        """
        entries = self._entries(plan)
        sampled: list[Request] = []
        stagger = self.decode_stagger
        for req, n in entries:
            req.num_computed_tokens += n
            req.num_in_flight += 1
            if req.num_computed_tokens == req.num_prompt_tokens + req.num_generated:
                req.num_generated += 1
                req.num_pending += 1
                sampled.append(req)
                self._cache_limit(req)
                if stagger:     # pipelined async: again from schedule() call n + p on
                    req.next_decode_step = self.current_step + stagger
        self.steps_in_flight += 1
        return InFlight(plan, entries, sampled)

    def deliver(self, step: InFlight, t_end: float) -> list[Request]:
        """The other half: the step's output is processed at ``t_end`` (vLLM's
        ``update_from_output``). Every token it sampled reaches the client now, a preempted
        request's too (its *stale* output, which it waited for); a request whose last token it
        was finishes and frees its blocks only now, so the step scheduled meanwhile did not see
        them free. Returns the finished requests (``sampled`` lists the tokens' owners)."""
        self.steps_in_flight -= 1
        for req, _ in step.entries:
            req.num_in_flight -= 1
        self.sampled = step.sampled
        finished: list[Request] = []
        blocks = self.blocks
        prefix = blocks if isinstance(blocks, PrefixBlockManager) else None
        for req in step.sampled:
            if req.status is Status.RUNNING:
                req.num_pending -= 1
                if prefix is not None:   # AsyncScheduler caches the blocks its output fills
                    self._cache_limit(req)
                    prefix.cache_upto(req.id, req.num_computed_tokens - req.num_pending)
            if req.num_generated >= req.num_output_tokens and not req.num_pending:
                finished.append(req)
        self.retire(finished, t_end)
        return finished

    def _cache_limit(self, req: Request) -> None:
        """With prefix caching, the tokens of ``req`` whose blocks may become cached: those
        sampled and delivered (vLLM caches up to ``request.num_tokens``, which has no
        placeholders)."""
        blocks = self.blocks
        if isinstance(blocks, PrefixBlockManager):
            blocks.limit_cache(req.id, req.num_tokens - req.num_pending if req.num_pending
                               else None)

    def batch_entries(self, plan: StepPlan) -> list[tuple[Request, int]]:
        """The requests of ``plan`` (the plan ``schedule()`` just made, or one of
        ``running``'s) and their new tokens, in plan order."""
        return self._entries(plan)

    def _entries(self, plan: StepPlan) -> list[tuple[Request, int]]:
        """The plan's requests and their new tokens (the batch's, if ``plan`` is its)."""
        batch = self._batch
        if batch is not None and batch.plan is plan:
            return batch.entries
        by_id = {r.id: r for r in self.running}
        return [(by_id[rid], n) for rid, n in zip(plan.request_ids, plan.num_new_tokens)]

    # -- after the step --------------------------------------------------------------------
    def complete(self, plan: StepPlan, t_end: float) -> list[Request]:
        """Advance counters for ``plan``, sample tokens at ``t_end``; return finished requests
        (``sampled`` lists every request that sampled a token)."""
        finished: list[Request] = []
        entries = self._entries(plan)
        self.sampled = sampled = []
        if self.acceptance is not None:
            return self._complete_verifying(entries, t_end)
        for req, n in entries:
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_prompt_tokens + req.num_generated:
                req.num_generated += 1
                sampled.append(req)
                if req.num_generated == req.num_output_tokens:
                    finished.append(req)
        self.retire(finished, t_end)
        return finished

    def _complete_verifying(self, entries: list[tuple[Request, int]],
                            t_end: float) -> list[Request]:
        """``complete`` with speculative decoding. A decode that fed ``1 + d`` tokens accepts
        ``a <= d`` drafts (sched/spec.py): its KV keeps ``1 + a`` of them (the rejected drafts'
        slots are rolled back, their blocks kept), and it outputs ``a + 1`` tokens, trimmed
        at its output length (vLLM's stop check after each token)."""
        finished: list[Request] = []
        sampled, counts = self.sampled, []
        accept = self.acceptance
        assert accept is not None               # (set whenever speculating)
        for req, n in entries:
            computed = req.num_computed_tokens
            if req.num_generated and computed + 1 == req.num_prompt_tokens + req.num_generated:
                drafts = n - 1
                a = accept.accepted(req.id, computed, drafts) if drafts else 0
                if drafts:
                    req.num_drafts += 1
                    req.num_draft_tokens += drafts
                    req.num_accepted_tokens += a
                    if a:
                        per = req.accepted_per_position
                        if per is None:
                            assert self.speculative is not None
                            per = req.accepted_per_position = [0] * self.speculative.k
                        for i in range(a):
                            per[i] += 1
                req.num_computed_tokens = computed + 1 + a
                out = min(a + 1, req.num_output_tokens - req.num_generated)
            else:
                req.num_computed_tokens = computed + n
                if req.num_computed_tokens != req.num_prompt_tokens + req.num_generated:
                    continue
                out = 1
            req.num_generated += out
            sampled.append(req)
            counts.append(out)
            if req.num_generated >= req.num_output_tokens:
                finished.append(req)
        self.sampled_tokens = counts
        self.retire(finished, t_end)
        return finished

    def retire(self, finished: list[Request], t: float | None) -> None:
        """Free finished requests, each done at its last token's time ``t`` (None: the caller
        set ``finish_s``)."""
        if self.overlap and any(r.status is not Status.RUNNING for r in finished):
            # a request preempted while its last token was in flight: that token finished it
            # in the waiting queue (vLLM's stopped_preempted_reqs)
            gone = {id(r) for r in finished if r.status is not Status.RUNNING}
            self.waiting = deque(r for r in self.waiting if id(r) not in gone)
            finished_running = [r for r in finished if id(r) not in gone]
        else:
            finished_running = finished
        if len(finished_running) == 1:
            self.running.remove(finished_running[0])
        elif finished_running:
            done = {id(r) for r in finished_running}
            self.running = [r for r in self.running if id(r) not in done]
        for req in finished:
            self.blocks.release(req.id)
            req.status = Status.FINISHED
            if t is not None:
                req.finish_s = t


def _run_seq(req: Request) -> int:
    return req.run_seq
