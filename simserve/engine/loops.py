"""The replica loops: each replica is one SimPy process stepping its scheduler.

A replica asks its scheduler for a StepPlan, prices it with the latency model, holds the clock
for that long, then lets the scheduler apply it. An idle replica sleeps on an event that
whoever gives it work triggers.

Fast-forward (sched/stretch.py): when a plan is the start of a *decode stretch* (every running
request decodes, nothing else happens, and the policy's admission is monotone), the replica
prices all k steps of the stretch at once, holds the clock once, and applies them together.
The result is the same schedule, step for step, as stepping one iteration per event
(``fast_forward=False``); the equivalence tests hold the two to that. What keeps it exact is
that a stretch never runs past an *outside event* — something that changes or looks at the
replica from outside:

* events known in advance — arrivals and fault injections/restarts — bound the stretch when it
  is planned: a step after the first is kept only if it starts before the next such event, or,
  when the router looks at per-step state (KV use, tokens left, cached prefixes), only if it
  also *ends* before it, so that the state the router sees at that moment is exactly the state
  stepping shows (the step in flight scheduled, everything before it applied);
* events not known in advance — a KV cache landing on a decode replica, created when another
  replica's prefill completes — go to the target's *inbox*; a stretch in flight there is cut
  back to the steps that start before the landing (``simpy.Process.interrupt`` makes the
  replica wait for the new end), and the replica takes the landing at its first step boundary
  at or after it.

Run-ahead: when no unannounced events can happen (no disaggregation), a step or stretch that
ends before the next outside event is applied at once, without a SimPy event; the replica runs
ahead of the SimPy clock but never past that event.

Pull mode (``Runtime.pull``): one replica and no failures. Nothing but arrivals can happen
between two of its step boundaries and the router has no choice to make, so the replica takes
the arrivals due by each boundary itself (in order, as the URGENT arrival events would have)
and yields to SimPy only to sleep while idle. Every stretch is then applied before anyone could
look at it, so a stretch may also run on past finishes (``Scheduler.continues_past_finish``):
requests drop out as they finish, and each run of one membership (a *segment*) is priced from
the plan ``schedule()`` would have made at its first step; and it may start with a mixed step
that finishes the newcomers' prefills while the others decode or wait (a segment of its own).
"""

from __future__ import annotations

import math

from simserve.engine.clock import Clock, Interrupt
from simserve.engine.replica import Flight, Replica
from simserve.engine.runtime import Runtime, pull_arrivals
from simserve.sched.core import Scheduler
from simserve.sched.plan import StepPlan
from simserve.sched.stretch import Stretch

# Longest stretch priced at once: bounds the work wasted when an arrival cuts a stretch short.
MAX_STRETCH = 256
INF = math.inf


def replica_loop(env: Clock, c: Runtime, r: Replica):
    """Step the replica (see the module docstring for how far a stretch may go, and when the
    replica may run ahead of the SimPy clock)."""
    rec, arrivals, faults, inbox, latency = c.rec, c.arrivals, c.fault_times, r.inbox, r.latency
    fast, run_ahead, tracked, fault_end = c.fast_forward, c.run_ahead, c.tracked, c.fault_end_rule
    arrival_cut, arrival_end = c.arrival_rules(r)
    pull = c.pull
    if pull:
        arrival_end = False      # one replica: the router has no choice to make
    inf = INF
    sched = r.scheduler
    now = env.now
    while True:
        if pull and arrivals.next_time <= now:
            pull_arrivals(c, now)
        if inbox and inbox[0][0] <= now:
            c.drain(r, now)
        plan = sched.schedule() if sched.has_work else None   # (a down replica has no work)
        if pull and (plan is None or plan.is_empty):
            if c.finished or arrivals.next_time == inf:
                return           # all done (or deadlocked: simulate() sees nothing left)
            now = arrivals.next_time
            yield env.at(now)    # idle until the next arrival
            continue
        if plan is None or plan.is_empty:
            if env.now < now:
                yield env.at(now)      # catch the SimPy clock up before sleeping
            if c.finished:
                return
            r.wakeup = env.event()
            yield r.wakeup
            r.wakeup = None
            now = env.now
            sched = r.scheduler        # a new one after a restart
            continue
        start = now
        _mark_first_scheduled(sched, plan, start)
        # the next outside events: steps after the first start before `cut` and end before
        # `cut_end`
        cut = cut_end = inf
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
        # past a finish only when nothing can look at the replica before the stretch is
        # applied (pull mode: it is applied at once)
        stretch = Stretch.plan(sched, plan, MAX_STRETCH, pull) if fast else None
        if stretch is not None:
            stretch.price(latency, start, cut, cut_end)
            if stretch.num_steps == 1:   # cut back to its first step, priced already
                duration = stretch.durations[0]
                stretch = None
        else:
            duration = latency.step_time(plan)
        if stretch is not None:
            starts = stretch.starts
            ends = starts[1:]
            ends.append(stretch.end)
            rec.stretch(r, stretch)
            now = stretch.end
        else:
            rec.step(r, start, duration, plan)
            now = start + duration
        if not pull and (not run_ahead or now >= cut):
            if tracked:
                r.flight = Flight(starts, ends, stretch) if stretch is not None else \
                    Flight([start], [now], None)
                if not (yield from _hold(env, r, now)):
                    now = env.now      # failed in flight (the cluster did the rest)
                    sched = r.scheduler
                    continue
                if stretch is not None:   # possibly cut back while in flight
                    ends = r.flight.ends
                    now = ends[-1]
                r.flight = None
            else:
                yield env.at(now)
        finished = stretch.apply(ends) if stretch is not None else sched.complete(plan, now)
        if finished:
            r.num_outstanding -= len(finished)
            c.done_steps(r, finished, now)


def _hold(env: Clock, r: Replica, end: float):
    """Wait until ``end``; an interrupt means the flight was cut back (wait for its new end) or
    the replica failed (return False)."""
    while True:
        try:
            yield env.at(end)
            return True
        except Interrupt:
            if not r.up:
                return False
            end = r.flight.ends[-1]


def _mark_first_scheduled(sched: Scheduler, plan: StepPlan, start: float) -> None:
    """Requests scheduled for the first time in this step (always with a prefill chunk)."""
    if plan.prefill_lens:
        for req in sched._batch.first_scheduled:
            req.first_scheduled_s = start
