"""The SimPy event loop: arrivals → router → replicas stepping their schedulers.

This is the only module that knows about SimPy. A replica is a plain generator process
(``env`` passed in, no globals): ask the scheduler for a StepPlan, price it with the latency
model, hold the clock for that long, then let the scheduler apply it. An idle replica sleeps on
an event that whoever gives it work triggers.

Fast-forward: when a plan is the start of a *decode stretch* (``Scheduler.decode_stretch_limit``:
every running request decodes, nothing else happens, and the policy's admission is monotone),
the replica prices all k steps of the stretch at once, holds the clock once, and applies them
together. The result is the same schedule, step for step, as stepping one iteration per event
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

Pull mode (``_Cluster.pull``): one replica and no failures. Nothing but arrivals can happen
between two of its step boundaries and the router has no choice to make, so the replica takes
the arrivals due by each boundary itself (in order, as the URGENT arrival events would have)
and yields to SimPy only to sleep while idle. Every stretch is then applied before anyone could
look at it, so a stretch may also run on past finishes (``Scheduler.continues_past_finish``):
requests drop out as they finish, and each run of one membership (a *segment*) is priced from
the plan ``schedule()`` would have made at its first step; and it may start with a mixed step
that finishes the newcomers' prefills while the others decode or wait (a segment of its own).

Event priorities at one instant: arrivals (and inbox wake-ups) are URGENT, so a step starting
at that time sees them; step completions are NORMAL; failures and restarts come last (LATE),
so steps that ended by the failure time stand and the step in flight is lost.

Clusters (docs/cluster.md): replicas have a ``role``. ``mixed`` replicas take requests
from the router and serve them whole. In a disaggregated cluster the router picks a prefill and
a decode replica on arrival (Splitwise's cluster-level scheduler); the prefill replica runs a
*proxy* of the request (its prompt, one output token), then holds that KV while it crosses the
link, and the decode replica takes the request with the KV computed (``num_computed_tokens =
num_tokens - 1``: it next feeds back the token the prefill sampled). The token reaches the
client when the KV lands. Failures: see simserve/faults.py.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from heapq import heapify, heappop, heappush
from typing import Any

import numpy as np
import simpy
from simpy.core import NORMAL, URGENT, EmptySchedule

from simserve.kv.blocks import BlockManager
from simserve.latency.base import LatencyModel
from simserve.routing import least_outstanding, round_robin  # noqa: F401  (re-exported)
from simserve.sched.core import Scheduler
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status
from simserve.sched.stretch import Stretch
from simserve.workload.spec import RequestSpec

# Longest stretch priced at once: bounds the work wasted when an arrival cuts a stretch short.
MAX_STRETCH = 256
LATE = NORMAL + 1        # failures and restarts: after every step completion at the same time
INF = math.inf
_LAND, _UNPIN = 0, 1     # inbox entries: a KV cache landing; a prefill replica's KV released

# Per-step columns (vary inside a fast-forwarded stretch) and per-group columns (constant over a
# group of steps: one plain step, or one whole stretch). Typecodes: float64 times, int32 counts.
# A group is one record of GROUP_FIELDS, appended to one flat int32 array (one call per group).
STEP_ARRAYS = {"start_s": "d", "duration_s": "d", "kv_blocks_used": "i"}
GROUP_FIELDS = ("num_steps", "replica", "num_prefill_tokens", "num_prefill_seqs",
                "num_decode_seqs", "num_batched_tokens", "num_running", "num_waiting",
                "kv_blocks_total", "num_preempted", "swap_out_blocks", "swap_in_blocks")
STEP_COLUMNS = ("replica", "start_s", "duration_s", "num_prefill_tokens", "num_prefill_seqs",
                "num_decode_seqs", "num_batched_tokens", "num_running", "num_waiting",
                "kv_blocks_used", "kv_blocks_total", "num_preempted", "swap_out_blocks",
                "swap_in_blocks")
_G = len(GROUP_FIELDS)


@dataclass(eq=False)
class Replica:
    index: int
    scheduler: Scheduler
    latency: LatencyModel
    max_model_len: int
    wakeup: simpy.Event | None = None
    num_outstanding: int = 0
    group: str = ""
    role: str = "mixed"            # mixed | prefill | decode (docs/cluster.md)
    # a fresh scheduler (with its own empty KV cache) for a restart after a failure
    factory: Callable[[], Scheduler] | None = field(default=None, repr=False)
    up: bool = True
    # engine bookkeeping: the process, the step or stretch in flight (only tracked when
    # something may cut it short), and the inbox of (time, request id, kind, payload)
    proc: Any = field(default=None, repr=False)
    flight: _Flight | None = field(default=None, repr=False)
    inbox: list = field(default_factory=list, repr=False)

    @property
    def blocks(self) -> BlockManager:
        return self.scheduler.blocks


@dataclass(slots=True)
class _Flight:
    """The steps a replica is holding the clock for: their starts and ends (one plain step, or
    a fast-forwarded stretch, which may be cut back while in flight)."""

    starts: list[float]
    ends: list[float]
    stretch: Stretch | None


class _ReplicaLog:
    """One replica's steps, in its own order (step i here is its scheduler's step i)."""

    def __init__(self) -> None:
        self.steps = {c: array(t) for c, t in STEP_ARRAYS.items()}
        self.group_records = array("i")      # GROUP_FIELDS of each group, one after another
        # added to start times read back (a front-end delay puts the engine's clock behind
        # the client's: runner.collect); the engine itself never reads it
        self.offset = 0.0

    @property
    def num_groups(self) -> int:
        return len(self.group_records) // _G

    def group_columns(self) -> dict[str, np.ndarray]:
        """Each group field as an int32 array, one value per group (views of the records, no
        copy: widen before summing anything that may overflow)."""
        table = np.frombuffer(self.group_records, dtype=np.int32).reshape(-1, _G)
        return {c: table[:, j] for j, c in enumerate(GROUP_FIELDS)}

    def step_arrays(self) -> dict[str, np.ndarray]:
        """The per-step columns as arrays (views of the recorded buffers; start times plus
        ``offset`` when there is one)."""
        out = {c: np.frombuffer(a, dtype=_DTYPES[STEP_ARRAYS[c]]) for c, a in self.steps.items()}
        if self.offset:
            out["start_s"] = out["start_s"] + self.offset
        return out

    def ends(self) -> np.ndarray:
        """End time of each step (start + duration: the very sums the engine advanced by)."""
        return (np.frombuffer(self.steps["start_s"], dtype=np.float64)
                + np.frombuffer(self.steps["duration_s"], dtype=np.float64))

    def trim(self, keep: int) -> None:
        """Keep only the first ``keep`` steps of the last group (a stretch cut short, or a
        step lost to a failure: ``keep = 0`` drops the group)."""
        g = self.group_records
        last = len(g) - _G                   # the last group's num_steps
        k = g[last]
        if keep >= k:
            return
        for a in self.steps.values():
            del a[len(a) - (k - keep):]
        if keep:
            g[last] = keep
        else:
            del g[last:]

    def columns(self) -> dict[str, np.ndarray]:
        groups = self.group_columns()
        group_of_step = np.repeat(np.arange(len(groups["num_steps"])), groups["num_steps"])
        steps = self.step_arrays()
        return {c: steps[c] if c in steps else groups[c].take(group_of_step).astype(np.int64)
                for c in STEP_COLUMNS}


_DTYPES = {"d": np.float64, "q": np.int64, "i": np.int32}


@dataclass
class Recorder:
    """Events recorded during the run, in flat typed arrays per replica; metrics are computed
    after the run from these.

    Steps are stored as groups: a plain step is a group of one; a fast-forwarded stretch is one
    group of k steps that share every count but their times and KV blocks used. Cluster events
    are kept beside: retries per request, KV transfer times, replica failures.
    """

    requests: list[Request] = field(default_factory=list)
    replicas: dict[int, _ReplicaLog] = field(default_factory=dict)
    retries: dict[int, int] = field(default_factory=dict)        # request id -> times retried
    transfer_s: list[float] = field(default_factory=list)         # one per KV handoff
    failures: list[tuple[int, float]] = field(default_factory=list)   # (replica, time)

    def log(self, replica: Replica) -> _ReplicaLog:
        log = self.replicas.get(replica.index)
        if log is None:
            log = self.replicas[replica.index] = _ReplicaLog()
        return log

    @property
    def num_stretches(self) -> int:
        return sum(int((log.group_columns()["num_steps"] > 1).sum())
                   for log in self.replicas.values())

    def step(self, replica: Replica, start: float, duration: float, plan: StepPlan) -> None:
        log = self.log(replica)
        s = log.steps
        s["start_s"].append(start)
        s["duration_s"].append(duration)
        sched = replica.scheduler
        s["kv_blocks_used"].append(sched.blocks.num_used)
        log.group_records.fromlist(_group_row(
            1, replica.index, plan.num_prefill_tokens, len(plan.prefill_lens),
            len(plan.decode_ctx), len(sched.running), sched.num_waiting, sched.blocks.num_blocks,
            plan.num_preempted, plan.swap_out_blocks, plan.swap_in_blocks))

    def stretch(self, replica: Replica, stretch: Stretch) -> None:
        """A priced stretch's steps, one group per segment begun (``Stretch.segments``): the
        steps of a segment differ only in their times and KV blocks used; every running
        request is in it. The first segment has the stretch plan's counts (a mixed first step
        is a segment of its own); the others decode."""
        log = self.log(replica)
        s = log.steps
        s["start_s"].fromlist(stretch.starts)          # (fromlist: twice as fast as extend)
        s["duration_s"].fromlist(stretch.durations)
        s["kv_blocks_used"].fromlist(stretch.blocks_used())
        k = stretch.num_steps
        plan = stretch.first_plan
        segments = stretch.begun
        index, sched = replica.index, replica.scheduler
        waiting, num_blocks = sched.num_waiting, sched.blocks.num_blocks
        rows: list[int] = []
        for j, (i0, m, _) in enumerate(segments):
            if i0 >= k:
                break
            i1 = min(segments[j + 1][0], k) if j + 1 < len(segments) else k
            if i0 == 0:
                rows += _group_row(i1, index, plan.num_prefill_tokens, len(plan.prefill_lens),
                                   len(plan.decode_ctx), m, waiting, num_blocks, 0, 0, 0)
            else:
                rows += _group_row(i1 - i0, index, 0, 0, m, m, waiting, num_blocks, 0, 0, 0)
        log.group_records.fromlist(rows)

    def columns(self) -> dict[str, np.ndarray]:
        """Every step column as an array: replicas one after another, each in step order."""
        logs = [self.replicas[i].columns() for i in sorted(self.replicas)]
        if not logs:
            return {c: np.empty(0, dtype=np.float64 if c in ("start_s", "duration_s")
                                else np.int64) for c in STEP_COLUMNS}
        if len(logs) == 1:
            return logs[0]
        return {c: np.concatenate([log[c] for log in logs]) for c in STEP_COLUMNS}


def _group_row(num_steps: int, replica: int, prefill_tokens: int, prefill_seqs: int,
               decode_seqs: int, running: int, waiting: int, num_blocks: int, preempted: int,
               swap_out: int, swap_in: int) -> list[int]:
    """One group's record, in GROUP_FIELDS order (the one place that knows it)."""
    return [num_steps, replica, prefill_tokens, prefill_seqs, decode_seqs,
            prefill_tokens + decode_seqs, running, waiting, num_blocks, preempted, swap_out,
            swap_in]


