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

from collections import deque
from collections.abc import Generator
from typing import Any

from simserve.engine.clock import Clock
from simserve.engine.replica import Replica
from simserve.engine.runtime import Runtime
from simserve.sched.core import Batch


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


def pipeline_loop(env: Clock, c: Runtime, r: Replica) -> Generator[Any, Any, None]:
    """Run a replica of ``r.depth`` stages (the module docstring)."""
    sched, depth = r.scheduler, r.depth
    stages = Stages(depth)
    flight: deque[tuple[Batch, float]] = deque()   # parked micro-batches and their output times
    latency: Any = r.latency                       # a PipelineLatency (engine/build.py)
    last_end = 0.0                                 # the latest output time scheduled so far
    now = env.now
    while True:
        if len(flight) < depth and sched.has_work:
            plan = sched.schedule()
            if not plan.is_empty:
                entered, out = stages.push(now, *latency.stages(plan))
                if plan.prefill_lens:          # first scheduled: when the device starts it
                    for req in sched.newly_scheduled:
                        req.first_scheduled_s = entered
                start = max(now, last_end)     # the row: from the previous output to this one
                duration = out - start
                c.rec.step(r, start, duration, plan)
                last_end = start + duration
                flight.append((sched.park(), last_end))
                continue                       # fill the queue before waiting on it
        if not flight:
            woken = yield from _idle(env, c, r, now)
            if woken is None:
                return
            now = woken
            continue
        batch, end = flight.popleft()          # wait for the oldest micro-batch's output
        if env.now < end:
            yield env.at(end)
        now = end
        sched.unpark(batch)
        assert batch.plan is not None
        c.finish_steps(r, sched, batch.plan, None, [], now)


def _idle(env: Clock, c: Runtime, r: Replica, now: float) -> Generator[Any, Any, float | None]:
    if env.now < now:
        yield env.at(now)
    if c.finished:
        return None
    r.wakeup = env.event()
    yield r.wakeup
    r.wakeup = None
    return env.now
