"""The scenario's engine run on the wall clock: requests enter as they arrive, tokens leave when
the simulated steps that sample them end.

It is the engine ``simserve run`` uses (engine/: the replica loops, the cluster runtime, the
scenario's policy, KV cache, router and latency model), with two differences:

* **Arrivals are not known ahead.** A request enters at the simulated time it reaches the
  server (``loop.time()`` since the first request), at URGENT priority as the engine's arrival
  events, so a step starting at that instant sees it, and a step in flight does not.
* **The simulation never runs ahead of the wall clock.** SimPy's events are processed only
  once the wall clock has reached their time (:meth:`WallClockSimulation._run_until`); the event
  loop then sleeps until the next one or until a request arrives. Every step holds the clock
  (``fast_forward=False``: engine/loops.py's stepping loop): a step's tokens must leave at its own
  end, so a fast-forwarded stretch would save nothing here, and stepping needs no cutting back
  of stretches planned past an arrival nobody could know.

Given the times the requests arrived, the schedule is therefore exactly the one ``simserve
run`` computes for a trace of those arrivals (``record``: the arrivals and every request's
simulated first and last token times, written by ``simserve serve --record``); what a client
measures differs from it only by the event loop's lateness and the HTTP path.

What is not simulated live: replica failures (``cluster.faults``), and a client that goes away
(vLLM aborts the request; here it runs on to its end).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simserve.engine.build import build_replicas, engine_options
from simserve.engine.clock import URGENT, Clock
from simserve.engine.loops import loop_for
from simserve.engine.replica import Replica
from simserve.engine.runtime import Runtime
from simserve.errors import ConfigError
from simserve.live.api import (E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, Histogram,
                               ReplicaStats, TokenStream)
from simserve.metrics.recorder import Recorder
from simserve.metrics.tokens import TokenLog
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request
from simserve.workload.spec import RequestSpec

if TYPE_CHECKING:
    from simserve.config import Scenario

INF = math.inf


# ``Served.reject_reason`` of a request still running when the server stopped
CUT_AT_SHUTDOWN = "cut_at_shutdown"
# ... and of one still running when the simulation stopped on an error
SIMULATION_ERROR = "simulation_error"


@dataclass(frozen=True, slots=True)
class Served:
    """One request as the simulation served it (``record``): simulated seconds since the first
    request arrived."""

    request_id: int
    replica: int
    arrival_s: float
    num_prompt_tokens: int
    num_output_tokens: int
    first_token_s: float
    finish_s: float
    reject_reason: str


class _Buckets:
    """A histogram being filled (``Histogram`` is its snapshot)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, x: float) -> None:
        self.counts[bisect_left(self.bounds, x)] += 1    # (a value on a bound counts in it)
        self.total += x

    def snapshot(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.total)


class _Counters:
    """A replica's cumulative counters and histograms, as vLLM's Prometheus metrics count
    them."""

    __slots__ = ("preemptions", "prompt_tokens", "generation_tokens", "finished", "ttft",
                 "itl", "e2el", "by_reason")

    def __init__(self) -> None:
        self.preemptions = self.prompt_tokens = self.generation_tokens = self.finished = 0
        self.by_reason: dict[str, int] = {}       # finished, by the finish_reason answered
        self.ttft = _Buckets(TTFT_BUCKETS)
        self.itl = _Buckets(ITL_BUCKETS)
        self.e2el = _Buckets(E2E_BUCKETS)


class _LiveTokenLog(TokenLog):
    """A replica's token log that hands each token to its request's stream, as the step that
    sampled it ends (which is when the wall clock reaches it). It keeps no inter-token
    statistics (the client measures those), so a server's memory does not grow with its
    steps."""

    __slots__ = ("sim", "replica")

    def __init__(self, sim: WallClockSimulation, replica: int):
        super().__init__(False)
        self.sim, self.replica = sim, replica

    def step(self, t_end: float, sampled: list[Request],
             counts: list[int] | None = None) -> None:
        emit = self.sim._emit
        if counts is None:
            for req in sampled:
                emit(req, t_end, self.replica)
        else:                  # speculative decoding: a step's tokens leave as one chunk
            for req, n in zip(sampled, counts):
                emit(req, t_end, self.replica, n)

    def delivered(self, req: Request, t: float) -> None:
        self.sim._emit(req, t, self.replica)


