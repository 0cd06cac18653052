"""Routers: which replica of a pool a request goes to.

A router is a callable ``router(req, replicas) -> replica`` over the live replicas of one pool
(the replicas of a colocated cluster, or the prefill or decode pool of a disaggregated one),
with an attribute ``observes_state``: True when its choice depends on state that changes every
engine step (KV blocks, tokens computed, cached prefixes); False for one that reads only
``index`` and ``num_outstanding`` (or the order of arrivals). The engine then makes sure every
replica's state at the arrival time is exactly the state stepping one iteration per event would
show (docs/cluster.md, "Exactness"). Ties always go to the lowest replica index, so a run is
deterministic.

* ``round_robin``: the next replica in turn;
* ``random``: uniformly at random, from its own seeded stream;

  (these two choose by the order of arrivals alone: ``ahead(n, k)`` routes the next ``n``
  arrivals over ``k`` replicas at once, as ``n`` calls would, so a fast-forwarded colocated
  run with no failures, no pipeline and no client concurrency limit can route its whole
  workload before it starts and run each replica on its own: engine/mode.py)
* ``least_outstanding``: fewest requests routed to it and not yet done (changes only when a
  request arrives, moves or finishes: not per-step state; a colocated cluster behind it runs
  engine/loops.py's counted loop, in which an arrival cuts back only the stretch in flight of
  the replica it goes to);
* ``least_kv`` (per-step state): lowest KV-cache utilisation (blocks used / blocks), then
  fewest outstanding (what a replica with a stretch in flight can tell at any instant:
  ``kv_in_use``, so it runs the counted loop too);
* ``jsq_tokens`` (per-step state): join the shortest queue counted in tokens, the fewest tokens
  of work left (prompt tokens not yet computed plus output tokens not yet generated; a
  stretch in flight tells those too: ``tokens_left``, the counted loop);
* ``prefix_aware`` (per-step state): the most prompt tokens already in its prefix cache
  (cache-aware routing as in SGLang's router and llm-d), ties and replicas without prefix
  caching by ``least_outstanding`` (a stretch in flight replays its named blocks' operations
  up to the step it is at, so the cache it shows is stepping's: the counted loop).

Routers use only duck-typed replica attributes (``index``, ``num_outstanding``,
``scheduler``, ``flight``), so this module imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np

if TYPE_CHECKING:
    from simserve.sched.request import Request

# a replica as routers see it: duck-typed (index, num_outstanding, scheduler)
Replica = Any


class Router(Protocol):
    observes_state: bool
    # optional, ``reads_flights``: for a router that reads only ``index``, ``num_outstanding``
    # and what a stretch in flight can tell at any instant (engine/loops.py's counted loops,
    # synchronous and async, keep them exact), which of those: "kv" (:func:`kv_in_use`), "tokens"
    # (:func:`tokens_left`), "cache" (the prefix cache: :func:`prefix_hit_tokens`)

    def __call__(self, req: Request, replicas: Sequence[Replica]) -> Replica: ...


def _router(observes_state: bool) -> Callable[[Callable[[Request, Sequence[Replica]], Replica]],
                                              Router]:
    """Mark a routing function with whether it reads per-step state (see above)."""
    def mark(fn: Callable[[Request, Sequence[Replica]], Replica]) -> Router:
        setattr(fn, "observes_state", observes_state)  # noqa: B010 (a function attribute)
        return cast(Router, fn)
    return mark

ROUTERS = ("round_robin", "random", "least_outstanding", "least_kv", "jsq_tokens",
           "prefix_aware")

# SeedSequence child of the scenario seed reserved for routers (0-4 are the workload's and the
# s3 policy's; 6 is the fault injector's); one grandchild per pool
ROUTER_SEED_CHILD = 5


class _RoundRobin:
    observes_state = False

    def __init__(self) -> None:
        self.turn = 0

    def __call__(self, req: Request, replicas: Sequence[Replica]) -> Replica:
        replica = replicas[self.turn % len(replicas)]
        self.turn += 1
        return replica

    def ahead(self, n: int, k: int) -> list[int]:
        """The positions among ``k`` replicas that the next ``n`` calls would pick."""
        turn, self.turn = self.turn, self.turn + n
        return [i % k for i in range(turn, turn + n)]


class _Random:
    observes_state = False

    def __init__(self, seed: int, pool: int) -> None:
        seq = np.random.SeedSequence(seed, spawn_key=(ROUTER_SEED_CHILD, pool))
        self.rng = np.random.default_rng(seq)

    def __call__(self, req: Request, replicas: Sequence[Replica]) -> Replica:
        return replicas[int(self.rng.integers(len(replicas)))]

    def ahead(self, n: int, k: int) -> list[int]:
        """The positions among ``k`` replicas that the next ``n`` calls would pick (drawn one
        at a time, as the calls draw them: NumPy promises no more than that)."""
        draw = self.rng.integers
        return [int(draw(k)) for _ in range(n)]


@_router(observes_state=False)
def least_outstanding(req: Request, replicas: Sequence[Replica]) -> Replica:
    return min(replicas, key=lambda r: (r.num_outstanding, r.index))


def kv_in_use(replica: Replica) -> int:
    """The KV blocks a replica uses now, as stepping would show them (after scheduling the step
    it is running): its block manager's count, or, for a stretch in flight in the counted
    loop (not applied yet), the count of the step it is at (``Runtime.settle`` sets it)."""
    f = replica.flight
    if f is not None and f.kv_now >= 0:
        return int(f.kv_now)
    return int(replica.scheduler.blocks.num_used)


@_router(observes_state=True)
def least_kv(req: Request, replicas: Sequence[Replica]) -> Replica:
    def key(r: Replica) -> tuple[float, int, int]:
        return (kv_in_use(r) / r.scheduler.blocks.num_blocks, r.num_outstanding, r.index)
    return min(replicas, key=key)




def outstanding_tokens(replica: Replica) -> int:
    """Tokens of work left on a replica: over every request queued, running or swapped there,
    prompt + output tokens minus the tokens already computed."""
    sched = replica.scheduler
    return sum(r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
               for queue in (sched.waiting, sched.running, sched.swapped) for r in queue)


def tokens_left(replica: Replica) -> int:
    """``outstanding_tokens`` as stepping would show them now: for a stretch in flight in the
    counted loop (not applied yet), as of the step it is at (``Runtime.settle`` sets it)."""
    f = replica.flight
    if f is not None and f.tokens_now >= 0:
        return int(f.tokens_now)
    return outstanding_tokens(replica)


@_router(observes_state=True)
def jsq_tokens(req: Request, replicas: Sequence[Replica]) -> Replica:
    return min(replicas, key=lambda r: (tokens_left(r), r.index))


setattr(least_outstanding, "reads_flights", ())     # noqa: B010 (a function attribute)
setattr(least_kv, "reads_flights", ("kv",))          # noqa: B010
setattr(jsq_tokens, "reads_flights", ("tokens",))    # noqa: B010


def prefix_hit_tokens(replica: Replica, req: Request) -> int:
    """Prompt tokens of ``req`` that this replica's prefix cache would serve right now (0
    without prefix caching). Asks the block manager the way admission does (register the
    content, look the chain up) and forgets the request again (``free`` of a request holding
    no blocks only drops its bookkeeping)."""
    blocks = replica.scheduler.blocks
    if not blocks.caches_prefixes or req.spec.hash_ids is None:
        return 0
    if blocks.held(req.id):            # already there (cannot happen for a new arrival)
        return 0
    blocks.register(req.id, req.num_prompt_tokens, req.spec.hash_ids)
    hit: int = blocks.cached_tokens(req.id, req.num_tokens)
    blocks.free(req.id)
    return hit


@_router(observes_state=True)
def prefix_aware(req: Request, replicas: Sequence[Replica]) -> Replica:
    return min(replicas, key=lambda r: (-prefix_hit_tokens(r, req), r.num_outstanding, r.index))


# a stretch in flight brings its replica's prefix cache to the step it is at (the named
# blocks' operations replayed that far: ``Runtime.settle``), so the counted loop serves it too
setattr(prefix_aware, "reads_flights", ("cache",))   # noqa: B010


def make_router(name: str, seed: int = 0, pool: int = 0) -> Router:
    """A fresh router (routers with state — a turn, a random stream — are one per pool)."""
    if name == "round_robin":
        return _RoundRobin()
    if name == "random":
        return _Random(seed, pool)
    try:
        return {"least_outstanding": least_outstanding, "least_kv": least_kv,
                "jsq_tokens": jsq_tokens, "prefix_aware": prefix_aware}[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; expected one of: "
                         f"{', '.join(ROUTERS)}") from None


def round_robin() -> _RoundRobin:
    return _RoundRobin()
