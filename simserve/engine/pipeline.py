"""A pipeline-parallel replica: up to ``p`` micro-batches in flight, one per stage.

Learned from vLLM v1 (``vllm/v1/engine/core.py``, ``step_with_batch_queue``; the queue's size
is ``max_concurrent_batches`` = ``pipeline_parallel_size`` in ``vllm/config/vllm.py``). The
engine keeps a FIFO of at most ``p`` scheduled micro-batches. While it is not full it schedules
another at once, from the requests not in flight; when it is full, or nothing more can be
scheduled, it waits for the oldest micro-batch's output, applies it, and tries again. A request
in a micro-batch in flight is not scheduled again until that micro-batch's output is back
(``Scheduler.park`` / ``unpark``): a decode needs the token it samples, which reaches the first
stage only with the next schedule (vLLM v1 sends sampled tokens back through the scheduler under
PP; Sarathi-Serve keeps a sequence "paused" while in flight, ``sarathi/core/scheduler/``).
vLLM v1 would schedule the next prefill chunk of a request whose earlier chunk is still in
flight; here the request waits (a deviation: it matters for a lone long prompt). Sarathi-Serve
also caps the micro-batches in flight at the stages, but forms the next one when a micro-batch
leaves the first stage (``pipeline_parallel_llm_engine.py``) rather than at once: here every
policy forms it at once, vLLM's way (it then waits for the first stage).

Timing: each stage works on one micro-batch at a time, in order; a micro-batch enters stage j
when it has left stage j − 1 (plus the activations' send) and stage j is free::

    enter_0 = max(scheduled, free_0)
    enter_j = max(leave_{j-1} + send_{j-1}, free_j),   leave_j = enter_j + stage_j

Its output is back at ``leave_{p-1}``. At steady state with every micro-batch alike (stage time
s, sends negligible) one micro-batch completes every ``s`` and each takes ``p · s`` from
scheduling to output; *bubbles* are stage time lost when fewer than ``p`` micro-batches can be
formed (few requests: each waits for its own output) or stages are unbalanced (a large
micro-batch followed by a small one: the small one waits on the large one stage after stage).

What the step log records: a micro-batch's row spans from the previous micro-batch's output (or
its own scheduling, if later) to its own output, so the rows tile the replica's time without
overlap and the sums the metrics make (busy time, time-weighted levels) stay meaningful; a
row's duration is the replica's output cadence, not the micro-batch's latency. A request is
first scheduled when its first micro-batch enters stage 0 (``enter_0``), as the other loops
stamp the device's start. Pipelined
replicas step (no fast-forward): every micro-batch is its own event.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from simserve.engine.clock import Clock
from simserve.engine.queue import queue_loop
from simserve.engine.replica import Replica
from simserve.engine.runtime import Runtime
from simserve.sched.core import Batch, Scheduler
from simserve.sched.plan import StepPlan


class Stages:
    """When each stage is next free; :meth:`push` runs one micro-batch through them."""

    def __init__(self, p: int):
        self.free = [0.0] * p

    def push(self, start: float, times: list[float], sends: list[float]
             ) -> tuple[float, float]:
        """When a micro-batch scheduled at ``start`` enters the first stage (it waits for the
        stage to be free) and when it leaves the last."""
        free, t = self.free, start
        last = len(free) - 1
        entered = start
        for j, stage in enumerate(times):
            if free[j] > t:
                t = free[j]
            if j == 0:
                entered = t
            t += stage
            free[j] = t
            if j < last:
                t += sends[j]
        return entered, t


class PipelineTiming:
    """:func:`~simserve.engine.queue.queue_loop`'s timing for a pipelined replica: a
    micro-batch runs through :class:`Stages`, its requests parked while it is in flight."""

    always_wait = False

    def __init__(self, c: Runtime, r: Replica):
        self.rec, self.r = c.rec, r
        self.finish_steps = c.finish_steps
        self.stages = Stages(r.depth)
        self.latency: Any = r.latency           # a PipelineLatency (engine/build.py)
        self.last_end = 0.0                     # the latest output time scheduled so far

    def launch(self, sched: Scheduler, plan: StepPlan, now: float) -> tuple[Batch, float]:
        entered, out = self.stages.push(now, *self.latency.stages(plan))
        if plan.prefill_lens:                  # first scheduled: when the device starts it
            for req in sched.newly_scheduled:
                req.first_scheduled_s = entered
        start = max(now, self.last_end)        # the row: from the previous output to this one
        duration = out - start
        self.rec.step(self.r, start, duration, plan)
        self.last_end = start + duration
        return sched.park(), self.last_end

    def land(self, sched: Scheduler, batch: Batch, now: float) -> None:
        sched.unpark(batch)
        assert batch.plan is not None
        self.finish_steps(self.r, sched, batch.plan, None, [], now)


def pipeline_loop(env: Clock, c: Runtime, r: Replica) -> Generator[Any, Any, None]:
    """Run a replica of ``r.depth`` stages (the module docstring)."""
    return queue_loop(env, c, r, r.depth, PipelineTiming(c, r))
