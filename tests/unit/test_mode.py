"""The loop a run's replicas get (engine/mode.py), chosen once, the same way for the simulation
(``engine.simulate``) and the live driver (``simserve serve``)."""

from __future__ import annotations

import pytest

from simserve.cluster.routing import make_router
from simserve.engine import Replica
from simserve.engine.loops import (async_counted_loop, async_solo_loop, batch_queue_loop,
                                   counted_loop, loop_for, solo_loop)
from simserve.engine.mode import (ASYNC_COUNTED, ASYNC_SOLO, BATCH_QUEUE, COUNTED, PIPELINE,
                                  RUN_AHEAD, SOLO, STEPPING, Mode)
from simserve.latency import ConstantLatency
from tests.helpers import make_scheduler

ROUND_ROBIN = make_router("round_robin", 0)
LEAST_KV = make_router("least_kv", 0)
LEAST_OUTSTANDING = make_router("least_outstanding", 0)
JSQ_TOKENS = make_router("jsq_tokens", 0)
PREFIX_AWARE = make_router("prefix_aware", 0)


def replica(i: int = 0, *, role: str = "mixed", async_scheduling: bool = False,
            pp: int = 1) -> Replica:
    sched = make_scheduler("vllm_v1", async_scheduling=async_scheduling,
                           pipeline_parallel_size=pp)
    return Replica(i, sched, ConstantLatency(0.01), 512, role=role, depth=pp,
                   factory=lambda: sched)


def test_one_replica_alone_pulls_its_arrivals():
    m = Mode.of([replica()], True, None, ROUND_ROBIN, None)
    assert (m.loop, m.pull, m.fast_forward, m.tracked) == (SOLO, True, True, False)
    assert loop_for(m) is solo_loop


def test_several_replicas_or_failures_run_ahead_and_stepwise_steps():
    # a router of one's own that reads per-step state without saying what: the replicas run
    # ahead together, every arrival bounding every replica's stretches
    def own(req, replicas):
        return replicas[0]
    m = Mode.of([replica(0), replica(1)], True, None, own, None)
    assert (m.loop, m.routed_ahead, m.tracked) == (RUN_AHEAD, False, False)
    # one that reads only the count of requests a replica holds, or also its KV use, its
    # tokens of work left or its prefix cache: an arrival cuts back the stretch in flight of
    # the replica it goes to (so stretches in flight are tracked)
    for router in (LEAST_OUTSTANDING, LEAST_KV, JSQ_TOKENS, PREFIX_AWARE):
        m = Mode.of([replica(0), replica(1)], True, None, router, None)
        assert (m.loop, m.routed_ahead, m.tracked) == (COUNTED, False, True)
        assert loop_for(m) is counted_loop
    # with failures it runs ahead as the others do; stepwise it steps
    m = Mode.of([replica(0), replica(1)], True, object(), LEAST_OUTSTANDING, None)
    assert m.loop == RUN_AHEAD
    assert Mode.of([replica(0), replica(1)], False, None, LEAST_OUTSTANDING, None).loop == \
        STEPPING
    m = Mode.of([replica()], True, object(), ROUND_ROBIN, None)     # a fault schedule
    assert (m.loop, m.tracked) == (RUN_AHEAD, True)
    m = Mode.of([replica(0), replica(1)], True, object(), ROUND_ROBIN, None)
    assert (m.loop, m.routed_ahead) == (RUN_AHEAD, False)
    assert Mode.of([replica()], False, None, ROUND_ROBIN, None).loop == STEPPING
    assert Mode.of([replica(0), replica(1)], False, None, ROUND_ROBIN, None).loop == STEPPING


def test_replicas_routed_by_arrival_order_alone_each_run_solo():
    # round_robin and random choose by the order of arrivals alone: routed before the run,
    # each replica runs the solo loop over its own arrivals (sync or async)
    for name in ("round_robin", "random"):
        m = Mode.of([replica(0), replica(1), replica(2)], True, None, make_router(name, 0), None)
        assert (m.loop, m.pull, m.routed_ahead, m.tracked) == (SOLO, True, True, False)
        m = Mode.of([replica(0, async_scheduling=True), replica(1, async_scheduling=True)],
                    True, None, make_router(name, 0), None)
        assert (m.loop, m.pull, m.routed_ahead, m.fast_forward) == (ASYNC_SOLO, True, True, True)
    # one replica: no routing to do ahead
    assert not Mode.of([replica()], True, None, ROUND_ROBIN, None).routed_ahead


