"""A pipeline-parallel replica: up to ``p`` micro-batches in flight (``p + 1`` with async
scheduling), each stage working on one at a time, run by ``engine/queue.py``'s loop with
:class:`PipelineTiming`. Learned from vLLM v1's ``step_with_batch_queue``
(``vllm/v1/engine/core.py``), its scheduler and AsyncScheduler under PP
(``vllm/v1/core/sched/``) and, for the policies that park, Sarathi-Serve's pipeline engine.
What is modelled, the stage timing and what is assumed: docs/scenario.md (pipeline
parallelism); the bubbles it leaves: docs/metrics.md."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from simserve.engine.clock import Clock
from simserve.engine.queue import queue_loop
from simserve.engine.replica import Replica
from simserve.engine.runtime import Runtime
from simserve.sched.batch import Batch
from simserve.sched.core import Scheduler
from simserve.sched.inflight import InFlight
from simserve.sched.plan import StepPlan


class Stages:
    """When each stage is next free; :meth:`push` runs one micro-batch through them.

    It also keeps the stages' *bubbles*: ``busy[j]``, the seconds stage j computed, and
    ``in_flight``, the seconds at least one micro-batch was between entering the first stage
    and leaving the last (the union of those spans: micro-batches enter and leave in order, so
    they overlap only with the span before): stage j idled ``in_flight - busy[j]`` of the time
    the pipeline had work (:meth:`bubbles`)."""

    def __init__(self, p: int):
        self.free = [0.0] * p
        self.busy = [0.0] * p
        self.in_flight = 0.0
        self._span = (0.0, 0.0)      # the current run of overlapping spans: (start, end)

    def push(self, start: float, times: list[float], sends: list[float]
             ) -> tuple[float, float]:
        """When a micro-batch scheduled at ``start`` enters the first stage (it waits for the
        stage to be free) and when it leaves the last."""
        free, busy, t = self.free, self.busy, start
        last = len(free) - 1
        entered = start
        for j, stage in enumerate(times):
            if free[j] > t:
                t = free[j]
            if j == 0:
                entered = t
            t += stage
            busy[j] += stage
            free[j] = t
            if j < last:
                t += sends[j]
        a, b = self._span
        if entered <= b:              # overlaps the run so far: it grows
            self._span = (a, t if t > b else b)
        else:
            self.in_flight += b - a
            self._span = (entered, t)
        return entered, t

    def bubbles(self) -> tuple[float, list[float]]:
        """The seconds the pipeline had work (``in_flight``, the current run included) and
        each stage's idle seconds within them."""
        a, b = self._span
        total = self.in_flight + (b - a)
        return total, [total - s for s in self.busy]


class PipelineTiming:
    """:func:`~simserve.engine.queue.queue_loop`'s timing for a pipelined replica: a
    micro-batch runs through :class:`Stages`; the scheduler holds it in flight with
    ``launch``/``deliver`` (``pipeline_launch``: vLLM v1) or parks its requests."""

    always_wait = False

    def __init__(self, c: Runtime, r: Replica):
        self.rec, self.r = c.rec, r
        self.finish_steps = c.finish_steps
        self.deliver_step = c.deliver_step
        self.stages = Stages(r.depth)
        c.rec.stages[r.index] = self.stages     # (its bubbles: the summary's)
        stages = r.pricing.stages               # a PipelineLatency's (engine/build.py)
        if stages is None:
            raise ValueError(f"replica {r.index}: a pipeline-parallel replica's latency model "
                             "prices stages (latency/pipeline.py)")
        self.stage_times = stages
        self.last_end = 0.0                     # the latest output time scheduled so far
        # vLLM v1's engine core (module docstring); Sarathi-Serve's skips empty schedules
        sched = r.scheduler
        self.launches = self.queues_empty = sched.facts.pipeline_launch
        if self.launches and sched.limits.pipeline_parallel_size != r.depth:
            raise ValueError(f"replica {r.index}: {r.depth} stages, but its scheduler was built "
                             f"for pipeline_parallel_size {sched.limits.pipeline_parallel_size}")
        # async scheduling (vLLM's V2 model runner): a queue of p + 1, and each micro-batch's
        # CPU part (the base model's cpu_s: its overhead and per-sequence costs) ahead of
        # stage 0, one at a time
        self.async_cpu = self.launches and sched.limits.async_scheduling
        if sched.limits.async_scheduling and not self.launches:
            raise ValueError(f"replica {r.index}: async scheduling with pipeline parallelism "
                             f"needs a policy that launches micro-batches (vLLM v1's)")
        self.depth = sched.limits.pipeline_queue_depth if self.launches else r.depth
        self.cpu_s = r.pricing.cpu_s   # (a PipelineLatency's: its base model's CPU part)
        self.cpu_free = c.env.now               # when the CPU is done with the CPU parts so far

    def launch(self, sched: Scheduler, plan: StepPlan, now: float
               ) -> tuple[Batch | InFlight, float]:
        times, sends = self.stage_times(plan)
        if self.async_cpu:
            return self._launch_async(sched, plan, now, times, sends)
        entered, out = self.stages.push(now, times, sends)
        if plan.prefill_lens:                  # first scheduled: when the device starts it
            for req in sched.newly_scheduled:
                req.first_scheduled_s = entered
        end = self._row(plan, now, out)
        return (sched.launch(plan) if self.launches else sched.park()), end

    def _launch_async(self, sched: Scheduler, plan: StepPlan, now: float, times: list[float],
                      sends: list[float]) -> tuple[InFlight, float]:
        """With async scheduling (the module docstring): the CPU part, then the stages once
        every input token of the micro-batch is out of the last stage."""
        cpu = self.cpu_s(plan)
        cpu = cpu if cpu < times[0] else times[0]
        times[0] -= cpu
        ready = self.cpu_free = (self.cpu_free if self.cpu_free > now else now) + cpu
        entries = sched.batch_entries(plan)
        for req, _ in entries:                 # (a token delivered already: in the past)
            if req.token_out_s > ready:
                ready = req.token_out_s
        entered, out = self.stages.push(ready, times, sends)
        if plan.prefill_lens:                  # first scheduled: when the device starts it
            for req in sched.newly_scheduled:
                req.first_scheduled_s = entered
        end = self._row(plan, now, out)
        step = sched.launch(plan)
        for req in step.sampled:               # its next decode's input
            req.token_out_s = end
        return step, end

    def _row(self, plan: StepPlan, now: float, out: float) -> float:
        """Record the micro-batch's step-log row, from the previous output (or ``now``) to its
        own; its output time."""
        start = max(now, self.last_end)
        duration = out - start
        self.rec.step(self.r, start, duration, plan)
        self.last_end = start + duration
        return self.last_end

    def land(self, sched: Scheduler, held: Batch | InFlight, now: float) -> None:
        if isinstance(held, InFlight):
            self.deliver_step(self.r, sched, held, now)
            return
        sched.unpark(held)
        assert held.plan is not None
        self.finish_steps(self.r, sched, held.plan, None, [], now)


def pipeline_loop(env: Clock, c: Runtime, r: Replica) -> Generator[Any, Any, None]:
    """Run a replica of ``r.depth`` stages (the module docstring)."""
    timing = PipelineTiming(c, r)
    return queue_loop(env, c, r, timing.depth, timing)
