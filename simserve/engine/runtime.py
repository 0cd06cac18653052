"""The cluster at run time (:class:`Runtime`): arrivals, routing, the KV hand-off of a
disaggregated cluster (a prefill replica runs a *proxy* of the request and holds its KV, a
*pin*, while it crosses the link: docs/cluster.md), failures and retries. The replica loops ask
it for the next outside events and tell it what their steps finished; what reaches a replica at
a time not known in advance (a landing, a released pin) goes to its *inbox*.

Event priorities at one instant: arrivals (and inbox wake-ups) are URGENT, so a step starting
then sees them; step completions NORMAL; failures and restarts LATE, so steps that ended by the
failure time stand and the step in flight is lost."""

from __future__ import annotations

import dataclasses
import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Generator, Sequence
from heapq import heapify, heappop, heappush
from itertools import islice
from typing import Any, cast

from simserve.clients import ClientGate
from simserve.engine.clock import LATE, NORMAL, URGENT, Clock
from simserve.engine.mode import ASYNC_COUNTED, COUNTED, Mode
from simserve.engine.replica import Replica, Router, rejection_reason
from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.metrics.recorder import Recorder
from simserve.metrics.tokens import moved
from simserve.sched.core import Scheduler
from simserve.sched.inflight import InFlight
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request, Status
from simserve.sched.async_stretch import AsyncStretch
from simserve.sched.stretch import Joined, Stretch
from simserve.workload.spec import RequestSpec, SpecColumns

INF = math.inf
_LAND, _UNPIN = 0, 1     # inbox entries: a KV cache landing; a prefill replica's KV released


class Arrivals:
    """The workload's cursor: the next arrival time is what bounds a fast-forward stretch (a
    replica's own, over the arrivals routed to it, when they are routed ahead: ``Routed``)."""

    def __init__(self, specs: Sequence[RequestSpec]):
        self.specs = specs
        self.next = 0
        self.done = False
        # the arrival times as a column where the workload has one (SpecColumns): the next
        # time is read without making that request's spec
        self.times = getattr(specs, "arrival_s", None) or [s.arrival_s for s in specs]
        self.next_time = self.times[0] if specs else INF   # (read at every step)

    def advance(self) -> RequestSpec:
        """The next arrival's spec; the cursor moves past it."""
        spec = self.specs[self.next]
        self.next += 1
        self.next_time = self.times[self.next] if self.next < len(self.times) else INF
        return spec

    def due(self, t: float) -> list[RequestSpec]:
        """The specs of the arrivals due by ``t``, in order, without moving the cursor
        (:meth:`skip` then moves it past them)."""
        times, i = self.times, self.next
        n = len(times)
        specs = []
        while i < n and times[i] <= t:
            specs.append(self.specs[i])
            i += 1
        return specs

    def skip(self, num: int) -> None:
        """Move the cursor past the next ``num`` arrivals (read by :meth:`due`)."""
        self.next += num
        self.next_time = self.times[self.next] if self.next < len(self.times) else INF
        self.done = self.next_time == INF

    def ahead_time(self, n: int) -> float:
        """The time of the ``n``-th arrival to come (n >= 1; infinite past the last)."""
        i = self.next + n - 1
        return self.times[i] if i < len(self.times) else INF


class Routed(Sequence[RequestSpec]):
    """The specs of the arrivals routed to one replica (``Runtime.route_ahead``), in order:
    positions ``where`` of ``specs``, each spec made when read (a workload's columns make
    theirs so)."""

    def __init__(self, specs: Sequence[RequestSpec], times: Sequence[float],
                 where: Sequence[int]):
        self.specs, self.where = specs, where
        self.arrival_s = array("d", map(times.__getitem__, where))   # (Arrivals' times)

    def __len__(self) -> int:
        return len(self.where)

    def __getitem__(self, i: int) -> RequestSpec:   # type: ignore[override]
        return self.specs[self.where[i]]


