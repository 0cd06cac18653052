"""``simulate``: a workload run through a set of replicas on the SimPy clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from simserve.clients import ClientGate
from simserve.engine.clock import Clock, EmptySchedule
from simserve.engine.loops import loop_for
from simserve.engine.replica import Replica, Router
from simserve.engine.runtime import Runtime, arrival_process
from simserve.metrics.recorder import Recorder
from simserve.sched.request import Status
from simserve.workload.spec import RequestSpec


def simulate(specs: Sequence[RequestSpec], replicas: Sequence[Replica], router: Router,
             fast_forward: bool = True, *, decode_router: Router | None = None,
             transfer_s: Callable[[int, Replica, Replica], float] | None = None,
             faults: Any = None, on_failure: str = "retry", max_retries: int = 3,
             max_concurrency: int | None = None, compact_requests: bool = False,
             keep_steps: bool = False,
             progress: Callable[[int], None] | None = None) -> Recorder:
    """Run the workload to completion; return what was recorded.

    ``router`` picks among the replicas that take arrivals (role ``mixed`` or ``prefill``);
    with decode replicas present, ``decode_router`` picks among those and ``transfer_s(tokens,
    src, dst)`` prices a KV handoff. ``faults`` is a ``faults.FaultSchedule`` (replicas need a
    ``factory`` then); ``on_failure`` and ``max_retries`` say what happens to the requests a
    failed replica held. Every request ends finished, rejected or failed. ``max_concurrency``
    limits the requests in flight as a benchmark client does (simserve/clients.py; stepped),
    a slot freeing the replicas' front-end delay (``latency.frontend_delay_s``) after the end.
    ``compact_requests`` keeps only the requests in flight as objects (``Recorder.requests``),
    the resolved ones as columns (``Recorder.resolved``): memory O(requests in flight); with
    it, a long run's oldest steps are folded into their sums (``Recorder.fold``) unless
    ``keep_steps``.
    ``progress`` is called with the number of requests resolved so far, as they are.
    """
    env = Clock()
    rec = Recorder(compacting=compact_requests, folding=compact_requests and not keep_steps)
    rec.resolved.keep_tracks = all(r.scheduler.record_tokens for r in replicas)
    if max_concurrency is not None:
        fast_forward = False       # an arrival that waits on a finish is not known ahead
    c = Runtime(env, rec, specs, replicas, router, fast_forward, decode_router, transfer_s,
                 faults, on_failure, max_retries)
    if max_concurrency is not None:
        # the replicas' front-end delay (one for all: runner.run refuses differing ones)
        delay = max(r.pricing.frontend_delay_s for r in replicas)
        c.gate = ClientGate(max_concurrency, delay)
    c.progress = progress
    loop = loop_for(c.mode)
    for r in replicas:
        r.proc = env.process(loop(env, c, r))
    if not c.mode.pull:
        env.process(arrival_process(env, c))
    if faults is not None:
        for t, i, restart in faults.initial():
            c.add_fault(t, replicas[i], restart)
    step = env.step
    try:
        while not c.finished:
            step()
    except EmptySchedule:   # nothing can happen any more: only a scheduler deadlock gets here
        pass
    for req in rec.requests:   # anything left can never be scheduled: count it, never drop it
        if req.status not in (Status.FINISHED, Status.REJECTED, Status.FAILED):
            req.status = Status.REJECTED
            req.reject_reason = "unschedulable"
    if c.arrival_order is not None:   # (each replica took its own arrivals: back in the
        rec.requests.sort(key=c.arrival_order)   # workload's order, as stepping adds them)
    return rec