def rejection_reason(req: Request, replica: Replica) -> str:
    """Why a request can never run on this replica, or "" if it can."""
    if req.max_tokens > replica.max_model_len:
        return "exceeds_max_model_len"
    if replica.blocks.blocks_for(req.max_tokens) > replica.blocks.num_blocks:
        return "exceeds_kv_capacity"
    return ""


Router = Callable[[Request, Sequence[Replica]], Replica]


class _Arrivals:
    """The workload's cursor: the next arrival time is what bounds a fast-forward stretch."""

    def __init__(self, specs: Sequence[RequestSpec]):
        self.specs = specs
        self.next = 0
        self.done = False

    @property
    def next_time(self) -> float:
        return self.specs[self.next].arrival_s if self.next < len(self.specs) else INF


class _Environment(simpy.Environment):
    """SimPy's environment plus events at an absolute time and with a chosen priority.

    ``timeout(d)`` lands at ``now + d``; a fast-forward stretch must end exactly at the float
    that stepping would reach (``(s0 + d0) + d1 ...``), which no delay can always express (a
    rounding tie can make that sum unreachable from ``now``). So events are pushed with their
    absolute time, the way ``Environment.schedule`` itself queues them (simpy/core.py).
    """

    def at(self, when: float, priority: int = NORMAL) -> simpy.Event:
        if when < self.now:
            raise ValueError(f"cannot schedule at {when} before now ({self.now})")
        event = simpy.Event(self)
        event._ok = True          # a triggered, successful event, like a Timeout
        event._value = None
        heappush(self._queue, (when, priority, next(self._eid), event))
        return event

    def call_at(self, when: float, priority: int, fn: Callable[[], None]) -> None:
        """Run ``fn()`` when the clock reaches ``when`` (at that priority)."""
        self.at(when, priority).callbacks.append(lambda _: fn())