class Runtime:
    """What the replicas share: the pools, routers, the count of unresolved requests, requests
    in transit between replicas, failures. All times are SimPy's."""

    def __init__(self, env: Clock, rec: Recorder, specs: Sequence[RequestSpec],
                 replicas: Sequence[Replica], router: Router, fast_forward: bool,
                 decode_router: Router | None, transfer_s: Callable[..., float] | None,
                 faults: Any, on_failure: str, max_retries: int):
        self.env, self.rec = env, rec
        self.arrivals = Arrivals(specs)
        self.replicas = list(replicas)
        for r in self.replicas:
            r.tokens = rec.token_log(r)
        self.entry = [r for r in replicas if r.role != "decode"]
        self.decode = [r for r in replicas if r.role == "decode"]
        if self.decode and (decode_router is None or transfer_s is None
                            or any(r.role != "prefill" for r in self.entry)):
            raise ValueError("decode replicas need prefill replicas (no mixed ones), a "
                             "decode_router and transfer_s")
        self.router = router
        # a disaggregated run has both (checked above); a colocated one never calls either
        self.decode_router: Router = decode_router or _no_decode_pool
        self.transfer_s: Callable[..., float] = transfer_s or _no_decode_pool
        # how the replicas are stepped (engine/mode.py): the loop, what may cut a step short
        self.mode = Mode.of(self.replicas, fast_forward, faults, router, decode_router)
        # an arrival cuts back only the stretch in flight of the replica it goes to, and the
        # router counts the finishes in flight first (the counted loop: engine/loops.py)
        self.counted = self.mode.loop in (COUNTED, ASYNC_COUNTED)
        # ... and what else the router reads of a stretch in flight (routing.py's
        # reads_flights): the KV blocks in use (least_kv), tokens of work left (jsq_tokens),
        # the prefix cache (prefix_aware)
        reads = getattr(router, "reads_flights", ()) if self.counted else ()
        self.reads_kv, self.reads_tokens = "kv" in reads, "tokens" in reads
        self.reads_cache = "cache" in reads
        # replica index -> its own arrivals, when they are routed before the run; then also
        # each request's place in the workload (``simulate`` puts its requests back in order)
        self.arrival_order: Callable[[Request], int] | None = None
        self.routed: dict[int, Arrivals] | None = \
            self.route_ahead(specs) if self.mode.routed_ahead else None
        self.faults, self.on_failure, self.max_retries = faults, on_failure, max_retries
        if faults is not None and any(r.factory is None for r in replicas):
            raise ValueError("fault injection needs each replica's scheduler factory")
        self.pending = len(specs)     # requests not yet finished, rejected or failed
        # called with the number of requests resolved so far, each time some are (a progress
        # bar: simulate(progress=...)); None costs nothing
        self.progress: Callable[[int], None] | None = None
        self.finished = not specs
        self.fault_times: list[float] = []   # pending failure and restart times (a heap)
        self.real: dict[int, Request] = {}   # request id -> the request its proxy prefills
        self.assigned: dict[int, Replica | None] = {}   # decode replica, until the KV lands
        self.backlog: list[Request] = []     # no live replica in its pool: held at the router
        # prefilled, no live decode replica: (request, prefill replica, tokens, pin)
        self.decode_backlog: list[tuple[Request, Replica, int, int]] = []
        self.gate: ClientGate | None = None   # the benchmark client's concurrency limit

    def route_ahead(self, specs: Sequence[RequestSpec]) -> dict[int, Arrivals]:
        """Each replica's arrivals, routed now (a router that chooses by their order alone:
        ``ahead``), as the router would route them one by one at their times. The recorder's
        first arrival (what its folding waits for) is the workload's first, whichever replica
        takes it first; ``arrival_order`` gives each request's place in the workload."""
        if isinstance(specs, SpecColumns) or all(
                a.request_id < b.request_id for a, b in zip(specs, islice(specs, 1, None))):
            self.arrival_order = _request_id    # (a built workload's ids are its order)
        else:
            place = {s.request_id: i for i, s in enumerate(specs)}
            self.arrival_order = lambda q: place[q.id]
        k = len(self.entry)
        picks = self.router.ahead(len(specs), k)   # type: ignore[attr-defined]
        where = [array("q") for _ in range(k)]       # (typed: 8 bytes a request)
        for i, p in enumerate(picks):
            where[p].append(i)
        times = self.arrivals.times
        if len(times):
            self.rec.first_arrival = times[0]
        return {r.index: Arrivals(Routed(specs, times, w)) for r, w in zip(self.entry, where)}

    def arrivals_of(self, r: Replica) -> Arrivals:
        """The arrivals a solo loop's replica takes itself: all of them, or its own."""
        return self.arrivals if self.routed is None else self.routed[r.index]

    # -- the pieces the replica loop asks for ------------------------------------------------
    def arrival_rules(self, r: Replica) -> tuple[bool, bool]:
        """Whether arrivals cut this replica's stretches (they add to it or observe it), and
        whether at the end of a step rather than its start (the router observes it)."""
        if r.role != "decode":
            return True, self.mode.entry_observes
        observed = self.mode.decode_observes
        return observed, observed

    def resolve(self, n: int) -> None:
        self.pending -= n
        gate = self.gate
        if gate is not None:
            if gate.delay_s:    # the client learns of the end a front-end delay later
                self.env.call_at(self.env.now + gate.delay_s, NORMAL, lambda: gate.release(n))
            else:
                gate.release(n)
        if self.pending == 0:
            self.finished = True
        if self.progress is not None:
            self.progress(len(self.arrivals.specs) - self.pending)

    def finish_steps(self, r: Replica, sched: Scheduler, plan: StepPlan,
                     stretch: Stretch | None, ends: list[float], now: float,
                     settled: int = 0) -> float:
        """Apply a replica's step that ended at ``now`` (or the steps of ``stretch`` that ran,
        ending at ``ends``): its scheduler's counters, the token log, the requests it
        finished (``settled`` of them counted already: ``settle``); returns ``now``. A
        stretch cut back to its first step is that step (``plan``), applied as one."""
        tokens = r.tokens
        assert tokens is not None
        if stretch is not None and len(ends) > 1:
            finished = stretch.apply(ends)
            tokens.stretch(stretch, ends)
        else:
            finished = sched.complete(plan, now)
            tokens.step(now, sched.sampled, sched.sampled_tokens)
        r.num_outstanding -= len(finished) - settled
        if finished:
            self.done_steps(r, finished, now)
        return now

    def deliver_step(self, r: Replica, sched: Scheduler, step: InFlight, now: float) -> None:
        """The output of a replica's launched step (async scheduling) is processed at ``now``:
        its tokens reach the client, the requests it finished are done."""
        tokens = r.tokens
        assert tokens is not None
        finished = sched.deliver(step, now)
        tokens.step(now, sched.sampled, None)
        r.num_outstanding -= len(finished)
        if finished:
            self.done_steps(r, finished, now)

    def done_steps(self, r: Replica, finished: list[Request], now: float) -> None:
        """Requests that a replica's step just finished."""
        if r.role == "prefill":
            for proxy in finished:
                self.handoff(r, proxy, now)
            return
        self.resolve(len(finished))

    # -- arrivals and routing --------------------------------------------------------------
    def live(self, pool: list[Replica]) -> list[Replica]:
        return pool if self.faults is None else [r for r in pool if r.up]

    def dispatch(self, req: Request, to: Replica | None = None) -> None:
        """Route a request (new, or retried after a failure) to its first replica (``to``: a
        solo loop's replica, taking its own arrivals: the router's choice, or forced)."""
        if to is not None:
            replica = to
        else:
            pool = self.entry if self.faults is None else [r for r in self.entry if r.up]
            if not pool:
                self.backlog.append(req)
                return
            if self.counted:
                self.settle(pool)
            replica = self.router(req, pool)
        req.replica = replica.index
        if self.mode.disaggregated:
            self._dispatch_split(req, replica)
            return
        reason = rejection_reason(req, replica)
        if reason:
            self.reject(req, reason)
            return
        replica.num_outstanding += 1
        if self.counted:    # its next step sees the request: the steps after are not the same
            self.cut_back(replica, self.env.now)
        replica.scheduler.add(req)
        wake(replica)

    def settle(self, pool: list[Replica]) -> None:
        """The counted loop's replicas as the router sees them now: each request that a
        stretch in flight finished in a step that ended before now is no longer counted in
        ``num_outstanding`` (a step that ends now has not ended for an arrival now: arrivals
        come first), as stepping would have it (the stretch is applied at its end:
        ``finish_steps`` takes the settled ones off what it counts). For a router that reads
        KV use, tokens of work left or the prefix cache, each stretch in flight's at the step it
        is at, likewise (``routing.kv_in_use``, ``routing.tokens_left``; with prefix caching
        its named blocks' operations replayed up to that step: ``Stretch.kv_at``)."""
        now = self.env.now
        for q in pool:
            f = q.flight
            if f is None:
                continue
            if f.finish_ends:
                n = bisect_left(f.finish_ends, now)
                if n > f.settled:
                    q.num_outstanding -= n - f.settled
                    f.settled = n
            s = f.stretch
            if s is None or not (self.reads_kv or self.reads_tokens or self.reads_cache):
                continue
            # the step it is at: the last one that started (async: was scheduled) before now
            # (one that starts now is not scheduled yet for an arrival now)
            i = bisect_left(f.starts, now) - 1
            if self.reads_kv or self.reads_cache:
                # with prefix caching the named blocks' operations replayed up to that step
                # (the block manager then holds what stepping's holds: its prefix cache)
                kv = s.kv_at(i)
                if kv is None:
                    if f.used is None:
                        f.used = s.blocks_used()
                    kv = f.used[i]
                f.kv_now = kv
            if self.reads_tokens:
                sched = q.scheduler
                f.tokens_now = s.tokens_left(i) + sum(
                    r.num_prompt_tokens + r.num_output_tokens - r.num_computed_tokens
                    for queue in (sched.waiting, sched.swapped) for r in queue)

    def cut_back(self, r: Replica, t: float) -> None:
        """Cut the stretch in flight on ``r`` (if any) back to its steps that start before
        ``t`` (an async stretch's: that are scheduled before ``t``; ``Flight.starts`` holds
        those times): the replica holds the clock until the last one kept ends (async: until
        the output before it is delivered), then plans again. (The counted loops record a
        stretch in flight once it is over.)"""
        f = r.flight
        if f is not None and f.stretch is not None and f.starts[-1] >= t:
            keep = bisect_left(f.starts, t)         # >= 1: step 0 started before t
            if not self.counted:
                self.rec.log(r).trim(keep)
            f.stretch.cut_back(keep)
            del f.starts[keep:], f.ends[keep:]      # (a sync stretch's starts are the flight's)
            if f.finish_ends:                       # (only those of the steps kept)
                del f.finish_ends[bisect_right(f.finish_ends, f.ends[-1]):]
            r.proc.interrupt()

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
        wake(prefill)

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

    def _send(self, req: Request, prefill: Replica, target: Replica, tokens: int, pin: int,
              now: float) -> None:
        t = now + self.transfer_s(tokens, prefill, target)
        if not t > now:
            t = math.nextafter(now, INF)   # strictly later: same-instant order never matters
        self.rec.transfer_s.append(t - now)
        self.push(prefill, t, _UNPIN, (pin, req, target))
        self.push(target, t, _LAND, (req, prefill, pin))

    def push(self, r: Replica, t: float, kind: int, payload: tuple[Any, ...]) -> None:
        """Something reaches replica ``r`` at ``t`` (> now): queue it, cut a stretch in flight
        back to the steps starting before ``t``, and wake the replica then if it is idle."""
        heappush(r.inbox, (t, payload[1].id if kind == _UNPIN else payload[0].id, kind, payload))
        self.cut_back(r, t)
        self.env.call_at(t, URGENT, lambda: wake(r))

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
        """A token produced elsewhere reaches the client at ``t`` (recorded by replica ``r``'s
        token log, with the gap since the request's previous token)."""
        self.rec.token_log(r).delivered(req, t)   # (r.tokens: the same log)

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
            if keep:             # (only a stretch: a plain step's end is its flight's end)
                assert isinstance(f.stretch, Stretch)   # (async runs have no failures)
                ends = f.ends[:keep]
                self.finish_steps(r, r.scheduler, f.stretch.first_plan, f.stretch, ends,
                                  ends[-1])
            r.proc.interrupt()
        else:
            wake(r)
        r.up = False
        victims = self._evacuate(r)
        old = r.scheduler
        assert r.factory is not None        # fault injection needs one (checked at start)
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
        for req in victims:          # (tokens it streamed from here stay streamed)
            self._unassign(req)
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
        moved(req)
        self.dispatch(req)

    def restart(self, r: Replica, t: float) -> None:
        heappop(self.fault_times)
        r.up = True
        wake(r)
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
        prefix = cast(PrefixBlockManager, blocks)
        prefix.register(pin, proxy.num_prompt_tokens, proxy.spec.hash_ids)
        cached = prefix.cached_tokens(pin, tokens + 1)
        if cached and prefix.allocate_cached(pin, tokens, cached) is not None:
            return
    blocks.allocate(pin, tokens)


