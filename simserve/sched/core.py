"""The token-budget core every policy is written over.

A policy's ``schedule()`` only decides *who gets how many tokens* this iteration, by calling a
few shared verbs on a :class:`Batch` under construction:

* ``grow(batch, req, n)``      give a running request ``n`` new tokens if its KV blocks fit
* ``preempt(batch, req)``      evict a running request (recompute: back to the waiting head;
                                swap: its blocks to host memory)
* ``admit(batch, req, n)``     move a waiting request to running with ``n`` tokens
* ``resume_swapped(batch)``    swap requests back in, oldest first

``complete(plan, t_end)`` is shared: it advances the counters, samples tokens and frees
finished requests. So static batching, Orca, vLLM v0/v1 and Sarathi differ only in admission,
ordering and clipping rules, each in a short module.
"""

from __future__ import annotations

from array import array
from collections import deque
from dataclasses import dataclass
from itertools import accumulate
from operator import itemgetter
from typing import ClassVar

from simserve.kv.blocks import BlockManager
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status


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


class Batch:
    """A StepPlan under construction: the token budget and sequence count left.

    Entries are classified as they are added (a decode feeds back exactly its last sampled
    token; anything else is a prefill chunk), so ``freeze`` only packs tuples.
    """

    __slots__ = ("token_budget", "seq_budget", "entries", "ids", "new_tokens", "scheduled",
                 "prefills", "first_scheduled", "plan", "num_preempted", "swap_out_blocks",
                 "swap_in_blocks", "prefill_lens", "prefill_ctx", "decode_ctx", "num_sampled")

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
        self.prefill_lens: list[int] = []
        self.prefill_ctx: list[int] = []
        self.decode_ctx: list[int] = []
        self.num_sampled = 0

    def add(self, req: Request, n: int) -> None:
        self.entries.append((req, n))
        self.ids.append(req.id)
        self.new_tokens.append(n)
        self.scheduled.add(req.id)
        self.token_budget -= n
        self.seq_budget -= 1
        computed = req.num_computed_tokens
        num_tokens = req.num_prompt_tokens + req.num_generated
        if n == 1 and req.num_generated and computed + 1 == num_tokens:
            self.decode_ctx.append(computed)
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
            self.swap_out_blocks, self.swap_in_blocks, self.num_preempted)
        return self.plan


