"""Sarathi-Serve stall-free batching: decodes first, then partial prefills, then new prompts.

From the Sarathi-Serve paper (Agrawal et al., OSDI'24, Algorithm 2 "stall-free batching"): a
fixed token budget per iteration (the chunk size, ``max_num_batched_tokens``) is filled first by
every running decode, so ongoing generations never stall behind a prompt; then by ongoing
chunked prefills; then by new requests, their prompts chunked to whatever budget is left. Only
decodes evict freely (the newest running request); a partial prefill evicts only when the step
would otherwise be empty, which keeps two half-done prompts from deadlocking a full cache.
"""

from __future__ import annotations

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.plan import StepPlan


class Sarathi(Scheduler):
    name = "sarathi"
    facts = PolicyFacts(
        chunked=True, monotone_admission=True, continues_past_finish=True,
        joins_stretch=True,         # arrivals join a stretch when admitted whole (stretch_admits)
        speculates=True,            # decodes through the shared verbs: they verify drafts
        pipelines=True,             # micro-batches in flight, parked (engine/pipeline.py)
        prefix_caching=True)

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        self._decodes(batch)
        self._partial_prefills(batch)
        if batch.num_preempted == 0:
            self.resume_swapped(batch)
            self._new_prefills(batch)
        return batch.freeze()

    def stretch_admits(self, prompts: list[int], decoding: int,
                       running: int | None = None) -> bool:
        # schedule() then: _decodes gives every running request its token, _partial_prefills
        # has nothing to do (everyone decodes), nothing is swapped, and _new_prefills admits
        # the arrived while may_admit allows, each prompt cut by the base clip: the
        # long-prefill threshold, never lifted here (unlike vLLM v1's), and the budget left.
        # No gate besides the blocks (which the stretch checks: Stretch.room_to_join)
        return self.admits_whole(prompts, decoding, self.limits.long_prefill_token_threshold,
                                 running)

    def _decodes(self, batch: Batch) -> None:
        if self._decode_all_at_once(batch):   # the usual case: every running request decodes
            return
        i = 0
        while i < len(self.running) and not batch.full:
            req = self.running[i]
            if req.is_decoding and not self.grow_or_preempt(batch, req, 1):
                break
            i += 1

    def _partial_prefills(self, batch: Batch) -> None:
        if len(batch.scheduled) == len(self.running):   # everyone decodes already
            return
        for req in self.running:
            if batch.full:
                return
            if req.id not in batch.scheduled and not req.is_decoding:
                n = self.clip(req, req.num_remaining, batch)
                if not self.grow(batch, req, n) and not batch.entries:
                    self.grow_or_preempt(batch, req, n)
                    return

    def _new_prefills(self, batch: Batch) -> None:
        while self.may_admit(batch):
            req = self.waiting[0]
            if not self.admit(batch, req, self.clip(req, req.num_remaining, batch)):
                return
