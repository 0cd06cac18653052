"""vLLM v1: running requests first, then waiting ones, all under one token budget.

Learned from vllm/v1/core/sched/scheduler.py (``Scheduler.schedule``) and
vllm/v1/core/kv_cache_manager.py (``allocate_slots``), vLLM 0.32, and held to them step for step
by benchmarks/vllm_oracle.py. There are no phases; each running request asks for ``num_tokens -
num_computed_tokens`` new tokens, clipped by ``long_prefill_token_threshold`` and the budget
left, so prefills are chunked and mixed with decodes. When KV blocks run out the newest running
request is preempted (recompute). Waiting requests are admitted only if nothing was preempted
this step, while ``len(running) < max_num_seqs``, each asking for its tokens past its cached
prefix, cut to the threshold and the budget (without chunked prefill a request that does not fit
the budget left waits). The details that decide who runs under KV pressure:

* ``scheduler_reserve_full_isl`` (vLLM's default): a waiting request is admitted only if blocks
  for its whole sequence so far (prompt, plus its output before a preemption) are free now,
  though it allocates only for its first chunk; otherwise admission stops for this step;
* the block pool keeps one block back (the "null block"): ``reserved_blocks``;
* the threshold caps a chunk whether or not chunked prefill is on, and is lifted when only one
  request is running or waiting ("nobody to starve").

With ``engine.async_scheduling`` (vLLM's AsyncScheduler, vllm/v1/core/sched/async_scheduler.py)
the step is planned while the previous one runs (``Scheduler.launch``): a running request whose
last token is in flight is skipped (it keeps its blocks and slot until that output is in), and
a request preempted with a step in flight is not admitted until that step's output drains.

With ``engine.pipeline_parallel_size`` p > 1 (vLLM's synchronous ``Scheduler`` under a batch
queue of p, vllm/v1/engine/core.py ``step_with_batch_queue``) micro-batches are launched the
same way, without placeholders: a running request whose sampled token is in flight asks for
no tokens and is skipped (``Scheduler.held_in_flight``), while one whose prompt chunk in flight
leaves some of the prompt gets its next chunk at once; requests in flight stay in ``running``
(they count against ``max_num_seqs`` and may be preempted, their output then stale).

With both (vLLM 0.32's default with PP on GPUs: AsyncScheduler on its V2 model runner, a batch
queue of p + 1) a request whose token is in flight asks for its next decode at once, as under
async scheduling, but a request that samples in ``schedule()`` call n is skipped until call
n + p (``next_decode_eligible_step``, vllm/v1/core/sched/async_scheduler.py; engine/pipeline.py).
"""

from __future__ import annotations

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler  # noqa: F401
from simserve.sched.facts import PolicyFacts
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request


class VllmV1(Scheduler):
    name = "vllm_v1"
    facts = PolicyFacts(
        monotone_admission=True, continues_past_finish=True,
        joins_stretch=True,         # arrivals join a stretch when admitted whole (stretch_admits)
        speculates=True,            # decodes through the shared verbs: they verify drafts
        reserved_blocks=1,          # vLLM's block pool holds block 0 back as its null block
        pipelines=True, pipeline_launch=True,   # held in running as vLLM v1 holds them
        prefix_caching=True)
    _threshold = 0              # this step's long_prefill_token_threshold (see schedule)

    def schedule(self) -> StepPlan:
        # vLLM lifts the per-request chunk cap when there is nobody else to starve
        eligible = len(self.running) + self.num_parked + len(self.waiting) + len(self.swapped)
        self._threshold = self.limits.long_prefill_token_threshold if eligible > 1 else 0
        batch = self.new_batch()
        self._schedule_running(batch)
        if batch.num_preempted == 0:
            self.resume_swapped(batch)
            self._admit_waiting(batch)
        return batch.freeze()

    def stretch_admits(self, prompts: list[int], decoding: int,
                       running: int | None = None) -> bool:
        # schedule() then: the threshold (everyone eligible: the decoding and the arrived),
        # decode_all for the running, then _admit_waiting while the budgets and max_num_seqs
        # allow; a prompt is admitted whole if neither the threshold nor the budget left cuts
        # it (without chunked prefill one that does not fit waits): any cut, and they do not
        # all join
        limits = self.limits
        held = decoding if running is None else running     # (running: every one eligible)
        threshold = limits.long_prefill_token_threshold if held + len(prompts) > 1 else 0
        return self.admits_whole(prompts, decoding, threshold, running)

    def clip(self, req: Request, n: int, batch: Batch) -> int:
        threshold = self._threshold
        if 0 < threshold < n:
            n = threshold
        return max(0, min(n, batch.token_budget))

    def _schedule_running(self, batch: Batch) -> None:
        # each running request asks for num_remaining tokens, clipped (decodes ask for 1);
        # on block shortage the newest is preempted; if a request preempts itself, everything
        # after it is gone too and the loop ends (Scheduler.decode_all)
        self.decode_all(batch)

    def joining_tokens(self, req: Request, n: int, batch: Batch) -> int | None:
        # vLLM's order: the threshold first (chunked prefill or not), then the no-chunking
        # check against the budget left, then the budget
        threshold = self._threshold
        if 0 < threshold < n:
            n = threshold
        if n > batch.token_budget and not self.chunks_prefill:
            return None
        return min(n, batch.token_budget)

    def _admit_waiting(self, batch: Batch) -> None:
        gate = self.limits.reserve_full_sequence
        skipped: list[Request] = []
        while self.may_admit(batch):
            req = self.waiting[0]
            if req.num_in_flight:
                # async scheduling: preempted while a step of it was in flight, whose output
                # (still delivered) it waits for; the next in line goes on (vLLM's
                # skip_request), and it keeps its place
                skipped.append(self.waiting.popleft())
                continue
            # what is left after the cache hit (looked up only for a request with nothing
            # computed: one landing from a prefill replica brings its KV with it)
            n = self.joining_tokens(
                req, req.num_tokens - (req.num_computed_tokens or self.cached_prefix(req)), batch)
            if n is None or not self.admit(batch, req, n,
                                           gate_tokens=req.num_tokens if gate else None):
                break
        if skipped:
            self.waiting.extendleft(reversed(skipped))