class Scheduler:
    """Queues, the block manager and the shared verbs; subclasses implement ``schedule``."""

    name: ClassVar[str] = ""
    chunked: ClassVar[bool | None] = None   # True/False: fixed by the policy; None: follows config
    reserves_full_length: ClassVar[bool] = False  # KV for prompt + output reserved at admission
    # True if, once a step decodes every running request with no preemption, swap or admission,
    # the same decision repeats for as long as no request finishes or arrives and free KV blocks
    # only shrink: admission can only get harder. The engine then fast-forwards such stretches
    # without calling schedule() (see decode_stretch_limit). Policies that count steps or use
    # timers must leave it False.
    monotone_admission: ClassVar[bool] = False
    # True if, moreover, with nothing waiting or swapped, a step right after some requests
    # finish decodes every request left (the same decision, minus the finished): a stretch may
    # then run on past a finish (``decode_stretch_limit(..., past_finish=True)``); and a step
    # after one in which every running request sampled decodes them all: a stretch may then
    # start with a mixed step that ends some prefills.
    continues_past_finish: ClassVar[bool] = False
    # the policy's knobs (a frozen dataclass read by sched.params.read_params), if it has any
    params_type: ClassVar[type | None] = None
    # KV blocks the engine keeps out of use (vLLM v1's block pool holds block 0 back as its
    # "null block"): the policy's block manager gets num_gpu_blocks minus these
    reserved_blocks: ClassVar[int] = 0

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, params=None, seed: int = 0):
        self.limits = limits
        self.blocks = blocks
        self.params = params if params is not None or self.params_type is None \
            else self.params_type()
        self.seed = seed   # root seed of the run, for policies that draw random numbers
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.num_steps = 0                 # steps completed so far (the next step's index)
        # Inter-token latency, gathered as tokens are sampled (never per token): gap g, between
        # steps g and g + 1, occurs itl_weight[g] times, kept as a difference array (entry g
        # adds to every gap from g on); gaps spanning skipped steps are listed in itl_extra.
        self.itl_diff = array("i", [0])
        self.itl_extra = array("d")
        # Every token's time, only when asked for (tokens.csv, Result.token_times)
        self.record_tokens = False
        self.step_ends = array("d")
        self._batch: Batch | None = None
        self._stretch: list[tuple[Request, int, int, int, int]] = []   # see decode_stretch_limit
        self._past_finish = False
        self._mixed = False     # the stretch starts with a mixed step (decode_stretch_limit)

    # -- queue state -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        if self.record_tokens:
            req.step_ends, req.token_runs = self.step_ends, []
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
        if self.blocks.allocate(req.id, req.num_computed_tokens + n) is None:
            return False
        batch.add(req, n)
        return True

    def new_batch(self) -> Batch:
        """An empty batch for this step; ``complete`` reads its entries back."""
        self._batch = Batch(self.limits)
        return self._batch

    def grow_or_preempt(self, batch: Batch, req: Request, n: int) -> bool:
        """Like ``grow``, but evicts the newest running request until the blocks fit.

        vLLM's rule (v0 ``_schedule_running``, v1 ``schedule``): the victim is the last request
        in the running list. Requests already scheduled in this step are never victims (when the
        running list is walked front to back, as in vLLM, the last one never is). If the victim
        is ``req`` itself it is not scheduled and False is returned.
        """
        while self.blocks.allocate(req.id, req.num_computed_tokens + n) is None:
            victim = next(r for r in reversed(self.running) if r.id not in batch.scheduled)
            self.preempt(batch, victim)
            if victim is req:
                return False
        batch.add(req, n)
        return True

    def decode_all(self, batch: Batch) -> bool:
        """Give every running request one token, oldest first, evicting the newest on block
        shortage (``grow_or_preempt``'s rule). Returns False if a request preempted itself.

        The common case of vLLM's running loop when every running request is decoding,
        written as one tight loop: a decode needs a new block only once per ``block_size``
        steps, so most iterations are a division and an append.
        """
        if self._decode_all_at_once(batch):
            return True
        bs = self.blocks.block_size
        # with named blocks every decode goes through allocate(): a block its token fills
        # becomes cached now, as in vLLM (allocate_slots caches the blocks a step fills)
        held = {} if self.blocks.caches_prefixes else self.blocks._held
        entries, scheduled, decode_ctx = batch.entries, batch.scheduled, batch.decode_ctx
        i = 0
        running = self.running
        while i < len(running):
            if batch.token_budget <= 0 or batch.seq_budget <= 0:
                return True
            req = running[i]
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

    def _decode_all_at_once(self, batch: Batch) -> bool:
        """``decode_all``'s usual case in a few list passes instead of one branchy loop: the
        budgets cover every running request, every one is decoding, and the new blocks they
        need all fit (so no one is preempted and, a counting block manager being a counter,
        allocating them one by one in order or all at once ends the same). Returns False,
        having changed nothing, if any condition fails."""
        running = self.running
        n = len(running)
        blocks = self.blocks
        if not n or n > batch.token_budget or n > batch.seq_budget or blocks.caches_prefixes:
            return False
        ctx = [r.num_computed_tokens for r in running]
        # each decoding: it has sampled a token and computed all but that one (-1: it has not)
        if ctx != [r.num_prompt_tokens + r.num_generated - 1 if r.num_generated else -1
                   for r in running]:
            return False
        bs, held = blocks.block_size, blocks._held
        ids = [r.id for r in running]
        # a running request's blocks hold its c computed tokens, so token c + 1 needs a new
        # block only when c fills its blocks exactly: c a multiple of bs and held = c / bs
        grow = [(i, c // bs + 1) for i, c in zip(ids, ctx)
                if not c % bs and held.get(i, 0) <= c // bs]
        if grow:
            added = sum(need - held.get(i, 0) for i, need in grow)
            if added > blocks.num_free:
                return False
            blocks.num_free -= added
            held.update(grow)
        ones = [1] * n
        batch.entries.extend(zip(running, ones))
        batch.ids.extend(ids)
        batch.new_tokens.extend(ones)
        batch.scheduled.update(ids)
        batch.decode_ctx.extend(ctx)
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
        need = reserve_tokens if reserve_tokens is not None else req.num_computed_tokens + n
        if gate_tokens is not None and not self.blocks.can_hold(req.id, gate_tokens):
            return False
        if self.blocks.allocate(req.id, need) is None:
            return False
        self.waiting.popleft()
        req.status = Status.RUNNING
        self.running.append(req)
        batch.add(req, n)
        return True

    def cached_prefix(self, req: Request) -> int:
        """Tokens at the start of a waiting request already in the prefix cache (0 without
        prefix caching): what admitting it now would start it with."""
        blocks = self.blocks
        if not blocks.caches_prefixes:
            return 0
        blocks.register(req.id, req.num_prompt_tokens, req.spec.hash_ids)
        return blocks.cached_tokens(req.id, req.num_tokens)

    def _admit_cached(self, batch: Batch, req: Request, n: int, reserve_tokens: int | None,
                      gate_tokens: int | None) -> bool:
        blocks = self.blocks
        cached = self.cached_prefix(req)
        n = min(n, req.num_tokens - cached)
        need = max(reserve_tokens or 0, cached + n)
        if gate_tokens is not None and not blocks.can_hold(req.id, gate_tokens, cached):
            return False
        if (blocks.allocate_cached(req.id, need, cached) if cached
                else blocks.allocate(req.id, need)) is None:
            return False
        if req.num_preemptions == 0:
            req.num_cached_tokens = cached
        req.num_computed_tokens = cached
        self.waiting.popleft()
        req.status = Status.RUNNING
        self.running.append(req)
        batch.add(req, n)
        return True

    def resume_swapped(self, batch: Batch) -> None:
        """Swap requests back in, oldest first, while blocks and budgets allow."""
        while self.swapped and not batch.full:
            req = self.swapped[0]
            need = self.blocks.swapped_blocks(req.id)
            if need > self.blocks.num_free or len(self.running) >= self.limits.max_num_seqs:
                return
            n = self.joining_tokens(req, req.num_remaining, batch)
            if n is None:
                return
            moved = self.blocks.swap_in(req.id)
            assert moved is not None
            batch.swap_in_blocks += moved
            self.swapped.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
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

    # -- after the step --------------------------------------------------------------------
    def complete(self, plan: StepPlan, t_end: float) -> list[Request]:
        """Advance counters for ``plan``, sample tokens at ``t_end``; return finished requests."""
        finished: list[Request] = []
        index = self._next_step([t_end])
        batch = self._batch
        if batch is not None and batch.plan is plan:
            entries = batch.entries
        else:   # a plan built outside new_batch(): look its requests up
            by_id = {r.id: r for r in self.running}
            entries = [(by_id[rid], n) for rid, n in zip(plan.request_ids, plan.num_new_tokens)]
        diff = self.itl_diff
        for req, n in entries:
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_prompt_tokens + req.num_generated:
                req.num_generated += 1
                if req.first_token_s is None:
                    req.first_token_s = t_end
                elif req.last_step == index - 1:         # decoded in the previous step too
                    diff[index - 1] += 1
                    diff[index] -= 1
                else:                                    # skipped some steps
                    self.itl_extra.append(t_end - req.last_token_s)
                req.last_step, req.last_token_s = index, t_end
                if req.token_runs is not None:
                    _extend_runs(req.token_runs, index, 1)
                if req.num_generated == req.num_output_tokens:
                    finished.append(req)
        self._finish_at(finished)
        return finished

    def _next_step(self, ends: list[float]) -> int:
        """Account for ``len(ends)`` completed steps; the index of the first."""
        first = self.num_steps
        self.num_steps += len(ends)
        self.itl_diff.frombytes(bytes(len(ends) * self.itl_diff.itemsize))   # zeros
        if self.record_tokens:
            self.step_ends.extend(ends)
        return first

    def _finish_at(self, finished: list[Request]) -> None:
        """Retire finished requests, each at the time of its last token."""
        if len(finished) == 1:
            self.running.remove(finished[0])
        elif finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
        for req in finished:
            self.blocks.free(req.id)
            req.status = Status.FINISHED
            req.finish_s = req.last_token_s

    # -- fast-forward ------------------------------------------------------------------------
    #
    # A "decode stretch": the plan just made decodes every running request by one token, with
    # no prefill, preemption, swap or admission. Step i of the stretch (i = 0 is that plan)
    # feeds request j's token at position c_j + i, so it needs blocks for c_j + i + 1 tokens:
    #
    #     block_size 4, c_j = 6:  [x x x x][x x . .]   step 0 writes slot 7, step 1 slot 8,
    #                                                  step 2 needs a third block, ...
    #
    # Until someone finishes, arrives, or the blocks run out, every step repeats the decision
    # (for a policy with monotone admission), so the engine can price and apply k steps at once.
    # A stretch may also start with a step that completes the last prefill chunks of some
    # requests while the others decode, or wait (vLLM v0's prefill-only steps): when nothing is
    # left waiting, the next step decodes them all. A member's c is then chosen so that step
    # i >= 1 still feeds position c + i: a newcomer with prompt p has c = p - 1 (as if it had
    # decoded at step 0); a request that waits in step 0 has c one less than its context, and
    # takes the stretch's steps from step 1 (its offset o = 1).

    def decode_stretch_limit(self, plan: StepPlan, max_steps: int,
                             past_finish: bool = False) -> int:
        """How many steps, starting with ``plan``, are a decode stretch (1 = just this one).

        ``plan`` must have every request in it sample a token and, but for a mixed first
        step, decode every running request. A mixed first step (with ``past_finish``, for a
        policy that ``continues_past_finish``, with nothing waiting or swapped) completes the
        last prefill chunks of some requests while the others decode or, still decoding, wait;
        it is a segment of its own. Bounded by ``max_steps``; by the KV blocks (the stretch
        stops before the step whose allocations would not fit); and by the earliest finish (its
        last step ends the stretch) unless ``past_finish`` and the policy
        ``continues_past_finish`` with nothing waiting or swapped: then requests drop out of the
        stretch as they finish, in *segments* (``stretch_segments``, ``segment_plan``), and it
        runs until the last one is done.
        """
        running = self.running
        everyone = len(plan.request_ids) == len(running)
        if (not self.monotone_admission or plan.num_preempted
                or plan.swap_in_blocks or plan.swap_out_blocks
                or plan.num_sampled != len(plan.request_ids) or max_steps <= 1
                or self.blocks.caches_prefixes):   # blocks with identities: allocate() each
            return 1
        # if some prefill (their last chunk), the stretch may start with this mixed step when
        # what follows is sure to decode every running request (nothing waits to be admitted
        # or swapped in, and the token budget holds them all) and, as for segments, nothing
        # can look at the stretch before it is applied (``past_finish``)
        self._mixed = mixed = bool(plan.prefill_lens)
        if not mixed and not everyone:
            return 1
        if mixed and (not past_finish or not self.continues_past_finish or self.waiting
                      or self.swapped or self._batch is None or self._batch.plan is not plan
                      or len(running) > self.limits.max_num_batched_tokens):
            return 1
        held = self.blocks._held
        # snapshot (request, c, blocks held, end step, offset o) once: the stretch verbs reuse
        # it. The member takes steps o .. end - 1, and step i feeds its token at position
        # c + i: c is the tokens computed before step 0 less one, plus the tokens the plan
        # gives it (1 for a decode, 0 if it waits).
        if everyone:
            snap = [(r, r.num_computed_tokens, held[r.id],
                     r.num_output_tokens - r.num_generated, 0) for r in running]
            for r, n in self._batch.prefills if mixed else ():   # their last chunk: c moves on
                j = running.index(r)
                snap[j] = (r, r.num_computed_tokens + n - 1, *snap[j][2:])
        else:
            more = {r.id: n - 1 for r, n in self._batch.prefills}
            snap = []
            scheduled = self._batch.scheduled
            for r in running:
                c, left = r.num_computed_tokens, r.num_output_tokens - r.num_generated
                if r.id in scheduled:
                    snap.append((r, c + more.get(r.id, 0), held[r.id], left, 0))
                elif r.num_generated and c + 1 == r.num_prompt_tokens + r.num_generated:
                    snap.append((r, c - 1, held[r.id], left + 1, 1))   # waits, decoding
                else:
                    return 1   # a prefill left undone: the next step is no decode step
        self._stretch = snap
        self._past_finish = past = (past_finish and self.continues_past_finish
                                    and not self.waiting and not self.swapped)
        k = min(max_steps, (max if past else min)(snap, key=_end_step)[3])
        if k <= 1:
            return 1
        bs, free = self.blocks.block_size, self.blocks.num_free
        if len(snap) * (k // bs + 1) <= free:   # k steps add at most k // bs + 1 blocks each
            return k

        def new_blocks(steps: int) -> int:
            """Blocks to add so that each member fits the steps it takes of ``steps`` (blocks
            freed by members that finish are not counted back: a conservative bound)."""
            total = 0
            for _, c, h, e, _ in snap:
                need = -(-(c + min(steps, e)) // bs) - h
                if need > 0:
                    total += need
            return total

        if new_blocks(k) <= free:
            return k
        lo, hi = 1, k          # new_blocks(lo) <= free (= 0 for lo = 1), new_blocks(hi) > free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if new_blocks(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def stretch_segments(self, k: int) -> list[tuple[int, int, int]]:
        """The runs of one membership and shape among the stretch's steps 0..k-1, as ``(first
        step i0, requests in it, the sum of their contexts at step i0)``: one run unless the
        stretch starts with a mixed step, which is a segment of its own, or requests drop out
        as they finish. Step i of a decode segment starting at i0 decodes those requests with
        every context grown by i - i0 (``segment_plan`` gives its plan; the sum is what a
        latency model with ``decode_stretch_sum`` needs)."""
        total = 0
        drops: dict[int, list[int]] = {}      # step -> [members, Σ c] of those gone by then
        past = self._past_finish
        for _, c, _, e, _ in self._stretch:
            total += c
            if past and e < k:
                d = drops.get(e)
                if d is None:
                    drops[e] = [1, c]
                else:
                    d[0] += 1
                    d[1] += c
        if self._mixed and 1 not in drops:
            drops[1] = [0, 0]
        m = len(self._stretch)
        segments = [(0, m, total)]
        for i0 in sorted(drops):
            gone, ctx = drops[i0]
            m -= gone
            total -= ctx
            segments.append((i0, m, total + m * i0))
        return segments

    def segment_plan(self, plan: StepPlan, i0: int) -> StepPlan:
        """The plan of step ``i0`` of the stretch that starts with ``plan``: exactly what
        ``schedule()`` would make then (the requests left, in running order, each decoding;
        step 0 is ``plan`` itself)."""
        if i0 == 0:
            return plan
        members = [x for x in self._stretch if x[3] > i0]     # x = (request, c, h, end, o)
        m = len(members)
        return StepPlan(tuple([x[0].id for x in members]), (1,) * m, (), (),    # (positional)
                        tuple([x[1] + i0 for x in members]), m, 0, 0, 0, plan.extra_s)

    def stretch_blocks_used(self, k: int) -> list[int]:
        """KV blocks in use after scheduling each step 0..k-1 of a stretch (for the recorder)."""
        bs = self.blocks.block_size
        extra = [0] * k
        for _, c, h, e, _ in self._stretch:
            # step i holds ceil((c + i + 1) / bs) blocks: it first needs block h + 1 at step
            # h * bs - c (>= 1, since step 0 fits in h blocks), then every bs steps; a member
            # that finishes at step e - 1 frees all it holds before step e
            last = e if e < k else k
            first = h * bs - c
            grown = 0
            if first < last:
                for i in range(first, last, bs):
                    extra[i] += 1
                grown = (last - 1 - first) // bs + 1
            if e < k:
                extra[e] -= h + grown
        return list(accumulate(extra, initial=self.blocks.num_used))[1:]

    def complete_decode_stretch(self, ends: list[float]) -> list[Request]:
        """Apply a k-step decode stretch whose steps end at ``ends``; return finished requests.

        A member takes steps o .. min(k, end) - 1. Inter-token gaps: inside the stretch every
        member has one per step gap between its steps; entering it, a member that decoded in
        the step just before adds that step gap, others add their own gap since their last
        token.
        """
        k = len(ends)
        a = self._next_step(ends)
        finished = []
        bs, held = self.blocks.block_size, self.blocks._held
        added = adjacent = late = 0
        extra = self.itl_extra
        diff = self.itl_diff
        for req, c, h, e, o in self._stretch:
            end = e if e < k else k
            c += end
            req.num_computed_tokens = c
            req.num_generated += end - o
            need = -(-c // bs)          # fits: decode_stretch_limit checked the total
            if need > h:
                held[req.id] = need
                added += need - h
            if req.first_token_s is None:
                req.first_token_s = ends[o]
            elif req.last_step == a - 1 and not o:
                adjacent += 1
            else:
                extra.append(ends[o] - req.last_token_s)
            req.last_step, req.last_token_s = a + end - 1, ends[end - 1]
            if req.token_runs is not None:
                _extend_runs(req.token_runs, a + o, end - o)
            diff[a + end - 1] -= 1      # its gaps a + o .. a + end - 2 (the start: below)
            late += o
            if e <= k:
                finished.append(req)
        diff[a] += len(self._stretch) - late
        if late:
            diff[a + 1] += late
        if adjacent:
            diff[a - 1] += adjacent
            diff[a] -= adjacent
        self.blocks.num_free -= added
        self._stretch = []
        self._finish_at(finished)
        return finished


_end_step = itemgetter(3)   # of a stretch snapshot entry (request, c, blocks held, end, offset)


def _extend_runs(runs: list[list[int]], first: int, k: int) -> None:
    """Add steps [first, first + k) to a request's token runs, merging adjacent runs."""
    if runs and runs[-1][1] == first:
        runs[-1][1] = first + k
    else:
        runs.append([first, first + k])
