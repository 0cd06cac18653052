"""vLLM v0 default scheduler: prefill-first, prefills and decodes never in one step.

Learned from vllm v0 ``vllm/core/scheduler.py`` (``_schedule_default``): when nothing is swapped
out, waiting prompts are admitted whole (FCFS) while they fit the token budget, the sequence cap
and the free blocks minus a 1 % watermark; if any prompt was admitted the step is prefill-only.
Otherwise every running request decodes one token, preempting the newest running request when
blocks run out; swapped requests come back only in steps with no preemption.
"""

from __future__ import annotations

import math

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.plan import StepPlan

WATERMARK = 0.01   # vLLM v0 block_manager watermark: keep 1 % free when admitting prompts


class VllmV0(Scheduler):
    name = "vllm_v0"
    facts = PolicyFacts(chunked=False, monotone_admission=True, continues_past_finish=True,
                        pipelines=True)

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        if not self.swapped:
            self._admit_prompts(batch)
            if batch.entries:
                return batch.freeze()
        self.decode_all(batch)   # running requests all decode: prompts are never chunked
        if batch.num_preempted == 0:
            self.resume_swapped(batch)
        return batch.freeze()

    def _admit_prompts(self, batch: Batch) -> None:
        # The watermark only guards against thrashing among running requests; an idle engine
        # admits any prompt that fits at all, or a request larger than 99 % of the cache
        # would wait forever.
        parked = self.num_parked     # (requests in a micro-batch in flight: pipelining)
        reserve = math.ceil(WATERMARK * self.blocks.num_blocks) \
            if self.running or parked else 0
        while self.waiting and len(self.running) + parked < self.limits.max_num_seqs:
            req = self.waiting[0]
            n = req.num_remaining
            if n > batch.token_budget or batch.seq_budget <= 0:
                return
            # all its tokens need blocks: a request handed over with its KV computed (a
            # disaggregated decode replica) asks for 1 new token but holds its whole context
            if not self.blocks.can_allocate(req.id, req.num_computed_tokens + n, reserve=reserve):
                return
            self.admit(batch, req, n)
