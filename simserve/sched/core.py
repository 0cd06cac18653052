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
finished requests (with async scheduling in two halves, ``launch`` and ``deliver``:
sched/inflight.py). Policies differ only in admission, ordering and clipping rules, each in a
short module, and in what they declare they are (``facts``: sched/facts.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar, cast

from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.sched.batch import Batch, SchedulerLimits
from simserve.sched.facts import PolicyFacts
from simserve.sched.inflight import StepsInFlight
from simserve.sched.joining import StretchAdmission
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status
from simserve.sched.spec import Acceptance
from simserve.sched.verify import Verifying


class Scheduler(StepsInFlight, Verifying, StretchAdmission):
    """Queues, the block manager and the shared verbs; subclasses implement ``schedule``. The
    verbs of steps in flight, speculative verifies and stretch joins are in their own modules
    (inflight.py, verify.py, joining.py)."""

    name: ClassVar[str] = ""
    # what the policy is (sched/facts.py): what the engine may do with it, what config checks
    facts: ClassVar[PolicyFacts] = PolicyFacts()

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, params: Any = None,
                 seed: int = 0):
        self.limits = limits
        self.blocks = blocks
        params_type = self.facts.params_type
        self.params = params if params is not None or params_type is None else params_type()
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
        # True when the loop adds arrivals at step ends, after completing the step they came
        # in (the solo loop), where stepping adds each when it comes
        self.adds_at_step_end = False
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
        pipelined = limits.pipeline_parallel_size > 1 and self.facts.pipeline_launch
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
        chunked = self.facts.chunked
        return self.limits.enable_chunked_prefill if chunked is None else chunked

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
        blocks = self.blocks
        bs = blocks.block_size
        # with named blocks a decode whose token fills a block goes through allocate(): the
        # block becomes cached now, as in vLLM (allocate_slots caches the blocks a step fills)
        keyed: Mapping[int, int] | None = None
        held: Mapping[int, int]
        if isinstance(blocks, PrefixBlockManager):
            held, keyed = blocks.decode_views()
        else:
            held = blocks.blocks_held
        entries, scheduled, decode_ctx = batch.entries, batch.scheduled, batch.decode_ctx
        i = 0
        running = self.running
        overlap = self.overlap
        step, holds = self.current_step, self.holds_sampled
        while i < len(running):
            if batch.token_budget <= 0 or batch.seq_budget <= 0:
                return True
            req = running[i]
            # (held_in_flight, inline: the step is scheduled while one is in flight)
            if overlap and (step < req.next_decode_step or req.num_pending and (
                    holds or req.num_generated >= req.num_output_tokens)):
                i += 1
                continue
            c = req.num_computed_tokens
            if req.num_generated == 0 or c + 1 != req.num_prompt_tokens + req.num_generated:
                # not a decode (a prefill in progress): the general path
                n = self.clip(req, req.num_remaining, batch)
                if not self.grow_or_preempt(batch, req, n):
                    return False
            elif -(-(c + 1) // bs) <= held.get(req.id, 0) and (
                    keyed is None or (c + 1) // bs <= keyed.get(req.id, 0)):
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


    def _decode_all_at_once(self, batch: Batch) -> bool:
        """``decode_all``'s usual case in a few list passes instead of one branchy loop: the
        budgets cover every running request, every one is decoding, and the new blocks they
        need all fit (so no one is preempted, and allocating them all at once ends as one by
        one in order: a counting block manager is a counter, and one with named blocks
        allocates them in running order, ``grow_decodes``). Returns False, having changed
        nothing, if any condition fails."""
        running = self.running
        if self.overlap:
            # a step in flight (async scheduling): the requests it skips (held_in_flight) are
            # left out, as the loop passes over them. Only where the rule is done_in_flight's
            # alone: not pipelined (a held sampled token, a decode stagger)
            if self.holds_sampled or self.decode_stagger:
                return False
            running = [r for r in running
                       if not (r.num_pending and r.num_generated >= r.num_output_tokens)]
        n = len(running)
        blocks = self.blocks
        if not n or n > batch.token_budget or n > batch.seq_budget \
                or self.speculative is not None:
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




    def _join(self, req: Request) -> None:
        """A request joins the end of the running list."""
        req.status = Status.RUNNING
        req.run_seq = self._run_seq
        self._run_seq += 1
        self.running.append(req)



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

