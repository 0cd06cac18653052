"""LMDeploy: interval rescheduling — decode the running batch, let new prompts in now and then.

Learned from LMDeploy's PyTorch engine (``lmdeploy/pytorch/engine``: ``PytorchEngineConfig.
prefill_interval``, default 16, and the default prefill decision of its inputs maker) and the
interval-rescheduling idea shared with TurboMind's persistent batch. Every step is either a
*reschedule* — waiting prompts admitted whole (FCFS, while the token budget, ``max_num_seqs`` and
free KV blocks allow) and prefilled in a step of their own — or a decode of every running request
(the newest is evicted when blocks run out: recomputed later, or swapped out with
``preemption_mode: swap`` — LMDeploy's ``copy`` eviction — and swapped back in by a later decode
step with room). A reschedule happens when requests wait and any of:

* nothing is running;
* ``schedule_interval`` decode steps have passed since the last reschedule;
* the queue is long beside the batch: ``waiting >= queue_ratio_trigger · running``;
* the batch is small: ``running < low_batch_ratio · max_num_seqs``.

Each reschedule costs ``reschedule_overhead_ms`` on top of its step (``StepPlan.extra_s``): the
host-side work of rebuilding the batch, which interval scheduling amortises.

Not modelled: TurboMind's own loop (its chunked prefill and asynchronous scheduling), decode
look-ahead block preallocation and multi-step decode loops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.params import knob
from simserve.sched.plan import StepPlan


@dataclass(frozen=True)
class LmdeployParams:
    schedule_interval: int = knob(16, min=1)          # LMDeploy's prefill_interval
    queue_ratio_trigger: float = knob(4.0, min=0.0, max=1e6)   # 0 disables the trigger
    low_batch_ratio: float = knob(0.5, min=0.0, max=1.0)
    reschedule_overhead_ms: float = knob(0.0, min=0.0, max=1e9)   # limits.MAX_STEP_S


class Lmdeploy(Scheduler):
    name = "lmdeploy"
    # reschedules are counted in decode steps: every step must be scheduled
    facts = PolicyFacts(chunked=False, params_type=LmdeployParams, monotone_admission=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decodes_since_reschedule = 0

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        if self.waiting and self._reschedule_due():
            self._admit_prompts(batch)
            if batch.entries:
                self.decodes_since_reschedule = 0
                return self._with_overhead(batch)
        i = 0
        while i < len(self.running) and not batch.full:
            if not self.grow_or_preempt(batch, self.running[i], self.running[i].num_remaining):
                break
            i += 1
        if batch.num_preempted == 0:
            self.resume_swapped(batch)      # eviction_type copy (preemption_mode: swap)
        self.decodes_since_reschedule += 1
        return batch.freeze()

    def _reschedule_due(self) -> bool:
        p, running, waiting = self.params, len(self.running), len(self.waiting)
        return (running == 0
                or self.decodes_since_reschedule >= p.schedule_interval
                or 0 < p.queue_ratio_trigger and waiting >= p.queue_ratio_trigger * running
                or running < p.low_batch_ratio * self.limits.max_num_seqs)

    def _admit_prompts(self, batch: Batch) -> None:
        while self.may_admit(batch):
            req = self.waiting[0]
            n = req.num_remaining
            if n > batch.token_budget or not self.admit(batch, req, n):
                return

    def _with_overhead(self, batch: Batch) -> StepPlan:
        plan = batch.freeze()
        if self.params.reschedule_overhead_ms:
            plan = plan._replace(extra_s=self.params.reschedule_overhead_ms / 1000.0)
            batch.plan = plan    # complete() reads the entries of the batch that made the plan
        return plan
