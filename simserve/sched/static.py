"""Static (request-level) batching: a batch runs until its last member finishes.

The pre-Orca way (FasterTransformer-style serving, a padded ``generate()`` loop): when the
engine is idle it forms a batch of up to ``max_num_seqs`` waiting requests, reserving KV for
each one's full length (prompt + output). The batch's whole prompts are prefilled first, packed
into steps of at most ``max_num_batched_tokens`` (a prompt is never split), then all members
decode in lockstep until every one is done. New arrivals wait for the whole batch to drain.
Finished members stop costing compute (padding is not priced), so this is an optimistic bound
for static batching.
"""

from __future__ import annotations

from simserve.sched.core import Scheduler
from simserve.sched.plan import StepPlan
from simserve.sched.request import Status


class Static(Scheduler):
    name = "static"
    monotone_admission = True   # see Scheduler.monotone_admission
    chunked = False
    reserves_full_length = True

    def schedule(self) -> StepPlan:
        if not self.running:
            self._form_batch()
        batch = self.new_batch()
        prefilling = [r for r in self.running if r.num_generated == 0]
        if prefilling:
            for req in prefilling:
                if req.num_remaining > batch.token_budget:
                    break
                self.grow(batch, req, req.num_remaining)   # reserved: always fits
        else:
            for req in self.running:
                self.grow(batch, req, req.num_remaining)
        return batch.freeze()

    def _form_batch(self) -> None:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            req = self.waiting[0]
            if self.blocks.allocate(req.id, req.max_tokens) is None:
                return
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
