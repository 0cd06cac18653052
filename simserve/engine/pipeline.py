"""A pipeline-parallel replica: up to ``p`` micro-batches in flight, one per stage.

Learned from vLLM v1 (``vllm/v1/engine/core.py``, ``step_with_batch_queue``; the queue's size
is ``max_concurrent_batches`` = ``pipeline_parallel_size`` in ``vllm/config/vllm.py``, one more
with async scheduling: below). The engine keeps a FIFO of at most ``p`` scheduled
micro-batches. While it is not full it schedules
another at once; when it is full, or nothing more can be scheduled, it waits for the oldest
micro-batch's output, applies it, and tries again. vLLM queues an empty schedule too, behind
the micro-batches in flight: it holds a slot until the ones before it are out
(:func:`~simserve.engine.queue.queue_loop`, ``queues_empty``; with ``p`` = 2 that changes
nothing, with more stages it delays the next micro-batch).

Which requests a micro-batch may take while others are in flight depends on the policy:

* ``vllm_v1``, ``priority`` and ``vllm_native`` (``PolicyFacts.pipeline_launch``): as vLLM v1's
  ``Scheduler.schedule`` (``vllm/v1/core/sched/scheduler.py``, 0.32), which advances a
  scheduled request's ``num_computed_tokens`` at once. A request whose scheduled tokens reach
  its ``num_tokens`` (a decode, or a prompt's last chunk) then asks for no tokens and is skipped
  until its sampled token is back (``Scheduler.held_in_flight``; under PP the scheduler sends
  sampled tokens back to the first stage, ``_make_cached_request_data``); a prompt chunk that
  leaves some of the prompt samples nothing, so the prompt's next chunk is scheduled at once,
  while the previous one is still in flight. Requests in flight stay in ``running`` (they count
  against ``max_num_seqs`` and may be preempted; their output is then stale, still
  delivered, and the request is not admitted again until it is: as async scheduling's).
* ``vllm_v0``, ``sarathi`` and ``orca`` (Sarathi-Serve's pipeline engine, which the paper's
  baselines ran on): a request in a micro-batch in flight is not scheduled again until that
  micro-batch's output is back (``Scheduler.park`` / ``unpark``): Sarathi-Serve pauses a
  sequence only when its step completes (``sarathi/core/sequence_manager/
  base_sequence_manager.py``, ``on_step_completed``) and its schedulers skip sequences not
  paused, a prompt's next chunk included (``sarathi/core/scheduler/sarathi_scheduler.py``).
  Sarathi-Serve also forms the next micro-batch when one leaves the first stage
  (``pipeline_parallel_llm_engine.py``) rather than at once, and queues no empty schedule:
  here these policies form it at once (it then waits for the first stage).

With ``engine.async_scheduling`` (``vllm_v1``, ``priority``, ``vllm_native``): vLLM 0.32's
default with PP on GPUs, its V2 model runner with async scheduling. Learned from
``vllm/config/vllm.py`` (``max_concurrent_batches``: ``p + 1`` with async scheduling on the V2
runner), ``vllm/v1/core/sched/async_scheduler.py`` (``decode_stagger`` = p;
``_update_after_schedule`` sets ``next_decode_eligible_step``) and ``scheduler.py``
(``schedule`` counts its calls in ``current_step``, an empty schedule's too, and skips a
running request before its eligible step):

* the batch queue holds ``p + 1`` schedules (``SchedulerLimits.pipeline_queue_depth``), an
  empty one taking a slot as above;
* the scheduler counts output placeholders as async scheduling does (``Scheduler.launch``): a
  request whose token is in flight asks for one more token (a decode ahead of its token), not
  for none; but a request that samples in the micro-batch of ``schedule()`` call n is skipped
  until call n + p (``Scheduler.held_in_flight``, ``decode_stagger``). So each running request
  rides in every p-th schedule at most, the cadence of the V2 runner's ring of sampled-token
  slots; a prompt's chunks that sample nothing are not throttled.

Timing with async scheduling (what vLLM's code does not fix: assumptions, stated here):

* each micro-batch's CPU part (the base latency model's ``cpu_s(plan)``, else its
  ``step_overhead_s``: scheduling, input preparation and a cost per sampled sequence, which
  the synchronous pipeline prices inside stage 0) runs on one engine
  thread, one micro-batch at a time, from its scheduling or once the CPU part before it is
  done, overlapping the stages' work (as :class:`~simserve.engine.loops.AsyncTiming` without
  PP); stage 0 then does the rest of its work. The extra slot of the queue is this: ``p``
  micro-batches on the stages and one being prepared;
* a decode scheduled while its input token is in flight cannot enter stage 0 before that token
  is out of the last stage (``Request.token_out_s``: the output time of the micro-batch that
  samples it; the V2 runner hands sampled tokens from the last stage to the first directly, a
  transfer priced at nothing here); the micro-batches keep their order, so those queued behind
  it wait too (one stream a stage). Async scheduling thus hides the CPU part and the round trip
  through the scheduler, not the pipeline's own latency: a lone request still gets a token every
  ``p`` stage times, less the CPU part.

Timing: each stage works on one micro-batch at a time, in order; a micro-batch enters stage j
when it has left stage j − 1 (plus the activations' send) and stage j is free::

    enter_0 = max(scheduled, free_0)
    enter_j = max(leave_{j-1} + send_{j-1}, free_j),   leave_j = enter_j + stage_j

Its output is back at ``leave_{p-1}``. At steady state with every micro-batch alike (stage time
s, sends negligible) one micro-batch completes every ``s`` and each takes ``p · s`` from
scheduling to output; *bubbles* are stage time lost when fewer than ``p`` micro-batches can be
formed (few requests: a decode waits for its own output, as a parked request does) or
stages are unbalanced (a large
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
from simserve.sched.core import Scheduler
from simserve.sched.inflight import InFlight
from simserve.sched.batch import Batch
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
