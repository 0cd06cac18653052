"""Orca iteration-level batching (Yu et al., OSDI'22), with whole-length KV reservation.

Every iteration all running requests advance one token and waiting requests may join with their
whole prompt (no chunking; prefill and decode tokens share the iteration). As in the vLLM
paper's description of Orca, each admitted request reserves KV memory for its full length
(prompt + max_tokens) up front, so there is never a preemption, but fewer requests fit.
"""

from __future__ import annotations

from simserve.sched.core import Scheduler
from simserve.sched.plan import StepPlan


class Orca(Scheduler):
    name = "orca"
    monotone_admission = True   # see Scheduler.monotone_admission
    chunked = False
    reserves_full_length = True

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        for req in self.running:
            if batch.full:
                break
            self.grow(batch, req, req.num_remaining)   # reserved at admission: always fits
        while self.may_admit(batch):
            req = self.waiting[0]
            n = req.num_remaining
            if n > batch.token_budget or not self.admit(batch, req, n,
                                                         reserve_tokens=req.max_tokens):
                break
        return batch.freeze()