def simulate(specs: Sequence[RequestSpec], replicas: Sequence[Replica], router: Router,
             fast_forward: bool = True, *, decode_router: Router | None = None,
             transfer_s: Callable[[int, Replica, Replica], float] | None = None,
             faults=None, on_failure: str = "retry", max_retries: int = 3) -> Recorder:
    """Run the workload to completion; return what was recorded.

    ``router`` picks among the replicas that take arrivals (role ``mixed`` or ``prefill``);
    with decode replicas present, ``decode_router`` picks among those and ``transfer_s(tokens,
    src, dst)`` prices a KV handoff. ``faults`` is a ``faults.FaultSchedule`` (replicas need a
    ``factory`` then); ``on_failure`` and ``max_retries`` say what happens to the requests a
    failed replica held. Every request ends finished, rejected or failed.
    """
    env = _Environment()
    rec = Recorder()
    c = _Cluster(env, rec, specs, replicas, router, fast_forward, decode_router, transfer_s,
                 faults, on_failure, max_retries)
    for r in replicas:
        r.proc = env.process(_replica_loop(env, c, r))
    if not c.pull:
        env.process(_arrival_process(env, c))
    if faults is not None:
        for t, i, restart in faults.initial():
            c.add_fault(t, replicas[i], restart)
    step = env.step
    try:
        while not c.finished:
            step()
    except EmptySchedule:   # nothing can happen any more: only a scheduler deadlock gets here
        pass
    for req in rec.requests:   # anything left can never be scheduled: count it, never drop it
        if req.status not in (Status.FINISHED, Status.REJECTED, Status.FAILED):
            req.status = Status.REJECTED
            req.reject_reason = "unschedulable"
    c.join_token_times()
    return rec


