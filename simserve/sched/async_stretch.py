"""Fast-forward under async scheduling: a decode stretch of a batch queue of two, planned,
priced and applied at once.

With async scheduling (engine/loops.py's ``batch_queue_loop``, vLLM's AsyncScheduler) step
n + 1 is scheduled when step n starts, right after the output of step n - 1 is delivered: it
sees the arrivals and the frees up to then. A stretch starts where the stepped loop would
schedule step 0 with the step before it (``held``) in flight: step i is scheduled at
e(i - 2), the end of step i - 2 (e(-2) is now, e(-1) the end of ``held``), and starts on the
device at e(i - 1) once its CPU part is done (``AsyncTiming.launch``)::

    e(i) = max(e(i - 1), max(r(i - 1), e(i - 2)) + o(i)) + (d(i) - o(i))
    r(i) = max(r(i - 1), e(i - 2)) + o(i)       (the CPU free again; o = min(cpu_s, d))

Its steps decode every running request but those whose last token is in flight: with nothing
waiting and no arrival seen, every step repeats that decision (for a policy whose admission is
monotone and that runs on past finishes), so the membership is a sync stretch's: a member
with s tokens left takes steps 0 .. s - 1 and is in no later plan (its last token is in
flight at the next schedule). What differs is the clock (above) and when a member's blocks are
freed: when its last step's output is delivered, at e(s - 1), so the step scheduled then
(s + 1) is the first to see them free; the step scheduled at e(s - 2) still counts them, and it
in ``running``.

The stretch ends before the first step that would be scheduled at or after the next arrival,
and at its last step that step stays in flight: the stepped loop goes on from there, with the
steps before it delivered. So the state after it is exactly the stepped loop's, step for step
(``tests/property``: async runs fast-forwarded against stepped, on every latency model).

    stretch = AsyncStretch.plan(sched, plan, max_steps)        # None: step it
    stretch.price(pricing, now, held_end, cpu_free, cut)         # the steps' times
    rows = stretch.rows(running, used)                           # the recorder's
    finished, in_flight = stretch.apply()                        # after ``held`` is delivered
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop
from operator import itemgetter
from typing import TYPE_CHECKING

from simserve.kv.blocks import BlockManager
from simserve.sched.inflight import InFlight
from simserve.sched.plan import Prices, StepPlan
from simserve.sched.stretch import INF, Member, Pricing, _fit_blocks, _forget, stretch_prices

if TYPE_CHECKING:
    from simserve.sched.core import Scheduler
    from simserve.sched.request import Request

_stop = itemgetter(3)


class AsyncStretch:
    """Steps 0 .. k - 1 of an async decode stretch on one scheduler, starting with
    ``first_plan`` (just scheduled, with one step in flight). ``members``: the requests it
    decodes, in running order, each a :data:`~simserve.sched.stretch.Member` (offset 0)."""

    __slots__ = ("sched", "first_plan", "members", "num_steps", "starts", "durations", "ends",
                 "cpu_free", "segments")

    def __init__(self, sched: Scheduler, plan: StepPlan, members: list[Member], k: int):
        self.sched = sched
        self.first_plan = plan
        self.members = members
        self.num_steps = k
        # set by price(): each step's recorded start and duration (as AsyncTiming.launch
        # records them), its end, and when the CPU is free after the last one's CPU part;
        # the segments priced: (first step, members decoding)
        self.starts: list[float] = []
        self.durations: list[float] = []
        self.ends: list[float] = []
        self.cpu_free = 0.0
        self.segments: list[tuple[int, int]] = []

    # -- planning --------------------------------------------------------------------------
    @classmethod
    def plan(cls, sched: Scheduler, plan: StepPlan, max_steps: int) -> AsyncStretch | None:
        """The stretch that starts with ``plan`` (just made by ``schedule()`` with one step in
        flight), of at most ``max_steps`` steps; None where it cannot be (it is stepped)."""
        blocks = sched.blocks
        if (max_steps < 2 or type(blocks) is not BlockManager   # (named or host-tier blocks)
                or sched.speculative is not None or sched.waiting or sched.swapped
                or sched.num_parked or sched.holds_sampled or sched.decode_stagger
                or not sched.facts.monotone_admission or not sched.facts.continues_past_finish
                or plan.prefill_lens or plan.num_preempted or plan.swap_in_blocks
                or plan.swap_out_blocks or plan.num_sampled != len(plan.request_ids)
                or len(plan.decode_ctx) != len(plan.request_ids)):
            return None
        ids = plan.request_ids
        held = blocks.blocks_held
        members: list[Member] = []
        j, n = 0, len(ids)
        for r in sched.running:
            left = r.num_output_tokens - r.num_generated
            if r.num_pending and left <= 0:
                continue            # its last token is in flight: out of every plan from now
            if j == n or ids[j] != r.id:
                return None         # a running request the plan leaves out: not a stretch
            members.append((r, r.num_computed_tokens, held[r.id], left, 0))
            j += 1
        if j != n:
            return None
        k = min(max_steps, max(map(_stop, members)))
        bs = blocks.block_size
        if k >= 2 and len(members) * (k // bs + 1) > blocks.num_free:
            k = _fit_blocks(members, k, bs, blocks.num_free)
        return cls(sched, plan, members, k) if k >= 2 else None

    def segment_plan(self, i0: int) -> StepPlan:
        """The plan ``schedule()`` makes for step ``i0``: the members left, each decoding."""
        if i0 == 0:
            return self.first_plan
        left = [(r, c) for r, c, _, e, _ in self.members if e > i0]
        n = len(left)
        return StepPlan(tuple([r.id for r, _ in left]), (1,) * n, (), (),
                        tuple([c + i0 for _, c in left]), n, 0, 0, 0, self.first_plan.extra_s)

    # -- pricing ---------------------------------------------------------------------------
    def price(self, pricing: Pricing, cpu_s: Callable[[StepPlan], float], now: float,
              held_end: float, cpu_free: float, cut: float = INF) -> None:
        """The steps' times, from step 0 scheduled at ``now`` with the step in flight ending
        at ``held_end`` and the CPU free at ``cpu_free``, each computed as
        ``AsyncTiming.launch`` computes it (the same operations: the same values); only the
        steps scheduled before ``cut`` (the next arrival) are kept (step 0 always is):
        ``num_steps`` shrinks to match. Each segment (a run of steps of one membership) is
        priced from its own plan, in chunks of about as many steps as reach the cut."""
        k, plan, members = self.num_steps, self.first_plan, self.members
        by_sum = None if plan.extra_s else pricing.decode_stretch_sum
        forget = pricing.forget_prices
        priced: list[tuple[int, Prices]] = []
        num_priced = 0
        starts, durations, ends, segments = self.starts, self.durations, self.ends, self.segments
        sched_at, free_at = now, held_end    # e(i - 2): step i's schedule time; e(i - 1)
        m = len(members)
        ctx_sum = sum(c for _, c, _, _, _ in members)
        ahead = [(e, c) for _, c, _, e, _ in members if e < k]
        heapify(ahead)
        i = 0
        while i < k:
            while ahead and ahead[0][0] <= i:       # members whose last step is behind
                _, c = heappop(ahead)
                m -= 1
                ctx_sum -= c
            i1 = ahead[0][0] if ahead else k
            i0 = i
            segments.append((i0, m))
            if i0 == 0:
                prices = stretch_prices(pricing, plan)
                o = cpu_s(plan)
            else:
                seg = self.segment_plan(i0)
                prices = by_sum(m, ctx_sum + m * i0) if by_sum is not None \
                    else stretch_prices(pricing, seg)
                o = cpu_s(seg)
            if forget is not None:
                priced.append((i0, prices))
            while i < i1:
                if i and sched_at >= cut:          # step i would see the arrival: not taken
                    k = i
                    break
                n = i1 - i
                if cut < INF:                      # about as many as reach the cut
                    d = durations[-1] if durations else 0.0
                    n = min(n, int((cut - sched_at) / d) + 2 if d > 0 else 2)
                chunk = prices(i - i0, n)
                num_priced += n
                for d in chunk:
                    if i and sched_at >= cut:      # step i would see the arrival: not taken
                        k = i
                        break
                    # AsyncTiming.launch's arithmetic
                    start = free_at if free_at > sched_at else sched_at
                    overhead = o if o < d else d
                    ready = (cpu_free if cpu_free > sched_at else sched_at) + overhead
                    cpu_free = ready
                    end = (free_at if free_at > ready else ready) + (d - overhead)
                    starts.append(start)
                    durations.append(end - start)
                    ends.append(end)
                    sched_at, free_at = free_at, end
                    i += 1
                if i >= k:
                    break
        if forget is not None and num_priced > k:
            _forget(forget, priced, k, num_priced)
        self.num_steps = k
        self.cpu_free = cpu_free
        while segments[-1][0] >= k:                # (a segment begun past the cut)
            segments.pop()

    # -- what the recorder keeps -------------------------------------------------------------
    def rows(self, running: int, used: int,
             held: int) -> tuple[list[int], list[tuple[int, int, int]]]:
        """The KV blocks in use after scheduling each step, and the steps in runs of one
        (decoding, running) count: (steps, decoding, running). ``running``, ``used``: the
        running requests and blocks in use now, after step 0 was scheduled; ``held``: the
        blocks of the running requests that are not members (their last token in flight:
        freed when the step in flight is delivered, before step 1 is scheduled)."""
        k = self.num_steps
        bs = self.sched.blocks.block_size
        extra = [0] * (k + 1)
        gone = [0] * (k + 1)                 # members out of running from step i on
        if k > 1:
            extra[1] -= held
        for _, c, h, e, _ in self.members:
            # step i holds ceil((c + i + 1) / bs) blocks from step first = h * bs - c on (one
            # more every bs steps) while it decodes (i < e); freed before step e + 1
            first = h * bs - c
            last = e if e < k else k
            grown = len(range(first, last, bs)) if first < last else 0
            for s in range(first, last, bs):
                extra[s] += 1
            if e + 1 < k:
                extra[e + 1] -= h + grown
                gone[e + 1] += 1
        kv = []
        total = used
        for i in range(k):
            if i:
                total += extra[i]
            kv.append(total)
        runs: list[tuple[int, int, int]] = []
        segments = self.segments
        bounds = [s for s, _ in segments[1:]] + [k]
        # decoding per step from the segments; running: ``running`` at step 0, the members
        # with e >= i after
        decoding = []
        for (s0, m), s1 in zip(segments, bounds):
            decoding += [m] * (s1 - s0)
        left = len(self.members)
        for i in range(k):
            if i == 0:
                r = running
            else:
                left -= gone[i]
                r = left
            m = decoding[i]
            if runs and runs[-1][1] == m and runs[-1][2] == r:
                n, _, _ = runs[-1]
                runs[-1] = (n + 1, m, r)
            else:
                runs.append((1, m, r))
        return kv, runs

    # -- applying --------------------------------------------------------------------------
    def apply(self) -> tuple[list[Request], InFlight]:
        """After the step that was in flight is delivered: steps 0 .. k - 2 delivered (the
        members' counters, their finishes at their last steps' ends, the blocks grown) and
        step k - 1 launched as ``Scheduler.launch`` does (what ``deliver`` later takes);
        the requests that finished, and the step in flight."""
        k = self.num_steps
        ends = self.ends
        sched = self.sched
        bs = sched.blocks.block_size
        finished = []
        grown = []
        added = 0
        entries: list[tuple[Request, int]] = []
        sampled: list[Request] = []
        ctx = []
        for req, c, h, e, _ in self.members:
            if e >= k:                  # takes step k - 1, launched: its token in flight
                req.num_computed_tokens = c + k
                req.num_generated += k
                req.num_pending += 1
                req.num_in_flight += 1
                need = -(-(c + k) // bs)
                if need > h:
                    grown.append((req.id, need))
                    added += need - h
                entries.append((req, 1))
                sampled.append(req)
                ctx.append(c + k - 1)
            else:                       # its last token at step e - 1, delivered
                req.num_computed_tokens = c + e
                req.num_generated += e
                req.finish_s = ends[e - 1]
                finished.append(req)
        if finished:
            sched.retire(finished, None)
        fitted = sched.blocks.grow_to(grown, added)   # fits: plan() checked it
        assert fitted is not None
        sched.current_step += k - 1     # the schedule() calls of steps 1 .. k - 1
        sched.steps_in_flight += 1      # (the delivered one was taken off by deliver)
        n = len(entries)
        plan = StepPlan(tuple([r.id for r in sampled]), (1,) * n, (), (), tuple(ctx), n, 0, 0,
                        0, self.first_plan.extra_s)
        return finished, InFlight(plan, entries, sampled)
