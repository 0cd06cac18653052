"""How a run's replicas are stepped, decided once from the cluster's shape: which loop runs
them (engine/loops.py's ``loop_for``, for the simulation and the live driver alike) and what
can disturb a step in flight. docs/architecture.md (the engine) says when each loop is used."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simserve.engine.replica import Replica, Router

# the loops (engine/loops.py, engine/pipeline.py)
SOLO, RUN_AHEAD, STEPPING, BATCH_QUEUE, ASYNC_SOLO, PIPELINE, COUNTED, ASYNC_COUNTED = (
    "solo", "run_ahead", "stepping", "batch_queue", "async_solo", "pipeline", "counted",
    "async_counted")


@dataclass(frozen=True, slots=True)
class Mode:
    loop: str               # which loop runs every replica (one of the names above)
    fast_forward: bool      # decode stretches priced and applied at once
    disaggregated: bool     # prefill and decode pools, the KV handed from one to the other
    tracked: bool           # a step in flight may be cut short (a KV landing, a failure, an
                            # arrival routed to it: the counted loop)
    entry_observes: bool    # the entry router reads per-step state (KV use, tokens left...)
    decode_observes: bool   # the decode router does
    # several replicas run the solo loops, each over its own arrivals, routed before the run
    # (a router that chooses by the order of arrivals alone: ``ahead``, cluster/routing.py)
    routed_ahead: bool = False

    @property
    def pull(self) -> bool:
        """Each replica takes its arrivals itself (the solo loops): no arrival process."""
        return self.loop in (SOLO, ASYNC_SOLO)

    @property
    def fault_end_rule(self) -> bool:
        """A failure's time bounds a stretch at its end, not its start: a router observes."""
        return self.entry_observes or (self.disaggregated and self.decode_observes)

    @classmethod
    def of(cls, replicas: Sequence[Replica], fast_forward: bool, faults: Any,
           router: Router, decode_router: Router | None) -> Mode:
        disaggregated = any(r.role == "decode" for r in replicas)
        # a replica with more than one step in flight (async scheduling) or pipeline-parallel
        # stages is stepped, each step its own event; arrivals come from the arrival process
        batch_queue = any(r.batch_queue_depth > 1 for r in replicas)
        pipelined = any(r.depth > 1 for r in replicas)
        if batch_queue and (disaggregated or faults is not None):
            raise ValueError("a batch queue (async scheduling) is not modelled with "
                             "disaggregation or failures")
        if pipelined and (disaggregated or faults is not None):
            raise ValueError("pipeline-parallel replicas run colocated, without failures")
        # several replicas, no failures, and a router that chooses by the order of arrivals
        # alone (round_robin, random): where each arrival goes is known before the run, and
        # nothing else passes between the replicas, so each runs as a lone replica would over
        # its own arrivals (its steps, its clock), routed ahead
        ahead = (len(replicas) > 1 and faults is None and not disaggregated
                 and hasattr(router, "ahead"))
        # async scheduling on one replica (a batch queue of two, no pipeline), or on several
        # routed ahead, takes its arrivals itself and fast-forwards decode stretches
        # (sched/async_stretch.py)
        async_solo = (fast_forward and batch_queue and not pipelined and faults is None
                      and (len(replicas) == 1 or ahead)
                      and all(r.batch_queue_depth == 2 for r in replicas))
        # several, colocated, behind a router that reads only how many requests each holds
        # (least_outstanding), or what an async stretch tells of each step (least_kv,
        # jsq_tokens, prefix_aware): async stretches past arrivals and finishes, cut back
        # where a request is routed (engine/loops.py's async_counted_loop)
        counts = (not getattr(router, "observes_state", True)
                  or getattr(router, "reads_flights", None) is not None)
        async_counted = (fast_forward and batch_queue and not pipelined and faults is None
                         and not disaggregated and len(replicas) > 1 and not ahead and counts
                         and all(r.batch_queue_depth == 2 for r in replicas))
        fast_forward = fast_forward and (not batch_queue or async_solo or async_counted)
        run_ahead = fast_forward and not disaggregated and not pipelined and not batch_queue
        if pipelined:
            loop = PIPELINE
        elif async_solo:
            loop = ASYNC_SOLO
        elif async_counted:
            loop = ASYNC_COUNTED
        elif batch_queue:
            loop = BATCH_QUEUE
        elif run_ahead and faults is None and len(replicas) > 1 and not ahead and counts:
            # several replicas behind a router that reads only the count of requests each
            # holds (least_outstanding), which changes when a request arrives or finishes, or
            # also the KV blocks each uses (least_kv), its tokens of work left (jsq_tokens) or
            # its prefix cache (prefix_aware), which a stretch knows at each step (with prefix
            # caching its named blocks' operations replayed that far), no failures: each
            # replica prices its
            # stretches past other replicas' arrivals and its own finishes, an arrival cuts
            # back only the stretch in flight of the replica it goes to, and what the router
            # reads of the stretches in flight is brought to the arrival's instant before it
            # looks (engine/loops.py's counted_loop)
            loop = COUNTED
        elif run_ahead and faults is None and (len(replicas) == 1 or ahead):
            # one replica, nothing else going on: nothing can happen between two of its step
            # boundaries but arrivals, and where an arrival goes is forced, so the replica
            # takes the arrivals due by each boundary itself (as the URGENT arrival events
            # would have, in the same order) and never waits on the SimPy clock but to sleep
            # (several routed ahead: each so, over its own arrivals)
            loop = SOLO
        else:
            loop = RUN_AHEAD if run_ahead else STEPPING
        return cls(loop, fast_forward, disaggregated,
                   tracked=disaggregated or faults is not None or loop in (COUNTED,
                                                                             ASYNC_COUNTED),
                   entry_observes=getattr(router, "observes_state", True),
                   decode_observes=getattr(decode_router, "observes_state", True),
                   routed_ahead=ahead and loop in (SOLO, ASYNC_SOLO))
