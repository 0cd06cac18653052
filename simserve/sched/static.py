"""Static (request-level) batching: a batch runs until its last member finishes.

The pre-Orca way (FasterTransformer-style serving, a padded ``generate()`` loop): when the
engine is idle it forms a batch of up to ``max_num_seqs`` waiting requests (FIFO, stopping at
the first that does not fit). The batch's whole prompts are prefilled first, packed into steps
of at most ``max_num_batched_tokens`` (a prompt is never split), then all members decode in
lockstep until every one is done. New arrivals wait for the whole batch to drain.

With ``padding: true`` (the default) the batch is a padded tensor, priced and sized as one:

* every decode step also computes a row for each member that has already finished, at the
  step's longest context (``StepPlan.padding``: priced by the latency models, never counted as
  work; Orca §2.2: "early-finished requests cannot return"; the Anyscale continuous-batching
  post);
* its KV cache is dense: every row holds the batch's longest prompt plus its longest output
  (HF ``generate``'s ``[batch, heads, length, head_dim]`` past-key-values; FasterTransformer
  allocates ``[batch, max_seq_len]`` up front). A batch is formed only while
  ``rows × (longest prompt + longest output)`` fits the KV cache, and each member reserves
  that padded length.

``padding: false`` is the optimistic bound: finished members stop costing compute and each
member reserves only its own prompt + output. Not modelled: the compute of padded prompt
positions (each prompt and each live row's context are priced at their own length; with
equal prompts, as in the Anyscale throughput test, there is none), and results held back until
the batch ends (a request finishes at its own last token; in a burst this leaves the batch's
end, and so throughput, unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simserve.kv.blocks import BlockManager
from simserve.sched.batch import SchedulerLimits
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.params import knob
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status


@dataclass(frozen=True)
class StaticParams:
    padding: bool = knob(True)


class Static(Scheduler):
    name = "static"
    facts = PolicyFacts(chunked=False, params_type=StaticParams, monotone_admission=True)

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, params: Any = None,
                 seed: int = 0) -> None:
        super().__init__(limits, blocks, params, seed)
        self._rows = 0      # members of the current batch, finished ones included

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
        plan = batch.freeze()
        if self.params.padding and plan.decode_ctx and not plan.prefill_lens:
            # the rows of members already finished are still computed
            plan = plan._replace(padding=self._rows - len(plan.decode_ctx))
        return plan

    def _form_batch(self) -> None:
        self._rows = 0
        if self.params.padding:
            self._form_padded_batch()
            return
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            req = self.waiting[0]
            if self.blocks.allocate(req.id, req.max_tokens) is None:
                return
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            self._rows += 1

    def _form_padded_batch(self) -> None:
        """FIFO members while ``rows × blocks(longest prompt + longest output)`` fits the free
        blocks; each then reserves that padded length."""
        blocks = self.blocks
        members: list[Request] = []
        prompt = output = 0
        for req in self.waiting:
            if len(members) == self.limits.max_num_seqs:
                break
            p, o = max(prompt, req.num_prompt_tokens), max(output, req.num_output_tokens)
            if (len(members) + 1) * blocks.blocks_for(p + o) > blocks.num_free:
                break
            members.append(req)
            prompt, output = p, o
        for req in members:
            added = blocks.allocate(req.id, prompt + output)
            assert added is not None            # checked to fit above
            self.waiting.popleft()
            req.status = Status.RUNNING
            self.running.append(req)
            self._rows += 1