class _LiveRecorder(Recorder):
    """The engine's recorder with live token logs. Its step log is not kept: a server runs for
    as long as it is up, and nothing reads the steps back."""

    def __init__(self, sim: WallClockSimulation):
        super().__init__()
        self._sim = sim

    def token_log(self, replica: Replica) -> TokenLog:
        log = self.tokens.get(replica.index)
        if log is None:
            log = self.tokens[replica.index] = _LiveTokenLog(self._sim, replica.index)
        return log

    def step(self, replica: Replica, start: float, duration: float, plan: StepPlan,
             kv_blocks_used: int | None = None) -> None:
        self._sim.counters[replica.index].preemptions += plan.num_preempted


class _LiveRuntime(Runtime):
    """The cluster runtime that never finishes: requests come for as long as the server is up,
    and it tells the simulation about the ones it refuses."""

    def __init__(self, sim: WallClockSimulation, *args: Any):
        super().__init__(*args)
        self.sim = sim
        self.finished = False
        self.pending = 0

    def resolve(self, n: int) -> None:
        pass

    def done_steps(self, r: Replica, finished: list[Request], now: float) -> None:
        if r.role == "prefill":
            super().done_steps(r, finished, now)   # (hand-offs to the decode replicas)

    def reject(self, req: Request, reason: str) -> None:
        super().reject(req, reason)
        self.sim._end(req, reason)


