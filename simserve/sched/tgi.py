"""Hugging Face TGI: a running batch that new requests join only under back-pressure or a wait.

Learned from text-generation-inference ``backends/v3/src/backend.rs`` (``batching_task``) and
``backends/v3/src/queue.rs`` (``State::next_batch``). With nothing running, the queue's head
requests form a batch (FCFS, whole prompts) and are prefilled. Then, before every decode step,
the router tries to add a new batch::

    min_size = None                                  if waiting_tokens >= max_waiting_tokens
               floor(batch_size · waiting_served_ratio)   otherwise

``next_batch`` takes queue entries in order while their prompts fit ``max_batch_prefill_tokens``,
prompt + output fit what ``max_batch_total_tokens`` leaves beside the running batch, and the
block allocator can reserve KV for the *whole* output (TGI never preempts); it gives up (adds
nobody) when fewer than ``min_size`` requests would join. A joining batch is prefilled in a step
of its own — the running batch's decodes pause for it — and the next step is a decode of
everyone; ``waiting_tokens`` (decode steps since the last join) is then reset to 1.

Not modelled: TGI v3's chunked prefill (a backend option) and prefix caching (its radix trie),
speculation, the block-size padding of the prefill budget, and validation-time rejection of
prompts over ``max_input_tokens`` (a prompt longer than ``max_batch_prefill_tokens`` waits
forever and ends as ``unschedulable``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.params import knob
from simserve.sched.plan import StepPlan


@dataclass(frozen=True)
class TgiParams:
    """TGI launcher flags of the same names (defaults as TGI's where it has one)."""

    waiting_served_ratio: float = knob(0.3, min=0.0, max=1e6)
    max_waiting_tokens: int = knob(20, min=1)
    # None: the engine's max_num_batched_tokens (the step budget)
    max_batch_prefill_tokens: int | None = knob(None, min=1)
    # None: inferred from the KV cache, as TGI does (the block allocator is the only limit)
    max_batch_total_tokens: int | None = knob(None, min=1)


class Tgi(Scheduler):
    name = "tgi"
    # joins depend on waiting_tokens, a count of decode steps: every step must be scheduled
    facts = PolicyFacts(chunked=False, params_type=TgiParams, monotone_admission=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting_tokens = 0      # decode steps since the running batch last grew
        self.decode_due = False      # a join was just prefilled: the next step decodes

    def schedule(self) -> StepPlan:
        batch = self.new_batch()
        if not self.running:                       # the outer loop: a fresh batch, any size
            if self._next_batch(batch, min_size=None):
                self.waiting_tokens, self.decode_due = 1, False
            return batch.freeze()
        if not self.decode_due and self._next_batch(batch, self._min_size()):
            self.waiting_tokens, self.decode_due = 1, True
            return batch.freeze()                  # prefill-only: decodes pause for the join
        for req in self.running:                   # reserved at admission: always fits
            self.grow(batch, req, 1)
        self.waiting_tokens += 1
        self.decode_due = False
        return batch.freeze()

    def _min_size(self) -> int | None:
        p: TgiParams = self.params
        if self.waiting_tokens >= p.max_waiting_tokens:
            return None
        return math.floor(len(self.running) * p.waiting_served_ratio)

    def _next_batch(self, batch: Batch, min_size: int | None) -> bool:
        """Admit a new batch as ``queue.rs`` ``next_batch`` does; False if none joined."""
        size = self._batch_size()
        if size == 0 or (min_size is not None and size < min_size):
            return False   # too small: TGI puts the entries back and keeps decoding
        for _ in range(size):
            req = self.waiting[0]
            # KV for the whole output; the last sampled token is never fed back
            self.admit(batch, req, req.num_remaining, reserve_tokens=req.max_tokens - 1)
        return True

    def _batch_size(self) -> int:
        """How many queue-head requests fit the prefill and total budgets and the KV blocks."""
        p, limits = self.params, self.limits
        prefill_budget = min(p.max_batch_prefill_tokens or limits.max_num_batched_tokens,
                             limits.max_num_batched_tokens)
        # a decode step feeds every running request one token: keep it within the step budget
        max_size = min(limits.max_num_seqs, limits.max_num_batched_tokens) - len(self.running)
        total_left = (p.max_batch_total_tokens - sum(r.max_tokens for r in self.running)
                      if p.max_batch_total_tokens is not None else math.inf)
        free = self.blocks.num_free
        size = prefill = total = 0
        for req in self.waiting:
            if size >= max_size:
                break
            prefill += req.num_prompt_tokens
            total += req.max_tokens
            need = self.blocks.blocks_for(req.max_tokens - 1)
            if prefill > prefill_budget or total > total_left or need > free:
                break
            free -= need
            size += 1
        return size