class _Cluster:
    """What the replicas share: the pools, routers, the count of unresolved requests, requests
    in transit between replicas, failures. All times are SimPy's."""

    def __init__(self, env, rec, specs, replicas, router, fast_forward, decode_router,
                 transfer_s, faults, on_failure, max_retries):
        self.env, self.rec = env, rec
        self.arrivals = _Arrivals(specs)
        self.replicas = list(replicas)
        self.entry = [r for r in replicas if r.role != "decode"]
        self.decode = [r for r in replicas if r.role == "decode"]
        self.disaggregated = bool(self.decode)
        if self.disaggregated and (decode_router is None or transfer_s is None
                                   or any(r.role != "prefill" for r in self.entry)):
            raise ValueError("decode replicas need prefill replicas (no mixed ones), a "
                             "decode_router and transfer_s")
        self.router, self.decode_router, self.transfer_s = router, decode_router, transfer_s
        self.fast_forward = fast_forward
        self.run_ahead = fast_forward and not self.disaggregated
        # One replica, nothing else going on: nothing can happen between two of its step
        # boundaries but arrivals, and where an arrival goes is forced, so the replica takes
        # the arrivals due by each boundary itself (as the URGENT arrival events would have, in
        # the same order) and never waits on the SimPy clock but to sleep while idle.
        self.pull = self.run_ahead and len(self.replicas) == 1 and faults is None
        self.tracked = self.disaggregated or faults is not None   # flights may be cut short
        self.faults, self.on_failure, self.max_retries = faults, on_failure, max_retries
        if faults is not None and any(r.factory is None for r in replicas):
            raise ValueError("fault injection needs each replica's scheduler factory")
        observes = getattr(router, "observes_state", True)
        self.decode_observes = getattr(decode_router, "observes_state", True)
        self.fault_end_rule = observes or (self.disaggregated and self.decode_observes)
        self.entry_observes = observes
        self.pending = len(specs)     # requests not yet finished, rejected or failed
        self.finished = not specs
        self.fault_times: list[float] = []   # pending failure and restart times (a heap)
        self.real: dict[int, Request] = {}   # request id -> the request its proxy prefills
        self.assigned: dict[int, Replica | None] = {}   # decode replica, until the KV lands
        self.prior: dict[int, list[float]] = {}   # token times delivered before its replica
        self.backlog: list[Request] = []     # no live replica in its pool: held at the router
        self.decode_backlog: list[tuple] = []    # prefilled, no live decode replica

    # -- the pieces the replica loop asks for ------------------------------------------------
    def arrival_rules(self, r: Replica) -> tuple[bool, bool]:
        """Whether arrivals cut this replica's stretches (they add to it or observe it), and
        whether at the end of a step rather than its start (the router observes it)."""
        if r.role != "decode":
            return True, self.entry_observes
        observed = self.decode_observes
        return observed, observed

    def resolve(self, n: int) -> None:
        self.pending -= n
        if self.pending == 0:
            self.finished = True

    def done_steps(self, r: Replica, finished: list[Request], now: float) -> None:
        """Requests that a replica's step just finished."""
        if r.role == "prefill":
            for proxy in finished:
                self.handoff(r, proxy, now)
            return
        self.pending -= len(finished)
        if self.pending == 0:
            self.finished = True

    # -- arrivals and routing --------------------------------------------------------------
    def live(self, pool: list[Replica]) -> list[Replica]:
        return pool if self.faults is None else [r for r in pool if r.up]

    def dispatch(self, req: Request) -> None:
        """Route a request (new, or retried after a failure) to its first replica."""
        pool = self.entry if self.faults is None else [r for r in self.entry if r.up]
        if not pool:
            self.backlog.append(req)
            return
        replica = self.router(req, pool)
        req.replica = replica.index
        if self.disaggregated:
            self._dispatch_split(req, replica)
            return
        reason = rejection_reason(req, replica)
        if reason:
            self.reject(req, reason)
            return
        replica.num_outstanding += 1
        replica.scheduler.add(req)
        _wake(replica)

    def _dispatch_split(self, req: Request, prefill: Replica) -> None:
        """Prefill replica and decode replica at once (Splitwise's cluster-level scheduler).
        The prefill replica gets a proxy: the prompt plus any tokens already streamed (a retry
        recomputes them), one output token."""
        g, spec = req.num_generated, req.spec
        proxy = Request(dataclasses.replace(
            spec, num_prompt_tokens=spec.num_prompt_tokens + g, num_output_tokens=1,
            hash_ids=spec.hash_ids if g == 0 else None))
        live = self.live(self.decode)
        target = self.decode_router(req, live) if live else None
        reason = rejection_reason(proxy, prefill) or \
            rejection_reason(req, target if target is not None else self.decode[0])
        if reason:
            self.reject(req, reason)
            return
        self.real[req.id] = req
        self._assign(req, target)
        prefill.num_outstanding += 1
        prefill.scheduler.add(proxy)
        _wake(prefill)

    def _assign(self, req: Request, target: Replica | None) -> None:
        self.assigned[req.id] = target
        if target is not None:
            target.num_outstanding += 1

    def _unassign(self, req: Request) -> None:
        target = self.assigned.pop(req.id, None)
        if target is not None:
            target.num_outstanding -= 1

    def reject(self, req: Request, reason: str) -> None:
        req.status = Status.REJECTED
        req.reject_reason = reason
        self.resolve(1)

    # -- disaggregated prefill/decode ------------------------------------------------------
    def handoff(self, prefill: Replica, proxy: Request, now: float) -> None:
        """A proxy's prefill is done (its token sampled at ``now``): send the KV on, or finish
        the request here if that was its last token."""
        req = self.real.pop(proxy.id)
        req.num_preemptions += proxy.num_preemptions
        if req.first_scheduled_s is None:
            req.first_scheduled_s = proxy.first_scheduled_s
        if req.id not in self.rec.retries:
            req.num_cached_tokens = proxy.num_cached_tokens
        if req.num_generated + 1 == req.num_output_tokens:   # nothing left to decode
            req.num_generated += 1
            self._deliver(prefill, req, now)
            self._unassign(req)
            req.status, req.finish_s = Status.FINISHED, now
            self.resolve(1)
            return
        tokens = proxy.num_computed_tokens
        pin = -1 - req.id            # the KV stays on the prefill replica until it has landed
        _pin(prefill.blocks, pin, proxy, tokens)
        target = self.assigned.get(req.id)
        if target is None:           # every decode replica is down: wait for one
            self.assigned.pop(req.id, None)
            self.decode_backlog.append((req, prefill, tokens, pin))
        else:
            self._send(req, prefill, target, tokens, pin, now)

    def _send(self, req, prefill, target, tokens, pin, now) -> None:
        t = now + self.transfer_s(tokens, prefill, target)
        if not t > now:
            t = math.nextafter(now, INF)   # strictly later: same-instant order never matters
        self.rec.transfer_s.append(t - now)
        self.push(prefill, t, _UNPIN, (pin, req, target))
        self.push(target, t, _LAND, (req, prefill, pin))

    def push(self, r: Replica, t: float, kind: int, payload) -> None:
        """Something reaches replica ``r`` at ``t`` (> now): queue it, cut a stretch in flight
        back to the steps starting before ``t``, and wake the replica then if it is idle."""
        heappush(r.inbox, (t, payload[1].id if kind == _UNPIN else payload[0].id, kind, payload))
        f = r.flight
        if f is not None and f.stretch is not None and f.starts[-1] >= t:
            keep = bisect_left(f.starts, t)         # >= 1: step 0 started at or before now
            self.rec.log(r).trim(keep)
            del f.starts[keep:], f.ends[keep:]
            r.proc.interrupt()
        self.env.call_at(t, URGENT, lambda: _wake(r))

    def drain(self, r: Replica, now: float) -> None:
        """Take what has reached the replica by ``now`` (at a step boundary), in time order."""
        inbox = r.inbox
        while inbox and inbox[0][0] <= now:
            t, _, kind, payload = heappop(inbox)
            if kind == _UNPIN:
                r.blocks.free(payload[0])
            else:
                self._land(r, payload[0], t)

    def _land(self, r: Replica, req: Request, t: float) -> None:
        """The KV of every token but the one the prefill sampled is on ``r``: that token (in
        transit until now: lost with the transfer if a failure stops it) reaches the client,
        and the request decodes from it."""
        req.num_generated += 1
        self._deliver(r, req, t)
        self.assigned.pop(req.id, None)
        req.num_computed_tokens = req.num_tokens - 1
        req.replica = r.index
        r.scheduler.add(req)

    def _deliver(self, r: Replica, req: Request, t: float) -> None:
        """A token produced elsewhere reaches the client at ``t`` (its time and the gap since
        the request's previous token are recorded by replica ``r``'s scheduler)."""
        if req.first_token_s is None:
            req.first_token_s = t
        else:
            r.scheduler.itl_extra.append(t - req.last_token_s)
        req.last_token_s, req.last_step = t, -2
        self.prior.setdefault(req.id, []).append(t)

    def join_token_times(self) -> None:
        """Token times of requests served by several replicas: one array each."""
        if not any(r.scheduler.record_tokens for r in self.replicas):
            return
        for req in self.rec.requests:
            before = self.prior.get(req.id)
            if before and req.status is Status.FINISHED:
                times = before + (req.token_times if req.token_runs else [])
                req.step_ends, req.token_runs = array("d", times), [[0, len(times)]]

    # -- failures --------------------------------------------------------------------------
    def add_fault(self, t: float, r: Replica, restart_s: float) -> None:
        heappush(self.fault_times, t)
        self.env.call_at(t, LATE, lambda: self.fail(r, t, restart_s))

    def stalled(self) -> bool:
        """Nothing is in flight, queued between replicas or held: no progress is possible
        without a failure (a scheduler deadlock), so injecting more would loop forever."""
        return self.arrivals.done and not self.backlog and not self.decode_backlog and all(
            r.flight is None and not r.inbox for r in self.replicas)

    def fail(self, r: Replica, t: float, restart_s: float) -> None:
        heappop(self.fault_times)
        if not r.up or self.finished or self.stalled():
            return
        self.rec.failures.append((r.index, t))
        f, r.flight = r.flight, None
        if f is not None:            # steps that ended by t stand; the one in flight is lost
            keep = bisect_right(f.ends, t)
            self.rec.log(r).trim(keep)
            if keep:
                finished = f.stretch.apply(f.ends[:keep])
                r.num_outstanding -= len(finished)
                if finished:
                    self.done_steps(r, finished, f.ends[keep - 1])
            r.proc.interrupt()
        else:
            _wake(r)
        r.up = False
        victims = self._evacuate(r)
        old = r.scheduler
        r.scheduler = _fresh(old, r.factory)
        r.num_outstanding = 0
        heappush(self.fault_times, t + restart_s)
        self.env.call_at(t + restart_s, LATE, lambda: self.restart(r, t + restart_s))
        for req in sorted(victims, key=lambda q: q.id):
            self._retry_or_fail(req)

    def _evacuate(self, r: Replica) -> list[Request]:
        """Every request whose KV was on, or on its way to or from, the failed replica; the
        requests that were only assigned to it (still prefilling elsewhere) get another."""
        sched = r.scheduler
        held = sched.held_requests()
        victims = [self.real.pop(p.id) for p in held] if r.role == "prefill" else held
        for t, _, kind, payload in r.inbox:
            if kind == _UNPIN:       # the source of a transfer: lost if still in flight
                _, req, target = payload
                if t <= self.env.now:
                    continue         # it has landed: only this replica's copy is gone
                target.inbox[:] = [e for e in target.inbox if e[3][0] is not req]
                heapify(target.inbox)
            else:                    # a transfer on its way here: release the source's copy
                req, source, pin = payload
                source.inbox[:] = [e for e in source.inbox
                                   if not (e[2] == _UNPIN and e[3][1] is req)]
                heapify(source.inbox)
                source.blocks.free(pin)
            victims.append(req)
        r.inbox.clear()
        lost = [e for e in self.decode_backlog if e[1] is r]
        self.decode_backlog = [e for e in self.decode_backlog if e[1] is not r]
        victims.extend(e[0] for e in lost)
        for req in victims:
            self._unassign(req)
            if req.token_runs:       # tokens it streamed from here stay streamed
                self.prior.setdefault(req.id, []).extend(req.token_times)
                req.token_runs = []
        if r.role == "decode":
            live = [d for d in self.decode if d.up and d is not r]
            for rid in sorted(i for i, d in self.assigned.items() if d is r):
                req = self.real[rid]
                self.assigned[rid] = None
                self._assign(req, self.decode_router(req, live) if live else None)
        return victims

    def _retry_or_fail(self, req: Request) -> None:
        n = self.rec.retries.get(req.id, 0)
        if self.on_failure == "fail" or n >= self.max_retries:
            req.status = Status.FAILED
            req.reject_reason = "replica_failure" if self.on_failure == "fail" \
                else "retries_exhausted"
            self.resolve(1)
            return
        self.rec.retries[req.id] = n + 1
        req.num_computed_tokens = 0
        req.last_step = -2
        self.dispatch(req)

    def restart(self, r: Replica, t: float) -> None:
        heappop(self.fault_times)
        r.up = True
        _wake(r)
        if not self.finished and not self.stalled():
            nxt = self.faults.next_random(r.index, t)
            if nxt is not None:
                self.add_fault(nxt[0], r, nxt[2])
        held, self.backlog = self.backlog, []
        for req in held:
            self.dispatch(req)
        if r.role == "decode":
            live = self.live(self.decode)
            for rid in sorted(i for i, d in self.assigned.items() if d is None):
                self._assign(self.real[rid], self.decode_router(self.real[rid], live))
            waiting, self.decode_backlog = self.decode_backlog, []
            for req, prefill, tokens, pin in waiting:
                target = self.decode_router(req, self.live(self.decode))
                self._assign(req, target)
                self._send(req, prefill, target, tokens, pin, t)


