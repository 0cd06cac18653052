"""vLLM v1 priority scheduling: serve the lowest priority value first, preempt the highest.

vLLM's ``--scheduling-policy priority``, learned from vllm/v1/core/sched/scheduler.py and
request_queue.py (``PriorityRequestQueue``): the step is vLLM v1's (running requests first,
then waiting ones, chunked prefill under one budget; see ``vllm_v1``), with two changes:

* waiting requests are served in order of ``(priority, arrival time)`` — a lower value is served
  first, ties by arrival — and a preempted request goes back into that order, not to the front;
* when a running request's blocks do not fit, the victim is the running request with the
  largest ``(priority, arrival time)``, even one already scheduled in this step (its tokens are
  handed back to the budget); if that is the request itself, the walk over running requests
  stops. Requests that arrive at one instant of the simulated clock arrived one after another
  at a real server (its ``arrival_time`` is the wall clock as each comes in): among equals the
  victim is the latest to arrive, the largest id. (vLLM's ``max()`` given equal times keeps the
  first in running order instead, which a real server never meets; with it, requests of one
  priority that arrive together and do not all fit preempt each other in turn, each the one
  that had got furthest, and a run need never end.)

Priorities come from ``workload.classes`` (or a trace's ``priority`` column). A waiting request
never preempts a running one, as in vLLM: it gets in as the running ones finish or are
preempted for blocks.
"""

from __future__ import annotations

from bisect import insort
from typing import Any

from simserve.sched.batch import Batch
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status
from simserve.sched.vllm_v1 import VllmV1


def rank(req: Request) -> tuple[int, float, int]:
    """vLLM's request order: priority, then arrival, then id."""
    return req.spec.priority, req.spec.arrival_s, req.id


def victim_rank(req: Request) -> tuple[int, float, int]:
    """vLLM's preemption order: the running request with the largest of these goes first (ids
    in arrival order: the module docstring)."""
    return req.spec.priority, req.spec.arrival_s, req.id


class Priority(VllmV1):
    name = "priority"
    # as vLLM v1's (arrivals join a stretch, in priority order: admission_order);
    # micro-batches in flight stay in running, a victim may be one in flight
    facts = VllmV1.facts

    def admission_order(self, specs: list[Any]) -> list[Any]:
        # the waiting queue's order (rank) of requests that arrive together
        return sorted(specs, key=lambda s: (s.priority, s.arrival_s, s.request_id))

    def schedule(self) -> StepPlan:
        plan = super().schedule()
        preempted = 0
        while plan.is_empty and plan.num_preempted and self.has_work \
                and not self.steps_in_flight:
            # The lowest-priority request preempted itself first in the running list: vLLM runs
            # this step with nothing scheduled and goes on at the next, which costs no time.
            # (With async scheduling and a step in flight the engine waits for that step's
            # output instead: the empty plan goes back to the engine loop.)
            preempted += plan.num_preempted
            plan = super().schedule()
        if preempted:
            assert self._batch is not None      # schedule() built one
            plan = self._batch.plan = plan._replace(num_preempted=plan.num_preempted + preempted)
        return plan

    def add(self, req: Request) -> None:
        super().add(req)
        self.waiting.pop()
        insort(self.waiting, req, key=rank)

    def preempt(self, batch: Batch, req: Request) -> None:
        super().preempt(batch, req)
        if req.status is Status.WAITING:   # recompute: back in priority order
            self.waiting.popleft()
            insort(self.waiting, req, key=rank)

    def _schedule_running(self, batch: Batch) -> None:
        for req in list(self.running):
            if batch.full:
                return
            if req.status is not Status.RUNNING:
                continue                   # preempted earlier in this walk
            if self.overlap and self.held_in_flight(req):
                continue                   # a token it samples is in flight (held_in_flight)
            n = self.clip(req, req.num_remaining, batch)
            if not self.grow_or_preempt(batch, req, n):
                return

    def preemption_victim(self, batch: Batch, req: Request) -> Request:
        """The lowest-priority running request, even one already scheduled in this step (it
        is taken back out): vLLM's max over (priority, arrival), the latest arrival among
        equals (the module docstring)."""
        victim = max(self.running, key=victim_rank)
        if victim.id in batch.scheduled:
            self._unschedule(batch, victim)
        return victim

    def _unschedule(self, batch: Batch, req: Request) -> None:
        """Take a request back out of the step being built; its tokens return to the budget.
        The batch is rebuilt from its other entries (their counters have not moved since)."""
        kept = [(r, n) for r, n in batch.entries if r is not req]
        counts = batch.num_preempted, batch.swap_out_blocks, batch.swap_in_blocks
        batch.__init__(self.limits)  # type: ignore[misc]  # in place: the caller holds it
        batch.num_preempted, batch.swap_out_blocks, batch.swap_in_blocks = counts
        for r, n in kept:
            batch.add(r, n)
