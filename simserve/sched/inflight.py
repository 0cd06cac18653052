"""Steps in flight: a step's requests held while it runs. Async scheduling and a vLLM v1-style
pipeline split ``complete`` into ``launch`` (at schedule time) and ``deliver`` (when the output
is back); a Sarathi-style pipeline parks a micro-batch's requests out of ``running``."""

from __future__ import annotations

from heapq import merge
from typing import TYPE_CHECKING, NamedTuple

from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.sched.batch import Batch
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status


class InFlight(NamedTuple):
    """A launched step whose output is not yet delivered (async scheduling)."""

    plan: StepPlan
    entries: list[tuple[Request, int]]      # (request, new tokens), in plan order
    sampled: list[Request]                  # the requests whose token it samples


def done_in_flight(req: Request) -> bool:
    """Its last token is being sampled by a step in flight: vLLM's AsyncScheduler schedules it
    no more (it keeps its blocks and its place in ``running`` until that output is in)."""
    return bool(req.num_pending) and req.num_generated >= req.num_output_tokens


class StepsInFlight:
    """The scheduler's verbs for steps in flight (a part of ``Scheduler``, sched/core.py)."""

    # what they read and write of the scheduler's state (sched/core.py sets it)
    running: list[Request]
    blocks: BlockManager
    sampled: list[Request]
    num_parked: int
    current_step: int
    steps_in_flight: int
    holds_sampled: bool
    decode_stagger: int
    _batch: Batch | None

    if TYPE_CHECKING:
        def _entries(self, plan: StepPlan) -> list[tuple[Request, int]]: ...

        def retire(self, finished: list[Request], t: float | None) -> None: ...

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
        blocks = self.blocks
        # with prefix caching, the tokens whose blocks may become cached: those sampled and
        # delivered (vLLM caches up to request.num_tokens, which has no placeholders); a
        # token is in flight now, so the limit is never None
        limits = blocks.cache_limits if isinstance(blocks, PrefixBlockManager) else None
        if limits is None and not stagger:    # (the usual: the loop below, less its branches)
            for req, n in entries:
                c = req.num_computed_tokens = req.num_computed_tokens + n
                req.num_in_flight += 1
                if c == req.num_prompt_tokens + req.num_generated:
                    req.num_generated += 1
                    req.num_pending += 1
                    sampled.append(req)
            self.steps_in_flight += 1
            return InFlight(plan, entries, sampled)
        for req, n in entries:
            req.num_computed_tokens += n
            req.num_in_flight += 1
            if req.num_computed_tokens == req.num_prompt_tokens + req.num_generated:
                req.num_generated += 1
                req.num_pending += 1
                sampled.append(req)
                if limits is not None:   # (limit_cache)
                    limits[req.id] = req.num_prompt_tokens + req.num_generated - req.num_pending
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
        if prefix is not None:
            limits, cache_upto = prefix.cache_limits, prefix.cache_upto
            bs, keyed = prefix.block_size, prefix.keyed_blocks
        running = Status.RUNNING
        if prefix is None:                    # (the usual: the loop below, less its branches)
            for req in step.sampled:
                if req.status is running:
                    req.num_pending -= 1
                if req.num_generated >= req.num_output_tokens and not req.num_pending:
                    finished.append(req)
            self.retire(finished, t_end)
            return finished
        for req in step.sampled:
            if req.status is running:
                pending = req.num_pending = req.num_pending - 1
                if prefix is not None:   # AsyncScheduler caches the blocks its output fills
                    # its cache limit (as in launch), then cache_upto where a block may fill
                    n = req.num_computed_tokens - pending
                    if pending:
                        known = req.num_prompt_tokens + req.num_generated - pending
                        limits[req.id] = known
                        if known < n:
                            n = known
                    else:
                        limits.pop(req.id, None)
                    if n // bs > keyed.get(req.id, 0):
                        cache_upto(req.id, req.num_computed_tokens - pending)
            if req.num_generated >= req.num_output_tokens and not req.num_pending:
                finished.append(req)
        self.retire(finished, t_end)
        return finished


def _run_seq(req: Request) -> int:
    return req.run_seq