def _pin(blocks: BlockManager, pin: int, proxy: Request, tokens: int) -> None:
    """Hold a finished proxy's KV (``tokens`` tokens) under the id ``pin``. Its blocks were
    freed a moment ago, so they fit; with prefix caching the pin takes the same cached blocks
    back (shared prefixes stay shared) rather than fresh ones."""
    if blocks.caches_prefixes:
        blocks.register(pin, proxy.num_prompt_tokens, proxy.spec.hash_ids)
        cached = blocks.cached_tokens(pin, tokens + 1)
        if cached and blocks.allocate_cached(pin, tokens, cached) is not None:
            return
    blocks.allocate(pin, tokens)


def _fresh(old: Scheduler, factory: Callable[[], Scheduler]) -> Scheduler:
    """A restarted replica's scheduler: empty queues and KV cache, the same step accounting."""
    new = factory()
    new.num_steps, new.itl_diff, new.itl_extra = old.num_steps, old.itl_diff, old.itl_extra
    new.record_tokens, new.step_ends = old.record_tokens, old.step_ends
    return new


def _wake(replica: Replica) -> None:
    if replica.wakeup is not None and not replica.wakeup.triggered:
        replica.wakeup.succeed()


def _arrival_process(env, c: _Cluster):
    arrivals = c.arrivals
    specs = arrivals.specs
    while arrivals.next < len(specs):
        spec = specs[arrivals.next]
        if spec.arrival_s > env.now:
            yield env.at(spec.arrival_s, URGENT)
        _arrive(c, spec)
    arrivals.done = True


