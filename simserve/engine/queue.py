"""The loop of a replica that keeps more than one step in flight, and the idle sleep every loop
shares.

vLLM v1's engine core with a batch queue (``vllm/v1/engine/core.py``,
``step_with_batch_queue``) is one loop whatever fills the queue: while it has room and
something can be scheduled, schedule a step and queue it (an empty plan is not queued); when it
is full, or nothing more can be scheduled, wait for the oldest step's output and apply it.
Async scheduling (depth 2, ``engine/loops.py`` :class:`~simserve.engine.loops.AsyncTiming`)
and pipeline parallelism (depth ``p``, ``engine/pipeline.py``
:class:`~simserve.engine.pipeline.PipelineTiming`) differ only in when a step's output is back
and how the scheduler holds a step in flight, which a *timing* object says:

* ``launch(sched, plan, now)``: price the step scheduled at ``now``, stamp its requests' first
  scheduling, record its step-log row, hand it to the scheduler to hold; what the scheduler
  holds and when the step's output is back;
* ``land(sched, held, now)``: the output is back at ``now``: apply it;
* ``always_wait``: whether the loop yields to the clock at an output due now (the batch queue
  does, so events due at the same instant come first; the pipeline does not);
* ``queues_empty``: whether an empty schedule takes a slot behind the steps in flight, as in
  vLLM's ``step_with_batch_queue`` (which queues whatever ``schedule()`` returns, an empty
  output included, and pops the queue oldest first). It costs nothing and its output is in
  with the one before it, so it matters only when it keeps the queue full: with a depth of 2 it
  changes nothing (the next schedule comes when the step before it is out either way); with a
  deeper pipeline it delays the next micro-batch until the ones before it are out. With
  nothing in flight an empty schedule is not queued: the replica sleeps until given work (vLLM
  spins, queueing empty outputs that are out at once: the same decisions at the same times).
"""

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
    always_wait: bool
    queues_empty: bool

    def launch(self, sched: Scheduler, plan: StepPlan, now: float) -> tuple[Any, float]: ...

    def land(self, sched: Scheduler, held: Any, now: float) -> None: ...


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
