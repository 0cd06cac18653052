"""TensorRT-LLM in-flight batching: GUARANTEED_NO_EVICT or MAX_UTILIZATION, then micro-batches.

Learned from TensorRT-LLM ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` and
``microBatchScheduler.cpp`` (and the PyTorch backend's scheduler docs). Active requests are
walked in arrival order. The *capacity* policy decides who may hold KV:

* ``GUARANTEED_NO_EVICT`` (``trtllm_guaranteed_no_evict``): requests in progress always
  continue, and the blocks they still need to reach their full length are set aside; a new
  request starts only if the blocks for its whole length (prompt + output) fit in what is left,
  and the first that does not fit stops admission (FCFS). Nothing is ever evicted.
* ``MAX_UTILIZATION`` (``trtllm_max_utilization``): a request needs only the blocks of its next
  step; when a started request's do not fit, the most recently started request is paused (its KV
  freed, recomputed later, prompt plus generated tokens) — possibly itself — and nothing after it
  in arrival order runs this step.

The *micro-batch* scheduler then fills ``max_num_tokens`` (``max_num_batched_tokens``) and
``max_batch_size`` (``max_num_seqs``): every generation request one token, in order; then the
context requests, whole (stopping at the first that does not fit) or, with chunked context
(``engine.enable_chunked_prefill``, the default here), chunked first-come-first-served over the
tokens the generations left.

Not modelled: chunk sizes rounded to the chunk unit, KV block reuse and the "beneficial to skip"
delay of requests that could reuse a block being computed, the ``STATIC_BATCH`` and
``PREFILL_FIRST`` policies, beam search, LoRA pages, and overlapping micro-batches.
"""

from __future__ import annotations

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status


class _TrtLlm(Scheduler):
    """The micro-batch pass shared by both capacity policies."""

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        self.begin(batch)
        contexts = []
        i = 0
        while i < len(self.running) and not batch.full:   # generation first, in order
            req = self.running[i]
            if req.is_decoding:
                if not self.grow_started(batch, req, 1):
                    break                                   # paused itself: it was the newest
            else:
                contexts.append(req)
            i += 1
        for req in contexts:                                # contexts already started
            if batch.full or req.status is not Status.RUNNING:
                break                                       # (paused: so is every later one)
            n = self._context_tokens(req, batch)
            if not n or not self.grow_started(batch, req, n):
                break
        if batch.num_preempted == 0:                        # nothing after a paused request
            self.resume_swapped(batch)                      # (only with preemption_mode: swap)
            self._start_new(batch)
        return batch.freeze()

    def _context_tokens(self, req: Request, batch: Batch) -> int:
        """Tokens of a context this step: the rest of it, or a chunk of what the budget
        leaves; 0 if it may not be chunked and does not fit."""
        if self.chunks_prefill:
            return self.clip(req, req.num_remaining, batch)
        return req.num_remaining if req.num_remaining <= batch.token_budget else 0

    def _start_new(self, batch: Batch) -> None:
        while self.may_admit(batch):
            req = self.waiting[0]
            n = self._context_tokens(req, batch)
            if not n or not self.fits_new(req) or not self.admit(batch, req, n):
                return
            self.started(req)

    # -- the capacity policy ---------------------------------------------------------------
    def begin(self, batch: Batch) -> None:
        """Called once per step before any request is scheduled."""

    def grow_started(self, batch: Batch, req: Request, n: int) -> bool:
        raise NotImplementedError

    def fits_new(self, req: Request) -> bool:
        raise NotImplementedError

    def started(self, req: Request) -> None:
        """Called after a new request was admitted."""


class TrtllmGuaranteedNoEvict(_TrtLlm):
    """TensorRT-LLM GUARANTEED_NO_EVICT: admit a request only if its whole length fits; never evict.
    """

    name = "trtllm_guaranteed_no_evict"
    # free blocks minus those set aside stays constant while requests decode: admission is
    # decided the same way every step of a stretch
    facts = PolicyFacts(monotone_admission=True)

    def begin(self, batch: Batch) -> None:
        # blocks free once every started request has taken what its full length needs
        blocks = self.blocks
        owed = sum(blocks.num_new_blocks(r.id, r.max_tokens) for r in self.running)
        self.slack = blocks.num_free - owed

    def grow_started(self, batch: Batch, req: Request, n: int) -> bool:
        return self.grow(batch, req, n)                     # set aside: always fits

    def fits_new(self, req: Request) -> bool:
        return self.blocks.blocks_for(req.max_tokens) <= self.slack

    def started(self, req: Request) -> None:
        self.slack -= self.blocks.blocks_for(req.max_tokens)   # taken now or owed


class TrtllmMaxUtilization(_TrtLlm):
    """TensorRT-LLM MAX_UTILIZATION: admit on next-step blocks; pause the newest when they run out.
    """

    name = "trtllm_max_utilization"
    facts = PolicyFacts(monotone_admission=True)   # as vLLM v1: a stretch ends when blocks run out

    def grow_started(self, batch: Batch, req: Request, n: int) -> bool:
        return self.grow_or_preempt(batch, req, n)          # pause the newest started request

    def fits_new(self, req: Request) -> bool:
        return True                                         # admit() checks the step's blocks
