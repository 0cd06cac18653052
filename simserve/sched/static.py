"""Static (request-level) batching: a batch runs until its last member finishes.

The pre-Orca way (e.g. a ``generate()`` loop over a padded batch): when the engine is idle it
takes up to ``max_num_seqs`` waiting requests whose prompts fit the token budget, reserves KV for
each one's full length, prefills them together, then decodes until every member is done. New
arrivals wait for the whole batch to drain. Finished members stop costing compute (padding is
not priced), so this is an optimistic bound for static batching.
"""

from __future__ import annotations

from simserve.sched.core import Batch, Scheduler
from simserve.sched.plan import StepPlan


class Static(Scheduler):
    name = "static"
    chunked = False
    reserves_full_length = True

    def schedule(self) -> StepPlan:
        batch = Batch(self.limits)
        if self.running:
            for req in self.running:
                self.grow(batch, req, req.num_remaining)   # reserved: always fits
            return batch.freeze()
        while self.waiting and batch.seq_budget > 0:
            req = self.waiting[0]
            n = req.num_remaining
            if n > batch.token_budget or not self.admit(batch, req, n, reserve_tokens=req.max_tokens):
                break
        return batch.freeze()