class WallClockSimulation:
    """A :class:`~simserve.live.api.LiveSimulation` of a scenario's cluster (the module
    docstring). Create it inside the running event loop; ``close`` stops it."""

    def __init__(self, scenario: Scenario, *, record: bool = False,
                 loop: asyncio.AbstractEventLoop | None = None):
        s = scenario
        if s.cluster.faults is not None and s.cluster.faults.enabled:
            raise ConfigError("cluster.faults", "simserve serve does not inject replica "
                                                "failures; disable them to serve this scenario")
        self.scenario = s
        self.model_name = s.model.name
        self.vocab_size = s.model.vocab_size
        self.replicas = build_replicas(s)
        self.max_model_len = min(r.max_model_len for r in self.replicas)
        opts = engine_options(s, self.replicas)
        self.counters = {r.index: _Counters() for r in self.replicas}
        self.env = Clock()
        self._pinned: dict[int, Replica] = {}
        router = _pinning(opts["router"], self._pinned)
        self.rt = _LiveRuntime(self, self.env, _LiveRecorder(self), [], self.replicas, router,
                               False, opts.get("decode_router"), opts.get("transfer_s"), None,
                               "retry", 0)
        replica_loop = loop_for(self.rt.mode)   # stepped: fast_forward False (docstring)
        for r in self.replicas:
            r.proc = self.env.process(replica_loop(self.env, self.rt, r))
        self._outputs = _output_lengths(s)
        self._num_submitted = 0
        self._streams: dict[int, TokenStream] = {}     # requests not yet done, by id
        self._reasons: dict[int, str] = {}    # their finish_reason, for /metrics
        self._requests: dict[int, Request] = {}
        self._loop = loop or asyncio.get_running_loop()
        self._t0: float | None = None        # loop.time() of the first request: simulated 0
        self._timer: asyncio.TimerHandle | None = None
        self.error: BaseException | None = None
        self.served: list[Served] | None = [] if record else None
        self._run_until(0.0)                 # start the replica processes (idle at 0)

    @property
    def num_submitted(self) -> int:
        return self._num_submitted

    @property
    def clock_origin(self) -> float | None:
        """``loop.time()`` (time.monotonic) at simulated 0: the first request's arrival."""
        return self._t0

    # -- LiveSimulation --------------------------------------------------------------------
    def now(self) -> float:
        return 0.0 if self._t0 is None else self._loop.time() - self._t0

    def submit(self, num_prompt_tokens: int, num_output_tokens: int,
               replica: int | None = None, finish_reason: str = "length") -> TokenStream:
        if self.error is not None:
            raise RuntimeError("the simulation stopped on an error") from self.error
        if self._t0 is None:                 # the first request arrives at exactly 0
            self._t0 = self._loop.time()
            t = 0.0
        else:                                # (a late timer leaves the clock behind, not ahead)
            t = max(self.now(), self.env.now)
        self._run_until(t, before=True)      # everything due before the arrival has happened
        rid = self._num_submitted
        self._num_submitted += 1
        stream = TokenStream(rid, num_prompt_tokens, num_output_tokens, t)
        self._streams[rid] = stream
        self._reasons[rid] = finish_reason
        req = self._requests[rid] = Request(RequestSpec(rid, t, num_prompt_tokens,
                                                        num_output_tokens))
        if replica is not None:
            self._pinned[rid] = self.replicas[replica]
        self.env.call_at(t, URGENT, lambda: self.rt.dispatch(req))
        self._run_until(t)                   # the arrival itself (a rejection ends it here)
        self._pinned.pop(rid, None)
        self._arm()
        return stream

    def draw_output_tokens(self) -> int:
        return next(self._outputs)

    def stats(self) -> list[ReplicaStats]:
        out = []
        for r in self.replicas:
            sched, c = r.scheduler, self.counters[r.index]
            blocks = sched.blocks
            out.append(ReplicaStats(r.index, len(sched.running), sched.num_waiting,
                                    blocks.num_used / blocks.num_blocks, c.preemptions,
                                    c.prompt_tokens, c.generation_tokens, c.finished,
                                    c.ttft.snapshot(), c.itl.snapshot(), c.e2el.snapshot(),
                                    dict(c.by_reason)))
        return out

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for rid, stream in list(self._streams.items()):   # wake every waiting handler
            req = self._requests.get(rid)
            if self.served is not None and req is not None:   # (the record: every request)
                nan = math.nan
                self.served.append(Served(
                    rid, req.replica, stream.arrival_s, stream.num_prompt_tokens,
                    stream.num_output_tokens,
                    nan if stream.first_token_s is None else stream.first_token_s, nan,
                    CUT_AT_SHUTDOWN if self.error is None else SIMULATION_ERROR))
            stream.end()
        self._streams.clear()
        self._reasons.clear()
        self._requests.clear()

    # -- the wall-clock pump ---------------------------------------------------------------
    def _run_until(self, t: float, before: bool = False) -> None:
        """Process every simulated event due by ``t`` (``before``: due before ``t``, so that an
        arrival at ``t`` comes first among the events at ``t``, as in the engine)."""
        env = self.env
        try:
            if before:
                while env.peek() < t:
                    env.step()
            else:
                while env.peek() <= t:
                    env.step()
        except BaseException as e:           # a bug: stop serving rather than serve nonsense
            self.error = e
            self.close()
            raise

    def _tick(self) -> None:
        self._timer = None
        self._run_until(self.now())
        self._arm()

    def _arm(self) -> None:
        """Sleep until the next simulated event (an arrival re-arms it)."""
        nxt = self.env.peek()
        if nxt == INF or self._t0 is None:
            return
        when = self._t0 + nxt
        if self._timer is not None:
            if self._timer.when() <= when:
                return
            self._timer.cancel()
        self._timer = self._loop.call_at(when, self._tick)

    # -- what the engine tells it ----------------------------------------------------------
    def _emit(self, req: Request, t: float, replica: int, n: int = 1) -> None:
        if self._requests.get(req.id) is not req:
            return          # a disaggregated prefill's proxy: its token leaves when KV lands
        stream = self._streams[req.id]
        c = self.counters[replica]
        if not stream.emitted:
            c.prompt_tokens += req.num_prompt_tokens
            c.ttft.observe(t - stream.arrival_s)
        else:
            assert stream.last_token_s is not None
            c.itl.observe(t - stream.last_token_s)
        stream.emit(n, t)
        c.generation_tokens += n
        # (with async scheduling num_generated already counts the tokens of steps in flight)
        if req.num_generated - req.num_pending >= req.num_output_tokens:
            c.finished += 1
            reason = self._reasons.get(req.id, "length")
            c.by_reason[reason] = c.by_reason.get(reason, 0) + 1
            c.e2el.observe(t - stream.arrival_s)
            self._end(req, "", replica)

    def _end(self, req: Request, reason: str, replica: int | None = None) -> None:
        stream = self._streams.pop(req.id, None)
        self._reasons.pop(req.id, None)
        if stream is None:
            return
        del self._requests[req.id]
        stream.end(reason)
        if self.served is not None:
            nan = math.nan
            self.served.append(Served(
                req.id, req.replica if replica is None else replica, stream.arrival_s,
                stream.num_prompt_tokens, stream.num_output_tokens,
                nan if stream.first_token_s is None else stream.first_token_s,
                nan if stream.last_token_s is None else stream.last_token_s, reason))


def _pinning(router: Callable[[Request, Sequence[Replica]], Replica],
             pinned: dict[int, Replica]) -> Callable[[Request, Sequence[Replica]], Replica]:
    """The scenario's router, except for requests pinned to a replica."""

    def route(req: Request, pool: Sequence[Replica]) -> Replica:
        r = pinned.get(req.id)
        return r if r is not None else router(req, pool)

    route.observes_state = getattr(router, "observes_state", True)   # type: ignore[attr-defined]
    return route


def _output_lengths(s: Scenario):
    """The scenario workload's output lengths in order, again and again: what a request that
    does not fix its length gets (an exact client sees the scenario's own lengths)."""
    from simserve.workload import build_workload
    lengths = [r.num_output_tokens for r in build_workload(s.workload, s.seed, s.base_dir)]
    return itertools.cycle(lengths or [1])
