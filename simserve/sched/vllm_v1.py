"""vLLM v1: running requests first, then waiting ones, all under one token budget.

Learned from vllm/v1/core/sched/scheduler.py (``Scheduler.schedule``): there are no phases;
each running request asks for ``num_tokens - num_computed_tokens`` new tokens, clipped by
``long_prefill_token_threshold`` and the budget left, so prefills are chunked and mixed with
decodes. When KV blocks run out the newest running request is preempted (recompute). Waiting
requests are admitted only if nothing was preempted this step, while ``len(running) <
max_num_seqs``; without chunked prefill a prompt that does not fit the remaining budget waits.
"""

from __future__ import annotations

from simserve.sched.core import Batch, Scheduler  # noqa: F401
from simserve.sched.plan import StepPlan


class VllmV1(Scheduler):
    name = "vllm_v1"
    monotone_admission = True   # see Scheduler.monotone_admission
    continues_past_finish = True

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        self._schedule_running(batch)
        if batch.num_preempted == 0:
            self.resume_swapped(batch)
            self._admit_waiting(batch)
        return batch.freeze()

    def _schedule_running(self, batch: Batch) -> None:
        # each running request asks for num_remaining tokens, clipped (decodes ask for 1);
        # on block shortage the newest is preempted; if a request preempts itself, everything
        # after it is gone too and the loop ends (Scheduler.decode_all)
        self.decode_all(batch)

    def _admit_waiting(self, batch: Batch) -> None:
        while self.waiting and not batch.full and len(self.running) < self.limits.max_num_seqs:
            req = self.waiting[0]
            wanted = self.clip(req, req.num_remaining, batch) if self.chunks_prefill \
                else req.num_remaining
            if wanted > batch.token_budget or not self.admit(batch, req, wanted):
                break
