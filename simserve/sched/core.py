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

from collections import deque
from dataclasses import dataclass
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


class Batch:
    """A StepPlan under construction: the token budget and sequence count left."""

    def __init__(self, limits: SchedulerLimits):
        self.token_budget = limits.max_num_batched_tokens
        self.seq_budget = limits.max_num_seqs
        self.entries: list[tuple[Request, int]] = []
        self.scheduled: set[int] = set()
        self.num_preempted = 0
        self.swap_out_blocks = 0
        self.swap_in_blocks = 0

    def add(self, req: Request, n: int) -> None:
        assert n >= 1 and req.id not in self.scheduled
        self.entries.append((req, n))
        self.scheduled.add(req.id)
        self.token_budget -= n
        self.seq_budget -= 1

    @property
    def full(self) -> bool:
        return self.token_budget <= 0 or self.seq_budget <= 0

    def freeze(self) -> StepPlan:
        prefill_lens: list[int] = []
        prefill_ctx: list[int] = []
        decode_ctx: list[int] = []
        num_sampled = 0
        for req, n in self.entries:
            if req.is_decoding and n == 1:
                decode_ctx.append(req.num_computed_tokens)
            else:
                prefill_lens.append(n)
                prefill_ctx.append(req.num_computed_tokens)
            if req.num_computed_tokens + n == req.num_tokens:
                num_sampled += 1
        return StepPlan(
            request_ids=tuple(r.id for r, _ in self.entries),
            num_new_tokens=tuple(n for _, n in self.entries),
            prefill_lens=tuple(prefill_lens),
            prefill_ctx=tuple(prefill_ctx),
            decode_ctx=tuple(decode_ctx),
            num_sampled=num_sampled,
            swap_out_blocks=self.swap_out_blocks,
            swap_in_blocks=self.swap_in_blocks,
            num_preempted=self.num_preempted,
        )


class Scheduler:
    """Queues, the block manager and the shared verbs; subclasses implement ``schedule``."""

    name: ClassVar[str] = ""
    chunked: ClassVar[bool | None] = None   # True/False: fixed by the policy; None: follows config
    reserves_full_length: ClassVar[bool] = False  # KV for prompt + output reserved at admission

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager):
        self.limits = limits
        self.blocks = blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self._by_id: dict[int, Request] = {}

    # -- queue state -----------------------------------------------------------------------
    def add(self, req: Request) -> None:
        req.status = Status.WAITING
        self.waiting.append(req)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

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

    def admit(self, batch: Batch, req: Request, n: int, reserve_tokens: int | None = None) -> bool:
        """Waiting head → running with ``n`` new tokens, if its blocks fit (no eviction)."""
        need = reserve_tokens if reserve_tokens is not None else req.num_computed_tokens + n
        if self.blocks.allocate(req.id, need) is None:
            return False
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
            n = self.clip(req, req.num_remaining, batch)
            if n < req.num_remaining and not self.chunks_prefill:
                return
            moved = self.blocks.swap_in(req.id)
            assert moved is not None
            batch.swap_in_blocks += moved
            self.swapped.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            if n and self.blocks.allocate(req.id, req.num_computed_tokens + n) is not None:
                batch.add(req, n)

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
        by_id = {r.id: r for r in self.running}
        for rid, n in zip(plan.request_ids, plan.num_new_tokens):
            req = by_id.get(rid)
            if req is None:   # cannot happen: scheduled requests are not preempted in a step
                raise AssertionError(f"scheduled request {rid} is not running")
            req.num_computed_tokens += n
            if req.num_computed_tokens == req.num_tokens:
                req.num_generated += 1
                req.token_times.append(t_end)
                if req.num_generated == req.num_output_tokens:
                    finished.append(req)
        for req in finished:
            self.running.remove(req)
            self.blocks.free(req.id)
            req.status = Status.FINISHED
            req.finish_s = t_end
        return finished
