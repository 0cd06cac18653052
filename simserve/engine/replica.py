"""One replica as the engine runs it: its scheduler and latency model, and its run state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any

from simserve.kv.blocks import BlockManager
from simserve.latency.base import LatencyModel, Pricing
from simserve.metrics.tokens import TokenLog
from simserve.sched.core import Scheduler
from simserve.sched.request import Request
from simserve.sched.async_stretch import AsyncStretch
from simserve.sched.stretch import Stretch


@dataclass(eq=False)
class Replica:
    """A scheduler (with its KV cache), the latency model that prices its steps, and what the
    engine keeps about it while it runs. Routers read ``index``, ``num_outstanding`` and
    ``scheduler`` (cluster/routing.py)."""

    index: int
    scheduler: Scheduler
    latency: LatencyModel
    max_model_len: int
    wakeup: Any = None             # the SimPy event an idle replica sleeps on
    num_outstanding: int = 0       # requests routed to it and not yet done
    group: str = ""
    role: str = "mixed"            # mixed | prefill | decode (docs/cluster.md)
    # a fresh scheduler (with its own empty KV cache) for a restart after a failure
    factory: Callable[[], Scheduler] | None = field(default=None, repr=False)
    up: bool = True
    # micro-batches it may have in flight: its pipeline stages (engine/pipeline.py); 1 without
    depth: int = 1
    # engine bookkeeping: the process, the step or stretch in flight (only tracked when
    # something may cut it short), and the inbox of (time, request id, kind, payload)
    proc: Any = field(default=None, repr=False)
    flight: Flight | None = field(default=None, repr=False)
    inbox: list[tuple[float, int, int, tuple[Any, ...]]] = field(default_factory=list,
                                                                 repr=False)
    tokens: TokenLog | None = field(default=None, repr=False)   # its token log, while running
    # what its latency model offers (latency/base.py), resolved once: given by engine/build.py
    # for the replicas that share a model, else asked of the model here
    priced: InitVar[Pricing | None] = None
    pricing: Pricing = field(init=False, repr=False)

    def __post_init__(self, priced: Pricing | None) -> None:
        self.pricing = priced if priced is not None else Pricing.of(self.latency)
        # policies that decide by predicted step time (FastServe's time quanta) read it
        self.scheduler.latency = self.latency

    @property
    def blocks(self) -> BlockManager:
        return self.scheduler.blocks

    @property
    def batch_queue_depth(self) -> int:
        """Steps in flight at once (vLLM's ``max_concurrent_batches``): 1 is the synchronous
        engine; more runs the replica in ``engine/loops.py``'s ``batch_queue_loop``, whose
        scheduler splits each step into ``launch`` and ``deliver`` (sched/core.py)."""
        return self.scheduler.limits.batch_queue_depth


@dataclass(slots=True)
class Flight:
    """The steps a replica is holding the clock for: their starts and ends (one plain step, or
    a fast-forwarded stretch, which may be cut back while in flight). In the counted loop
    (engine/loops.py) also the ends of the steps at which its requests finish, in order, and
    how many of those the replica's ``num_outstanding`` already counts (``Runtime.settle``),
    and the KV blocks it uses now or its tokens of work left, as stepping would show them
    (``kv_in_use``, ``tokens_left``)."""

    starts: list[float]
    ends: list[float]
    stretch: Stretch | AsyncStretch | None
    finish_ends: list[float] = field(default_factory=list)
    settled: int = 0
    # and, for a router that reads KV use (least_kv), the blocks in use after scheduling each
    # of its steps, and at the step it is at now (-1: not known; the block manager's count)
    used: list[int] | None = None
    kv_now: int = -1
    # for one that reads tokens of work left (jsq_tokens): those now (-1: the queues' count)
    tokens_now: int = -1


Router = Callable[[Request, Sequence[Replica]], Replica]


def rejection_reason(req: Request, replica: Replica) -> str:
    """Why a request can never run on this replica, or "" if it can."""
    max_tokens = req.max_tokens
    if max_tokens > replica.max_model_len:
        return "exceeds_max_model_len"
    blocks = replica.scheduler.blocks
    if blocks.blocks_for(max_tokens) > blocks.num_blocks:
        return "exceeds_kv_capacity"
    return ""
