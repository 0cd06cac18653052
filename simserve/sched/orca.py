"""Orca iteration-level batching (Yu et al., OSDI'22), with whole-length KV reservation.

Every iteration all running requests advance one token and waiting requests may join with their
whole prompt (no chunking; prefill and decode tokens share the iteration). As in the vLLM
paper's description of Orca, each admitted request reserves KV memory up front, so there is
never a preemption, but fewer requests fit. The reservation modes are the vLLM paper's
(§6.1), for the prompt plus:

- ``oracle``: the true output length;
- ``pow2``: the output length rounded up to a power of two ("if the true output length is 25,
  it reserves 32 positions");
- ``max``: up to the model's maximum sequence length (``max_model_len``, 2048 for OPT).

``allocator: buddy`` stores each reservation as one contiguous chunk from a buddy allocator
(``kv/buddy.py``: rounded up to a power of two of blocks, admission blocked when no free region
is large enough), the memory management the vLLM paper assumes for Orca; ``paged`` (default)
counts blocks only, without contiguity. A reservation never exceeds ``max_model_len`` nor the
KV pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simserve.kv.blocks import BlockManager
from simserve.kv.buddy import BuddyBlockManager, pow2_at_least
from simserve.sched.batch import SchedulerLimits
from simserve.sched.core import Scheduler
from simserve.sched.facts import PolicyFacts
from simserve.sched.params import knob
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request

RESERVATIONS = ("oracle", "pow2", "max")
ALLOCATORS = ("paged", "buddy")


@dataclass(frozen=True)
class OrcaParams:
    reservation: str = knob("oracle", choices=RESERVATIONS)
    allocator: str = knob("paged", choices=ALLOCATORS)


class Orca(Scheduler):
    name = "orca"
    facts = PolicyFacts(chunked=False, params_type=OrcaParams, monotone_admission=True,
                        pipelines=True)

    def __init__(self, limits: SchedulerLimits, blocks: BlockManager, params: Any = None,
                 seed: int = 0) -> None:
        super().__init__(limits, blocks, params, seed)
        if self.params.allocator == "buddy" and not isinstance(blocks, BuddyBlockManager):
            if blocks.caches_prefixes or blocks.num_used:
                raise ValueError("orca's buddy allocator needs an empty, non-caching KV pool")
            self.blocks = BuddyBlockManager(blocks.num_blocks, blocks.block_size)

    def reservation(self, req: Request) -> int:
        """KV tokens reserved for ``req`` at admission (its true length at least)."""
        mode, cap = self.params.reservation, self.limits.max_model_len or req.max_tokens
        cap = min(cap, self.blocks.num_blocks * self.blocks.block_size)   # never past the pool
        if mode == "max":
            want = cap
        elif mode == "pow2":
            want = req.num_prompt_tokens + pow2_at_least(max(1, req.num_output_tokens))
        else:
            want = req.max_tokens
        return max(req.max_tokens, min(want, cap))

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
                                                         reserve_tokens=self.reservation(req)):
                break
        return batch.freeze()