def _request_id(req: Request) -> int:
    return req.id


def _no_decode_pool(*args: Any) -> Any:
    raise AssertionError("a colocated cluster has no decode pool")


def _fresh(old: Scheduler, factory: Callable[[], Scheduler]) -> Scheduler:
    """A restarted replica's scheduler: empty queues and KV cache (its token log goes on)."""
    new = factory()
    new.record_tokens = old.record_tokens
    new.latency = old.latency
    return new


def wake(replica: Replica) -> None:
    if replica.wakeup is not None and not replica.wakeup.triggered:
        replica.wakeup.succeed()


def arrival_process(env: Clock, c: Runtime) -> Generator[Any, Any, None]:
    arrivals = c.arrivals
    gate = c.gate
    while arrivals.next_time < INF:
        if arrivals.next_time > env.now:
            yield env.at(arrivals.next_time, URGENT)
        if gate is None:
            _arrive(c, arrivals.advance())
            continue
        while not gate.admits():                 # the client's --max-concurrency
            yield gate.wait(env)
        _arrive(c, gate.send(arrivals.advance(), env.now))
    arrivals.done = True


def _arrive(c: Runtime, spec: RequestSpec, to: Replica | None = None) -> None:
    req = Request(spec)
    c.rec.add_request(req)
    c.dispatch(req, to)


