"""Fast-forward admission: whether, and how, requests that arrive during a decode stretch join
it (sched/stretch.py's ``join``, for a policy whose facts say ``joins_stretch``)."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

from simserve.kv.blocks import BlockManager
from simserve.sched.batch import SchedulerLimits
from simserve.sched.request import Request


class StretchAdmission:
    """The scheduler's verbs for arrivals joining a stretch (a part of ``Scheduler``,
    sched/core.py)."""

    # what they read and write of the scheduler's state (sched/core.py sets it)
    limits: SchedulerLimits
    blocks: BlockManager
    waiting: deque[Request]

    if TYPE_CHECKING:
        def slots(self, req: Request, n: int) -> int: ...

        def _join(self, req: Request) -> None: ...

    def stretch_admits(self, prompts: list[int], decoding: int,
                       running: int | None = None) -> bool:
        """With ``joins_stretch``: True if ``schedule()``, at a step where the ``decoding``
        running requests all decode and nothing else is running, swapped or waiting but
        requests that just arrived (in that order, none with anything computed) whose prompts
        past their cached prefixes are ``prompts`` tokens, would admit every one of them with
        all of those, KV blocks aside (the stretch makes sure of those:
        ``Stretch.join_hits``). ``running``: the running requests, where more than the
        decoding (async scheduling: those whose last token is in flight are not scheduled
        but hold their ``max_num_seqs`` slot)."""
        raise NotImplementedError

    def admission_order(self, specs: list[Any]) -> list[Any]:
        """With ``joins_stretch``: the requests ``specs``, arriving at once to an empty waiting
        queue, in the order ``schedule()`` would admit them (arrival order unless the policy
        orders its queue)."""
        return specs

    def admits_whole(self, prompts: list[int], decoding: int, threshold: int,
                     running: int | None = None) -> bool:
        """``stretch_admits`` for a policy that, after the ``decoding`` decodes, admits the
        waiting head while ``may_admit`` allows, each with its prompt cut to ``threshold``
        (0: none) and the token budget left (``clip``): all of ``prompts`` come in whole if
        no cut falls on any of them and the budgets and ``max_num_seqs`` hold them all (a
        prompt cut, and those behind it find the budget spent: they do not all join)."""
        limits = self.limits
        budget = limits.max_num_batched_tokens - decoding
        seqs = limits.max_num_seqs - (decoding if running is None else running)
        for p in prompts:
            if budget <= 0 or seqs <= 0 or 0 < threshold < p or p > budget:
                return False
            budget -= p
            seqs -= 1
        return True

    def join_stretch(self, req: Request, n: int, start: float) -> int:
        """Admit the waiting head ``req`` with its ``n`` prompt tokens at a stretch's step
        starting at ``start`` (``stretch_admits`` said ``schedule()`` would); the KV blocks
        it holds then. Its counters, and those blocks, are the stretch's to apply
        (``Stretch.apply``: the block manager still holds the blocks of members that finished
        before this step)."""
        assert self.waiting[0] is req
        self.waiting.popleft()
        self._join(req)
        req.first_scheduled_s = start
        return self.blocks.blocks_for(self.slots(req, n))
