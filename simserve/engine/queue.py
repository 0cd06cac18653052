"""The loop of a replica that keeps more than one step in flight (vLLM v1's engine core with a
batch queue, ``vllm/v1/engine/core.py`` ``step_with_batch_queue``), shared by async scheduling
and pipeline parallelism, which differ only by a timing object (:class:`QueueTiming`); and the
idle sleep every loop shares."""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, Protocol

from simserve.engine.clock import Clock
from simserve.engine.replica import Replica

if TYPE_CHECKING:
    from simserve.engine.runtime import Runtime
    from simserve.sched.core import Scheduler
    from simserve.sched.plan import StepPlan


class QueueTiming(Protocol):
    """When a step's output is back and how the scheduler holds a step in flight
    (engine/loops.py's ``AsyncTiming``, engine/pipeline.py's ``PipelineTiming``)."""

    # whether the loop yields to the clock at an output due now (the batch queue does, so
    # events due at the same instant come first; the pipeline does not)
    always_wait: bool
    # whether an empty schedule takes a slot behind the steps in flight, as vLLM's
    # step_with_batch_queue queues whatever schedule() returns: its output is in with the one
    # before it, so it matters only in a queue deeper than 2 (it delays the next micro-batch).
    # With nothing in flight an empty schedule is not queued: the replica sleeps until given
    # work (vLLM spins on empty outputs that are out at once: the same decisions and times)
    queues_empty: bool

    def launch(self, sched: Scheduler, plan: StepPlan, now: float) -> tuple[Any, float]:
        """Price the step scheduled at ``now``, stamp its requests' first scheduling, record
        its step-log row and hand it to the scheduler to hold: what the scheduler holds, and
        when the step's output is back."""
        ...

    def land(self, sched: Scheduler, held: Any, now: float) -> None:
        """The output is back at ``now``: apply it."""
        ...


def queue_loop(env: Clock, c: Runtime, r: Replica, depth: int,
               timing: QueueTiming) -> Generator[Any, Any, None]:
    """Up to ``depth`` steps in flight (the module docstring)."""
    sched = r.scheduler
    queue: deque[tuple[Any, float]] = deque()   # what the scheduler holds, and its output time
    always_wait, queues_empty = timing.always_wait, timing.queues_empty
    steps = 0                                   # of the queue's entries, the real steps
    now = env.now
    while True:
        if len(queue) < depth and sched.has_work:
            plan = sched.schedule()
            if not plan.is_empty:
                queue.append(timing.launch(sched, plan, now))
                steps += 1
                continue                        # fill the queue before waiting on it
            if queues_empty and steps:          # an empty schedule holds a slot (docstring)
                queue.append((None, queue[-1][1]))
                continue
        if not queue:
            woken = yield from sleep(env, c, r, now)
            if woken is None:
                return
            now = woken
            continue
        held, end = queue.popleft()             # wait for the oldest step's output
        if held is None:                        # an empty schedule: out with the one before
            continue
        steps -= 1
        if always_wait or env.now < end:
            yield env.at(end)
        now = end
        timing.land(sched, held, now)


def sleep(env: Clock, c: Runtime, r: Replica, now: float) -> Generator[Any, Any, float | None]:
    """Idle: catch the SimPy clock up, then sleep until someone gives the replica work; the
    time woken, or None when the run is over."""
    if env.now < now:
        yield env.at(now)
    if c.finished:
        return None
    r.wakeup = env.event()
    yield r.wakeup
    r.wakeup = None
    return env.now