def join_arrivals(c: Runtime, r: Replica, stretch: Stretch | AsyncStretch, j: int, start: float,
                  decoding: int, due_by: float | None = None,
                  running: int | None = None) -> tuple[Joined, float] | None:
    """The solo loop's ``join`` (``Stretch.price``): the arrivals due by ``start``, the start
    of the stretch's step ``j``, at which ``decoding`` members decode. If ``schedule()`` would
    admit every one of them whole then (the policy's ``stretch_admits`` of their prompts past
    their cached prefixes; none rejected; their blocks and every member's growth fit the
    stretch, and their cache hits are sure: ``Stretch.join_hits``), they arrive
    and are admitted as stepping would (all arrive, then each is admitted in turn) and join
    the stretch; the next arrival's time is the new cut. Otherwise None, and nothing changed:
    the stretch ends before step j and the loop takes them as it would have.

    Under async scheduling (``AsyncStretch``) step j is scheduled before it starts: the
    arrivals ``due_by`` its schedule time join, beside ``decoding`` decodes with ``running``
    requests running (those whose last token is in flight keep their slots)."""
    arrivals = c.arrivals_of(r)
    due = arrivals.due(start if due_by is None else due_by)
    sched = r.scheduler
    specs = sched.admission_order(due)   # (the order schedule() would admit them in)
    blocks = sched.blocks
    # rejection_reason's limits: max_model_len, and blocks_for(total) <= num_blocks, that is
    # total <= num_blocks * block_size
    limit = min(r.max_model_len, blocks.num_blocks * blocks.block_size)
    prompts = [s.num_prompt_tokens for s in specs]
    for spec, p in zip(specs, prompts):
        if p + spec.num_output_tokens > limit:
            return None                       # to be rejected (rejection_reason): step it
    hits = _joining_hits(r, stretch, specs, prompts, j, decoding, running)
    if hits is None:
        return None
    arrivals.skip(len(due))
    for spec in due:
        _arrive(c, spec, r)
    return _admit_waiting(r, stretch, prompts, hits, j, start), arrivals.next_time


