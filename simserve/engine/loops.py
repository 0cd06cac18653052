"""The replica loops: each replica is one SimPy process that asks its scheduler for a StepPlan,
prices it, holds the clock for that long and applies it; an idle replica sleeps until given
work. Which loop runs a run's replicas is decided once (engine/mode.py, :func:`loop_for`):
solo, counted, run-ahead, stepping, batch queue, async solo, async counted or pipeline
(docs/architecture.md, the engine). Decode stretches are fast-forwarded (sched/stretch.py),
never past an outside event that could change them (or cut back to the steps before it), so
the result is stepping's, step for step (docs/cluster.md, exactness with fast-forward)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from functools import partial
from typing import Any

from simserve.engine.clock import Clock, Interrupt
from simserve.engine.mode import (ASYNC_COUNTED, ASYNC_SOLO, BATCH_QUEUE, COUNTED, PIPELINE,
                                  RUN_AHEAD, SOLO, STEPPING, Mode)
from simserve.engine.pipeline import pipeline_loop
from simserve.engine.queue import queue_loop
from simserve.engine.queue import sleep as _sleep
from simserve.engine.replica import Flight, Replica
from simserve.engine.runtime import Runtime, join_arrivals, join_waiting, pull_arrivals
from simserve.metrics.tokens import TokenLog
from simserve.sched.async_stretch import AsyncJoin, AsyncStretch
from simserve.sched.core import Scheduler
from simserve.sched.inflight import InFlight
from simserve.sched.plan import StepPlan
from simserve.sched.stretch import Join, Joined, Stretch

Loop = Generator[Any, Any, None]

# Longest stretch priced at once: bounds the work wasted when an arrival cuts a stretch short.
MAX_STRETCH = 256
# The solo loop's: arrivals join its stretches rather than cut them, so longer ones waste
# nothing and spare the work each stretch costs over its members (planning, applying).
SOLO_STRETCH = 1024
# The counted loop prices a stretch up to the arrival this many arrivals ahead per replica (any
# of them may cut it back: the steps priced past that cut would mostly be dropped)
COUNTED_AHEAD = 2
INF = math.inf
_NO_ENDS: list[float] = []   # (a plain step's; never changed)


def loop_for(mode: Mode) -> Callable[[Clock, Runtime, Replica], Loop]:
    """The loop that runs every replica of a run (``Runtime.mode``: engine/mode.py), for the
    simulation and the live driver alike."""
    return _LOOPS[mode.loop]


def solo_loop(env: Clock, c: Runtime, r: Replica) -> Loop:
    """One replica, nothing else going on (or each of several whose arrivals were routed
    ahead, ``Mode.routed_ahead``: nothing else passes between them): it takes its arrivals
    itself and never waits on the SimPy clock but to sleep until the next arrival; its
    stretches run past finishes and may start with a mixed step (the module docstring says why
    that is exact)."""
    arrivals, sched = c.arrivals_of(r), r.scheduler
    # arrivals may join a stretch (sched/stretch.py) when the policy says when it admits them
    join = partial(join_arrivals, c, r) if sched.facts.joins_stretch else None
    sched.adds_at_step_end = True
    now = env.now
    while True:
        if arrivals.next_time <= now:
            pull_arrivals(c, r, arrivals, now)
        plan = sched.schedule() if sched.has_work else None
        if plan is None or plan.is_empty:
            if c.finished or arrivals.next_time == INF:
                return           # all done (or deadlocked: simulate() sees nothing left)
            now = arrivals.next_time
            yield env.at(now)    # idle until the next arrival
            continue
        # its arrivals' replica is known (one replica, or routed ahead): no router observes
        # it, so only a step's start is cut
        stretch, ends, end = _take(c, r, sched, plan, now, arrivals.next_time, INF,
                                   SOLO_STRETCH if join else MAX_STRETCH, past_finish=True,
                                   join=join)
        now = c.finish_steps(r, sched, plan, stretch, ends, end)


def run_ahead_loop(env: Clock, c: Runtime, r: Replica) -> Loop:
    """Several replicas, or failures, and no KV transfers: a step or stretch that ends before
    the next outside event (an arrival, a failure) is applied at once; one that reaches it
    holds the clock until its end (a failure may then take the step in flight)."""
    cuts = _outside_events(c, r)
    sched = r.scheduler
    now = env.now
    while True:
        plan = sched.schedule() if sched.has_work else None
        if plan is None or plan.is_empty:
            woken = yield from _sleep(env, c, r, now)
            if woken is None:
                return
            now, sched = woken, r.scheduler   # (a new scheduler after a restart)
            continue
        cut, cut_end = cuts()
        stretch, ends, end = _take(c, r, sched, plan, now, cut, cut_end, MAX_STRETCH)
        if end >= cut:
            held = yield from _hold(env, c, r, stretch, now, end, ends)
            if held is None:
                now, sched = env.now, r.scheduler   # failed in flight (the runtime did the rest)
                continue
            end = held
        now = c.finish_steps(r, sched, plan, stretch, ends, end)


def counted_loop(env: Clock, c: Runtime, r: Replica) -> Loop:
    """Several replicas behind a router that reads only how many requests each holds and has
    not finished (``least_outstanding``), or also what a stretch knows at each of its steps
    (``least_kv``: KV blocks in use; ``jsq_tokens``: tokens of work left; ``prefix_aware``:
    the prefix cache, its named blocks' operations replayed that far), no failures
    (``Mode.of``). A stretch is priced past the arrivals, which may go elsewhere, and past
    finishes, as the solo loop's. One that ends before the next
    arrival is applied at once; one that reaches it holds the clock, and an arrival routed to
    this replica cuts it back to the steps that start before the arrival
    (``Runtime.cut_back``). When the last one kept ends, the requests routed here by then
    join the stretch at its next step if the policy would admit them whole there
    (``Stretch.rejoin``, ``join_waiting``: as arrivals join the solo loop's), and it goes on;
    otherwise the replica plans again from there, seeing them, as stepping would. Before the
    router looks, the requests that the stretches in flight finished by then are counted off,
    and what it reads of them is that of the step each is at (``Runtime.settle``)."""
    arrivals, sched = c.arrivals, r.scheduler
    ahead = COUNTED_AHEAD * len(c.entry)
    # the requests routed here while a stretch past finishes was in flight may join it where
    # they cut it back (the policy says when it admits them)
    join = partial(join_waiting, c, r, ahead) if sched.facts.joins_stretch else None
    now = env.now
    while True:
        plan = sched.schedule() if sched.has_work else None
        if plan is None or plan.is_empty:
            woken = yield from _sleep(env, c, r, now)
            if woken is None:
                return
            now = woken
            continue
        held = arrivals.next_time
        waiting = sched.num_waiting
        stretch, ends, end = _take(c, r, sched, plan, now, arrivals.ahead_time(ahead), INF,
                                   MAX_STRETCH, True, record_before=held)
        settled = 0
        deferred = stretch is not None and end >= held     # (_take left it to record)
        while end >= held:     # it may be cut back: hold the clock until it ends
            if stretch is None:
                f = Flight([now], [end], None)
            else:
                f = Flight(stretch.starts, ends, stretch, _finish_ends(stretch, ends)
                           if stretch.past_finish else [], settled)
            end = yield from _fly(env, r, f)
            settled = f.settled
            if stretch is None:
                break
            k = len(ends)           # the steps that ran (starts: cut back with ends)
            if k == stretch.num_steps:
                # not cut back: the arrivals before its end went elsewhere; if it stopped
                # at the cut, not at its bound, and nothing waits, it goes on
                if (not stretch.past_finish or k >= stretch.bound or sched.waiting
                        or not stretch.extend(r.pricing, k, end, arrivals.ahead_time(ahead),
                                              join)):
                    break
                ends = stretch.starts[1:]
                ends.append(stretch.end)
                end, held = stretch.end, arrivals.next_time
                continue
            stretch.num_steps = k
            del stretch.durations[k:]
            # cut back by arrivals routed here, due by now (the start of its step k): they
            # join it there if schedule() would admit them whole, and it goes on
            if (join is None or not stretch.past_finish
                    or not stretch.rejoin(r.pricing, k, end, join)):
                break
            ends = stretch.starts[1:]
            ends.append(stretch.end)
            end, held = stretch.end, arrivals.next_time
        if deferred:
            c.rec.stretch(r, stretch, waiting)   # type: ignore[arg-type]
        now = c.finish_steps(r, sched, plan, stretch, ends, end, settled)


def _fly(env: Clock, r: Replica, f: Flight) -> Generator[Any, Any, float]:
    """The counted loops': hold the clock for the flight ``f`` of replica ``r`` until the
    last of its steps kept ends (a request routed to ``r`` may cut it back: an interrupt);
    that end."""
    r.flight = f
    end = f.ends[-1]
    while True:
        try:
            yield env.at(end)
            break
        except Interrupt:   # (an arrival routed here cut it back)
            end = f.ends[-1]
    r.flight = None
    return end


def _finish_ends(stretch: Stretch, ends: list[float]) -> list[float]:
    """The ends of the steps at which members of a stretch past finishes finish, in order."""
    k = len(ends)
    return sorted([ends[e - 1] for _, _, _, e, _ in stretch.members if e <= k])


def stepping_loop(env: Clock, c: Runtime, r: Replica) -> Loop:
    """Every step, or stretch, holds the clock: stepwise runs (one event per step), and
    disaggregated clusters, where a KV cache landing (the inbox) cuts a stretch in flight back
    to the steps that start before it."""
    cuts = _outside_events(c, r)
    max_steps = MAX_STRETCH if c.mode.fast_forward else 1
    inbox, sched = r.inbox, r.scheduler
    now = env.now
    while True:
        if inbox and inbox[0][0] <= now:
            c.drain(r, now)
        plan = sched.schedule() if sched.has_work else None   # (a down replica has no work)
        if plan is None or plan.is_empty:
            woken = yield from _sleep(env, c, r, now)
            if woken is None:
                return
            now, sched = woken, r.scheduler
            continue
        cut, cut_end = cuts()
        stretch, ends, end = _take(c, r, sched, plan, now, cut, cut_end, max_steps)
        held = yield from _hold(env, c, r, stretch, now, end, ends)
        if held is None:
            now, sched = env.now, r.scheduler
            continue
        now = c.finish_steps(r, sched, plan, stretch, ends, held)


def batch_queue_loop(env: Clock, c: Runtime, r: Replica) -> Loop:
    """vLLM's engine core with a batch queue (``vllm/v1/engine/core.py``,
    ``step_with_batch_queue``): up to ``depth`` steps in flight (``Replica.batch_queue_depth``:
    2 with async scheduling). The replica schedules and launches steps while the queue has
    room; when it is full, or nothing more can be scheduled, it waits for the oldest step's
    output and delivers it (``Scheduler.launch``/``deliver``). A launched step starts on the
    device when the one before it ends. With depth 2 the step n+1 is thus scheduled when step
    n starts, right after the output of n-1 is delivered: it sees the arrivals and the frees
    up to then, and not those of step n. An empty plan is not queued (vLLM queues it, and
    its output, with nothing scheduled, is taken at once: the same order). Depth 1 is the
    synchronous engine, stepped. Every step is its own event: no fast-forward (one replica
    with a queue of two runs :func:`async_solo_loop` instead, which fast-forwards).

    The CPU part of a step (the latency model's ``cpu_s(plan)``, else its ``step_overhead_s``:
    scheduling, input preparation, a cost per sampled sequence) runs from the moment it is
    scheduled, or once the CPU has finished the step before's CPU part (the engine core is
    one thread: ``step_with_batch_queue`` calls ``schedule`` and ``execute_model`` one step
    after the other, so the CPU parts never overlap each other), overlapping the device's
    work on the step before; the device starts the step when both are done. A CPU-bound
    engine thus makes at most one step per CPU part. With depth 1 nothing overlaps and a
    step takes ``step_time``, as in the other loops."""
    return queue_loop(env, c, r, r.batch_queue_depth, AsyncTiming(c, r))


def async_solo_loop(env: Clock, c: Runtime, r: Replica) -> Loop:
    """:func:`batch_queue_loop` with a queue of two (async scheduling) on one replica, nothing
    else going on (or on each of several routed ahead, as :func:`solo_loop`): it takes its
    arrivals itself, as the solo loop does (those due by each moment the batch queue loop
    would resume at), and never waits on the SimPy clock but to sleep until the next
    arrival. Where a decode step is scheduled with one step in flight,
    nothing waiting, it fast-forwards an async decode stretch (sched/async_stretch.py), which
    arrivals join where the policy admits them whole; the result is the batch queue loop's,
    step for step."""
    arrivals, sched = c.arrivals_of(r), r.scheduler
    timing = AsyncTiming(c, r)
    tokens = r.tokens
    assert tokens is not None
    # arrivals may join a stretch where the policy says when it admits them
    join = partial(_async_join, c, r) if sched.facts.joins_stretch else None
    queue: deque[tuple[InFlight, float]] = deque()
    now = env.now
    while True:
        if arrivals.next_time <= now:
            pull_arrivals(c, r, arrivals, now)
        if len(queue) < 2 and sched.has_work:
            plan = sched.schedule()
            if not plan.is_empty:
                stretch = AsyncStretch.plan(sched, plan, SOLO_STRETCH) if queue else None
                if stretch is None:
                    queue.append(timing.launch(sched, plan, now))
                    continue
                now = _async_stretch(c, r, sched, timing, tokens, stretch, queue, now, join)
                continue
        if not queue:
            if c.finished or arrivals.next_time == INF:
                return           # all done (or deadlocked: simulate() sees nothing left)
            now = arrivals.next_time
            yield env.at(now)    # idle until the next arrival
            continue
        held, now = queue.popleft()
        if arrivals.next_time <= now:   # (the batch queue loop resumes after them)
            pull_arrivals(c, r, arrivals, now)
        timing.land(sched, held, now)


def _async_stretch(c: Runtime, r: Replica, sched: Scheduler, timing: AsyncTiming,
                   tokens: TokenLog, stretch: AsyncStretch,
                   queue: deque[tuple[InFlight, float]], now: float,
                   join: AsyncJoin | None) -> float:
    """Run ``stretch`` (its first plan just scheduled at ``now``, the queue's one step in
    flight): its steps recorded, the step in flight delivered, its steps but the last
    delivered and the last left in flight in the queue; the time the loop goes on from (the
    output of the last step delivered)."""
    held, held_end = queue.popleft()
    counts = _async_counts(sched, stretch)
    # the step in flight is delivered first (at held_end, before step 1 is scheduled): the
    # blocks it frees are free for the steps after (with prefix caching the replay of the
    # blocks' operations goes on from there); the rows start from the counts before it
    timing.land(sched, held, held_end)
    stretch.price(r.pricing, r.pricing.cpu_s, now, held_end, timing.cpu_free,
                  c.arrivals_of(r).next_time, join)
    return _apply_async(c, r, timing, tokens, stretch, queue, held_end, counts, 0, None)


def _async_counts(sched: Scheduler, stretch: AsyncStretch) -> tuple[int, int, int]:
    """What an async stretch's rows start from (``AsyncStretch.rows``), read before the step
    in flight is delivered: the running requests, the blocks in use, and those the running
    requests that are not members hold."""
    members = {id(m[0]) for m in stretch.members}
    bm = sched.blocks
    others = sum(bm.held(q.id) for q in sched.running if id(q) not in members)
    return len(sched.running) + sched.num_parked, bm.num_used, others


def _apply_async(c: Runtime, r: Replica, timing: AsyncTiming, tokens: TokenLog,
                 stretch: AsyncStretch, queue: deque[tuple[InFlight, float]], held_end: float,
                 counts: tuple[int, int, int], off: int, waiting: int | None) -> float:
    """Record and apply a priced async stretch (the step before it, in flight, ended at
    ``held_end`` and was delivered): its steps but the last delivered, the last left in
    flight in the queue; ``off`` more requests taken off ``num_outstanding`` (the counted
    loop's); the time the loop goes on from (the output of the last step delivered)."""
    k = stretch.num_steps
    kv, runs = stretch.rows(*counts)
    c.rec.async_stretch(r, stretch.starts, stretch.durations, kv, runs, waiting)
    finished, in_flight = stretch.apply()
    ends = stretch.ends
    if k > 1:   # (those that joined at the last step have no token delivered yet)
        tokens.stretch(stretch, ends[:k - 1],  # type: ignore[arg-type]
                       [m for m in stretch.members if m[4] < k - 1])
    r.num_outstanding -= len(finished) + off
    now = ends[k - 2] if k > 1 else held_end
    if finished:
        c.done_steps(r, finished, now)
    timing.free_at, timing.cpu_free = ends[-1], stretch.cpu_free
    queue.append((in_flight, ends[-1]))
    return now


def async_counted_loop(env: Clock, c: Runtime, r: Replica) -> Loop:
    """:func:`batch_queue_loop` with a queue of two (async scheduling) on each of several
    replicas behind a router that reads only how many requests each holds and has not
    finished (``least_outstanding``), or also what a stretch knows at each of its steps
    (``least_kv``, ``jsq_tokens``, ``prefix_aware``: as :func:`counted_loop`), no failures
    (``Mode.of``). Where a decode step is
    scheduled with one step in flight and nothing waiting, it fast-forwards an async decode
    stretch (sched/async_stretch.py) past the arrivals, which may go elsewhere, and past its
    finishes, as the counted loop does a synchronous one: one whose steps are all scheduled,
    and their outputs but the last delivered, before the next arrival is applied at once;
    otherwise it holds the clock as a flight, and a request routed to this replica cuts it
    back to the steps scheduled before it came (``Runtime.cut_back``): the next schedule sees
    it, as stepping's would, and the requests routed here by then join the stretch there if
    the policy would admit them whole (``AsyncStretch.rejoin``, ``join_waiting``: as arrivals
    join the async solo loop's), else the loop steps on from there. Before the router looks,
    the requests the flight finished (their last outputs delivered) before then are counted
    off, and what it reads of them is that of the step each is at: the one scheduled last
    (``Runtime.settle``)."""
    sched = r.scheduler
    timing = AsyncTiming(c, r)
    tokens = r.tokens
    assert tokens is not None
    ahead = COUNTED_AHEAD * len(c.entry)
    join = partial(_async_join_waiting, c, r, ahead) if sched.facts.joins_stretch else None
    queue: deque[tuple[InFlight, float]] = deque()
    now = env.now
    while True:
        if len(queue) < 2 and sched.has_work:
            plan = sched.schedule()
            if not plan.is_empty:
                stretch = AsyncStretch.plan(sched, plan, MAX_STRETCH) if queue else None
                if stretch is None:
                    queue.append(timing.launch(sched, plan, now))
                    continue
                now = yield from _async_counted_stretch(env, c, r, sched, timing, tokens,
                                                        stretch, queue, now, ahead, join)
                continue
        if not queue:
            woken = yield from _sleep(env, c, r, now)
            if woken is None:
                return
            now = woken
            continue
        held, now = queue.popleft()            # wait for the oldest step's output
        yield env.at(now)
        timing.land(sched, held, now)


def _async_counted_stretch(env: Clock, c: Runtime, r: Replica, sched: Scheduler,
                           timing: AsyncTiming, tokens: TokenLog, stretch: AsyncStretch,
                           queue: deque[tuple[InFlight, float]], now: float,
                           ahead: int, join: AsyncJoin | None) -> Generator[Any, Any, float]:
    """:func:`_async_stretch` for :func:`async_counted_loop`: priced to the steps scheduled
    before the arrival ``ahead`` arrivals on, held as a flight (which an arrival routed here
    may cut back, and ``join`` there; one that no arrival cut back goes on to the next such
    cut) while an arrival could come before it is over, then applied; the time the loop goes
    on from."""
    held, held_end = queue.popleft()
    counts = _async_counts(sched, stretch)
    if c.reads_kv or c.reads_tokens:    # (what a router reads of it in flight starts from)
        members = {id(m[0]) for m in stretch.members}
        stretch.before = (counts[1], counts[2], sum(
            q.num_prompt_tokens + q.num_output_tokens - q.num_computed_tokens
            for q in sched.running if id(q) not in members) if c.reads_tokens else 0)
    # the step in flight is delivered first, as the solo loop's (it is, whatever comes):
    # the requests it finishes are counted off num_outstanding once the router may see them
    done = sched.deliver(held, held_end)
    tokens.step(held_end, sched.sampled, None)
    if done:
        c.done_steps(r, done, held_end)
    stretch.readies = []
    stretch.price(r.pricing, r.pricing.cpu_s, now, held_end, timing.cpu_free,
                  c.arrivals.ahead_time(ahead))
    k = stretch.num_steps
    ends = stretch.ends
    settled = 0
    while (ends[k - 2] if k > 1 else held_end) >= c.arrivals.next_time:
        # an arrival may come before it is over: step i is scheduled at e(i - 2) (e(-2) now,
        # e(-1) the end of the step that was in flight), and with i + 1 steps kept the loop
        # goes on at e(i - 1); the requests it finishes by then, at their last outputs
        scheduled = [now, held_end]
        scheduled += ends[:k - 2]
        del scheduled[k:]
        resumes = [held_end]
        resumes += ends[:k - 1]
        finish_ends = [held_end] * len(done)
        finish_ends += sorted([ends[e - 1] for _, _, _, e, _ in stretch.members if e < k])
        f = Flight(scheduled, resumes, stretch, finish_ends, settled)
        yield from _fly(env, r, f)
        settled = f.settled
        cut_to = stretch.num_steps
        if cut_to == k:
            # not cut back: the arrivals before its end went elsewhere; if it stopped at the
            # cut, not at its bound, and nothing waits, it goes on
            if (k >= stretch.bound or sched.waiting
                    or not stretch.extend(r.pricing, r.pricing.cpu_s, k,
                                          c.arrivals.ahead_time(ahead), join)):
                break
        # cut back by requests routed here: they join it at the step scheduled next if
        # schedule() would admit them whole there, and it goes on
        elif join is None or not stretch.rejoin(r.pricing, r.pricing.cpu_s, cut_to, join):
            k = cut_to
            break
        k = stretch.num_steps
    # (nothing waited at its steps: the requests routed here came after they were scheduled)
    return _apply_async(c, r, timing, tokens, stretch, queue, held_end, counts,
                        len(done) - settled, 0)


def _async_join_waiting(c: Runtime, r: Replica, ahead: int, stretch: AsyncStretch, i: int,
                        due: float, start: float, decoding: int,
                        running: int) -> tuple[Joined, float] | None:
    """The async counted loop's join (``AsyncStretch.rejoin``): ``join_waiting`` of the
    requests routed here while the stretch was in flight, at its step ``i`` (scheduled at
    ``due``, starting at ``start``) beside ``decoding`` decodes with ``running`` running."""
    return join_waiting(c, r, ahead, stretch, i, start, decoding, running)


def _async_join(c: Runtime, r: Replica, stretch: AsyncStretch, i: int, due: float,
                start: float, decoding: int, running: int) -> tuple[Joined, float] | None:
    """The async solo loop's join (``AsyncStretch.price``): ``join_arrivals`` of the arrivals
    due by ``due``, the schedule time of the stretch's step ``i``, admitted at that step
    (starting at ``start``) beside ``decoding`` decodes with ``running`` requests running."""
    return join_arrivals(c, r, stretch, i, start, decoding, due, running)


class AsyncTiming:
    """:func:`batch_queue_loop`'s timing (:func:`~simserve.engine.queue.queue_loop`): a step
    starts on the device when the one before it ends and its own CPU part is done; the
    scheduler holds it with ``launch``/``deliver``."""

    always_wait = True
    queues_empty = False    # (with a queue of 2 an empty schedule's slot changes nothing)

    def __init__(self, c: Runtime, r: Replica):
        self.rec, self.r = c.rec, r
        self.deliver_step = c.deliver_step
        self.free_at = c.env.now    # when the device is done with the steps launched so far
        self.cpu_free = c.env.now   # when the CPU is done with the CPU parts of the steps so far

    def launch(self, sched: Scheduler, plan: StepPlan, now: float) -> tuple[InFlight, float]:
        free_at = self.free_at
        start = free_at if free_at > now else now
        if plan.prefill_lens:   # requests scheduled for the first time: their first step
            for req in sched.newly_scheduled:
                req.first_scheduled_s = start
        # the step's CPU part (the latency model's cpu_s: overhead, per-sequence costs) runs
        # from now, or
        # once the CPU is done with the step before's (one engine-core thread: the CPU
        # parts are serial), while the device may still compute the step before; its
        # device part follows both
        r = self.r
        duration = r.latency.step_time(plan)
        cpu = r.pricing.cpu_s(plan)
        overhead = cpu if cpu < duration else duration
        cpu_free = self.cpu_free
        ready = (cpu_free if cpu_free > now else now) + overhead
        self.cpu_free = ready
        end = (free_at if free_at > ready else ready) + (duration - overhead)
        self.rec.step(r, start, end - start, plan)
        self.free_at = end
        return sched.launch(plan), end

    def land(self, sched: Scheduler, step: InFlight, now: float) -> None:
        self.deliver_step(self.r, sched, step, now)


# -- the pieces the loops share -------------------------------------------------------------

def _outside_events(c: Runtime, r: Replica) -> Callable[[], tuple[float, float]]:
    """For a step of ``r`` starting now: steps after the first must start before ``cut`` and
    end before ``cut_end`` (arrivals that add to the replica or that a router observing
    per-step state routes; failures and restarts; things already in its inbox)."""
    arrivals, faults, inbox = c.arrivals, c.fault_times, r.inbox
    arrival_cut, arrival_end = c.arrival_rules(r)
    fault_end = c.mode.fault_end_rule

    def cuts() -> tuple[float, float]:
        cut = cut_end = INF
        if arrival_cut:
            cut = arrivals.next_time
            if arrival_end:
                cut_end = cut
        if faults:
            t = faults[0]
            if t < cut:
                cut = t
            if fault_end and t < cut_end:
                cut_end = t
        if inbox and inbox[0][0] < cut:
            cut = inbox[0][0]
        return cut, cut_end

    return cuts


def _take(c: Runtime, r: Replica, sched: Scheduler, plan: StepPlan, start: float, cut: float,
          cut_end: float, max_steps: int, past_finish: bool = False,
          join: Join | None = None,
          record_before: float = INF) -> tuple[Stretch | None, list[float], float]:
    """Price and record the step that starts with ``plan`` at ``start``, fast-forwarded into a
    stretch as far as the outside events allow (arrivals may ``join`` it: the solo loop's):
    the stretch (None for one step), the end of each of its steps (empty for one step), and
    its end. A stretch that ends at or after ``record_before`` is the caller's to record,
    once it is over (the counted loop's, which an arrival may cut back)."""
    if plan.prefill_lens:        # requests scheduled for the first time (always a prefill)
        for req in sched.newly_scheduled:
            req.first_scheduled_s = start
    stretch = Stretch.plan(sched, plan, max_steps, past_finish) if max_steps > 1 else None
    if stretch is not None:
        # requests join only a stretch past finishes (nothing else waits)
        stretch.price(r.pricing, start, cut, cut_end, join if stretch.past_finish else None)
        if stretch.num_steps > 1:
            if stretch.end < record_before:
                c.rec.stretch(r, stretch)
            ends = stretch.starts[1:]
            ends.append(stretch.end)
            return stretch, ends, stretch.end
        duration = stretch.durations[0]   # cut back to its first step, priced already
        if stretch.cache is not None:
            # (with prefix caching the frees that end it may be done: the blocks in use
            # are those before them; completing the step finds its requests released)
            c.rec.step(r, start, duration, plan, stretch.cache.used[0])
            return None, _NO_ENDS, start + duration
    else:
        duration = r.latency.step_time(plan)
    c.rec.step(r, start, duration, plan)
    return None, _NO_ENDS, start + duration


def _hold(env: Clock, c: Runtime, r: Replica, stretch: Stretch | None, start: float,
          end: float, ends: list[float]) -> Generator[Any, Any, float | None]:
    """Hold the clock until the step or stretch ends; its end, which a KV landing may move
    earlier (the stretch cut back: ``ends`` shrinks), or None if the replica failed in flight.
    Without disaggregation or failures nothing can cut a flight short: a plain wait."""
    if not c.mode.tracked:
        yield env.at(end)
        return end
    r.flight = Flight(stretch.starts, ends, stretch) if stretch is not None \
        else Flight([start], [end], None)
    while True:
        try:
            yield env.at(end)
            break
        except Interrupt:
            if not r.up:
                return None
            end = r.flight.ends[-1]
    r.flight = None
    return ends[-1] if stretch is not None else end


_LOOPS: dict[str, Callable[[Clock, Runtime, Replica], Loop]] = {
    SOLO: solo_loop, RUN_AHEAD: run_ahead_loop, STEPPING: stepping_loop, COUNTED: counted_loop,
    BATCH_QUEUE: batch_queue_loop, ASYNC_SOLO: async_solo_loop, PIPELINE: pipeline_loop,
    ASYNC_COUNTED: async_counted_loop}