def _arrive(c: _Cluster, spec: RequestSpec) -> None:
    c.arrivals.next += 1
    req = Request(spec)
    c.rec.requests.append(req)
    c.dispatch(req)


def _pull_arrivals(c: _Cluster, now: float) -> None:
    """Every arrival due by ``now`` (the pull mode of ``_Cluster.pull``)."""
    arrivals, specs = c.arrivals, c.arrivals.specs
    while arrivals.next < len(specs) and specs[arrivals.next].arrival_s <= now:
        _arrive(c, specs[arrivals.next])
    arrivals.done = arrivals.next == len(specs)


def _replica_loop(env, c: _Cluster, r: Replica):
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
            _pull_arrivals(c, now)
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
                r.flight = _Flight(starts, ends, stretch) if stretch is not None else \
                    _Flight([start], [now], None)
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


def _hold(env, r: Replica, end: float):
    """Wait until ``end``; an interrupt means the flight was cut back (wait for its new end) or
    the replica failed (return False)."""
    while True:
        try:
            yield env.at(end)
            return True
        except simpy.Interrupt:
            if not r.up:
                return False
            end = r.flight.ends[-1]


def _mark_first_scheduled(sched: Scheduler, plan: StepPlan, start: float) -> None:
    """Requests scheduled for the first time in this step (always with a prefill chunk)."""
    if plan.prefill_lens:
        for req in sched._batch.first_scheduled:
            req.first_scheduled_s = start