def join_waiting(c: Runtime, r: Replica, ahead: int, stretch: Stretch | AsyncStretch, j: int,
                 start: float, decoding: int,
                 running: int | None = None) -> tuple[Joined, float] | None:
    """The counted loop's ``join`` (``Stretch.rejoin``): the requests routed to ``r`` while
    its stretch was in flight, waiting now (nothing else waits beside a stretch past
    finishes), join it at its step ``j``, starting at ``start``, at which ``decoding`` members
    decode, as ``join_arrivals`` would have them join; the next cut is the arrival ``ahead``
    arrivals on. None if there are none, or if ``schedule()`` would not admit them whole.
    (An async stretch's, ``running`` requests running: the async counted loop's.)"""
    sched = r.scheduler
    waiting = sched.waiting
    if not waiting:
        return None
    specs = [q.spec for q in waiting]         # (in the order schedule() admits them)
    prompts = [s.num_prompt_tokens for s in specs]
    hits = _joining_hits(r, stretch, specs, prompts, j, decoding, running)
    if hits is None:
        return None
    return _admit_waiting(r, stretch, prompts, hits, j, start), c.arrivals.ahead_time(ahead)


def _joining_hits(r: Replica, stretch: Stretch | AsyncStretch, specs: list[RequestSpec],
                  prompts: list[int], j: int, decoding: int,
                  running: int | None) -> list[int] | None:
    """The prompt tokens each of ``specs`` would find cached if they joined ``stretch`` at
    step ``j`` (``Stretch.join_hits``), if ``schedule()`` would admit them all whole there;
    None otherwise."""
    hits = stretch.join_hits(specs, j, decoding)   # their cached prefixes; None: no room
    if hits is None or not r.scheduler.stretch_admits([p - h for p, h in zip(prompts, hits)],
                                                      decoding, running):
        return None
    return hits


def _admit_waiting(r: Replica, stretch: Stretch | AsyncStretch, prompts: list[int],
                   hits: list[int], j: int, start: float) -> Joined:
    """Admit the waiting requests, whose prompts are ``prompts`` (``hits`` of them cached), at
    step ``j`` of ``stretch``, starting at ``start``, in turn as ``schedule()`` would."""
    sched = r.scheduler
    joined = []
    for p, hit in zip(prompts, hits):
        req = sched.waiting[0]
        joined.append((req, p, stretch.admit(req, p, hit, j, start), hit))
    return joined


def pull_arrivals(c: Runtime, r: Replica, arrivals: Arrivals, now: float) -> None:
    """Every arrival of ``arrivals`` (``c.arrivals_of(r)``) due by ``now``, to replica ``r``
    (``Mode.pull``: the solo loops)."""
    while arrivals.next_time <= now:
        _arrive(c, arrivals.advance(), r)
    arrivals.done = arrivals.next_time == INF