def test_disaggregation_steps_and_tracks_flights():
    m = Mode.of([replica(0, role="prefill"), replica(1, role="decode")], True, None,
                LEAST_KV, ROUND_ROBIN)
    assert (m.loop, m.disaggregated, m.tracked, m.fast_forward) == (STEPPING, True, True, True)
    # the entry router observes per-step state: a failure bounds a stretch at its end
    assert m.entry_observes and not m.decode_observes and m.fault_end_rule


def test_steps_in_flight_pick_the_queue_loops_for_every_replica():
    # one async replica beside a synchronous one: both run the batch queue (depth 1: stepped)
    m = Mode.of([replica(0, async_scheduling=True), replica(1)], True, None, ROUND_ROBIN, None)
    assert (m.loop, m.fast_forward) == (BATCH_QUEUE, False)
    assert loop_for(m) is batch_queue_loop
    assert Mode.of([replica(pp=2)], True, None, ROUND_ROBIN, None).loop == PIPELINE


def test_one_async_replica_alone_pulls_its_arrivals_and_fast_forwards():
    # async scheduling on one replica: the async solo loop (its decode stretches fast-forward)
    m = Mode.of([replica(async_scheduling=True)], True, None, ROUND_ROBIN, None)
    assert (m.loop, m.pull, m.fast_forward, m.tracked) == (ASYNC_SOLO, True, True, False)
    assert loop_for(m) is async_solo_loop
    # stepwise (--stepwise, the live driver): the batch queue loop, every step an event
    m = Mode.of([replica(async_scheduling=True)], False, None, ROUND_ROBIN, None)
    assert (m.loop, m.pull, m.fast_forward) == (BATCH_QUEUE, False, False)
    # a pipeline: the pipeline loop, stepped
    m = Mode.of([replica(async_scheduling=True, pp=2)], True, None, ROUND_ROBIN, None)
    assert (m.loop, m.fast_forward) == (PIPELINE, False)


@pytest.mark.parametrize("router", [LEAST_OUTSTANDING, LEAST_KV, JSQ_TOKENS, PREFIX_AWARE])
def test_async_replicas_behind_counting_routers_count(router):
    # several async replicas behind a router that reads how many requests each holds, and
    # perhaps what a flight tells of each step (KV use, tokens left, prefix cache): their
    # async stretches fast-forward past arrivals and finishes, held as flights that a request
    # routed to the replica cuts back (tracked); with failures, a mix of async and
    # synchronous replicas, or stepwise, the batch queue loop steps
    m = Mode.of([replica(0, async_scheduling=True), replica(1, async_scheduling=True)],
                True, None, router, None)
    assert (m.loop, m.pull, m.fast_forward, m.tracked) == (ASYNC_COUNTED, False, True, True)
    assert loop_for(m) is async_counted_loop
    # (a router that reads replicas' state and says nothing of flights: stepped)
    def custom(req, replicas):
        return replicas[0]
    custom.observes_state = True
    assert Mode.of([replica(0, async_scheduling=True), replica(1, async_scheduling=True)],
                   True, None, custom, None).loop == BATCH_QUEUE
    assert Mode.of([replica(0, async_scheduling=True), replica(1)], True, None,
                   LEAST_OUTSTANDING, None).loop == BATCH_QUEUE
    assert Mode.of([replica(0, async_scheduling=True), replica(1, async_scheduling=True)],
                   False, None, LEAST_OUTSTANDING, None).loop == BATCH_QUEUE
    with pytest.raises(ValueError, match="batch queue"):
        Mode.of([replica(0, async_scheduling=True), replica(1, async_scheduling=True)], True,
                object(), LEAST_OUTSTANDING, None)


def test_what_is_not_modelled_is_refused():
    with pytest.raises(ValueError, match="batch queue"):
        Mode.of([replica(async_scheduling=True)], False, object(), ROUND_ROBIN, None)
    with pytest.raises(ValueError, match="pipeline-parallel"):
        Mode.of([replica(pp=2)], False, object(), ROUND_ROBIN, None)
