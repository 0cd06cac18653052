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

Arrivals may join it (``price``'s ``join``, for a policy with ``joins_stretch``): at the first
step whose schedule sees them, if ``schedule()`` would admit them whole there beside the
decodes (``stretch_admits`` with the running count: the requests whose last token is in flight
keep their ``max_num_seqs`` slots) and their blocks surely fit (``room_to_join``, which counts
the blocks of members that finished until their late frees), that step is a mixed step and
they are members from it on; otherwise the stretch ends before that step. With prefix caching
the named blocks' operations are replayed in stepping's order (sched/stretch.py's
``_CacheReplay`` with ``delay`` 1: a member's free after the next step's takes), a newcomer's
cache hits looked up there as in a synchronous stretch. Its last step stays
in flight: the stepped loop goes on from there, with the steps before it delivered. So the
state after it is exactly the stepped loop's, step for step (``tests/property``: async runs
fast-forwarded against stepped, on every latency model).

    stretch = AsyncStretch.plan(sched, plan, max_steps)        # None: step it
    stretch.price(pricing, cpu_s, now, held_end, cpu_free, cut, join)   # the steps' times
    kv, runs = stretch.rows(running, used, held)                 # the recorder's
    finished, in_flight = stretch.apply()                        # after ``held`` is delivered
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush
from itertools import accumulate, groupby
from operator import itemgetter, sub
from typing import TYPE_CHECKING, Any

from simserve.kv.blocks import BlockManager
from simserve.kv.prefix import PrefixBlockManager
from simserve.sched.inflight import InFlight
from simserve.sched.plan import Prices, StepPlan
from simserve.sched.stretch import (INF, Joined, Member, Pricing, _CacheReplay, _fit_blocks,
                                    _forget, join_hits, join_plan, segment_plan, stretch_prices)

if TYPE_CHECKING:
    from simserve.sched.core import Scheduler
    from simserve.sched.request import Request

_stop = itemgetter(3)

# The async solo loop's join (``AsyncStretch.price``): ``join(stretch, i, due, start, decoding,
# running)``, the arrivals due by ``due`` (step i's schedule time) admitted at step i starting
# at ``start``, beside ``decoding`` decodes with ``running`` requests running; their
# (request, prompt, blocks, 0) and the next arrival's time, or None
AsyncJoin = Callable[["AsyncStretch", int, float, float, int, int], "tuple[Joined, float] | None"]


class AsyncStretch:
    """Steps 0 .. k - 1 of an async decode stretch on one scheduler, starting with
    ``first_plan`` (just scheduled, with one step in flight). ``members``: the requests it
    decodes, in running order, each a :data:`~simserve.sched.stretch.Member` (offset 0, or
    the step at which it joined: ``members[planned:]``)."""

    __slots__ = ("sched", "first_plan", "members", "num_steps", "starts", "durations", "ends",
                 "cpu_free", "segments", "planned", "joins", "joined_blocks", "cache",
                 "readies", "forget", "priced", "priced_end", "bound", "held_end", "before")

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
        self.planned = len(members)      # members[planned:] joined while it was priced
        # the steps at which requests joined: step -> (their prompt tokens, how many)
        self.joins: dict[int, tuple[int, int]] = {}
        self.joined_blocks = 0           # the blocks they hold (allocated when applied)
        # with prefix caching, the named blocks' operations in stepping's order, each member's
        # free a step late (``_CacheReplay`` with ``delay`` 1); nobody joins then
        self.cache = _CacheReplay(sched.blocks, members, k, plan, delay=1) \
            if type(sched.blocks) is PrefixBlockManager else None
        # (the counted loop's, which may cut it back in flight: ``readies`` set to [] before
        # it is priced, when the CPU is free after each step's CPU part; and the prices that
        # a model counting its lookups is told to forget then)
        self.readies: list[float] | None = None
        self.forget: Callable[[Prices, int, int], None] | None = None
        self.priced: list[tuple[int, Prices]] = []
        self.priced_end = 0
        # (the async counted loop's, for a router that reads a flight's KV use or tokens of
        # work left: the blocks in use after step 0 was scheduled and those the running
        # requests that are not members hold, and those requests' tokens of work left, all
        # as before the step in flight is delivered; ``_async_counts``)
        self.before = (0, 0, 0)

    # -- planning --------------------------------------------------------------------------
    @classmethod
    def plan(cls, sched: Scheduler, plan: StepPlan, max_steps: int) -> AsyncStretch | None:
        """The stretch that starts with ``plan`` (just made by ``schedule()`` with one step in
        flight), of at most ``max_steps`` steps; None where it cannot be (it is stepped)."""
        blocks = sched.blocks
        if (max_steps < 2 or type(blocks) not in (BlockManager, PrefixBlockManager)  # (a host
                # tier's writes follow each block filled: stepped)
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
        return segment_plan(self.first_plan, self.members, i0)

    # -- pricing ---------------------------------------------------------------------------
    def price(self, pricing: Pricing, cpu_s: Callable[[StepPlan], float], now: float,
              held_end: float, cpu_free: float, cut: float = INF,
              join: AsyncJoin | None = None) -> None:
        """The steps' times, from step 0 scheduled at ``now`` with the step in flight ending
        at ``held_end`` and the CPU free at ``cpu_free``, each computed as
        ``AsyncTiming.launch`` computes it (the same operations: the same values); only the
        steps scheduled before ``cut`` (the next arrival) are kept (step 0 always is):
        ``num_steps`` shrinks to match. Each segment (a run of steps of one membership) is
        priced from its own plan, in chunks of about as many steps as reach the cut.

        ``join`` (the async solo loop's): at the first step scheduled at or after ``cut``,
        ``join(self, i, e(i - 2), e(i - 1), m, running)`` either returns None, and the
        stretch ends before step i, or admits the arrivals as ``schedule()`` would there,
        each with its whole prompt beside the m decodes: step i is then a mixed step (a
        segment of its own), they are members from it on (offset i), and pricing goes on
        to the next cut it returns."""
        self.bound, self.held_end = self.num_steps, held_end
        # e(i - 2): step i's schedule time; e(i - 1)
        self._price(pricing, cpu_s, 0, now, held_end, cpu_free, cut, join, [], 0)

    def rejoin(self, pricing: Pricing, cpu_s: Callable[[StepPlan], float], j: int,
               join: AsyncJoin) -> bool:
        """Go on pricing from its step ``j`` (>= 1): it was priced (with ``readies``) and cut
        back to its first ``j`` steps, and the requests that came since (the async counted
        loop's: engine/loops.py) ``join`` it at step j, the first scheduled after they came,
        as arrivals join a lone replica's stretch (``price``'s ``join``); then pricing goes
        on to the cut that ``join`` returns. True if they joined; otherwise it ends before
        step j, as it was."""
        return self._resume(pricing, cpu_s, j, None, join)

    def extend(self, pricing: Pricing, cpu_s: Callable[[StepPlan], float], j: int,
               cut: float, join: AsyncJoin | None) -> bool:
        """Go on pricing from its step ``j`` (>= 1) to ``cut``, as ``price`` would have gone
        on with a later cut: it was priced (with ``readies``) to its first ``j`` steps, short
        of its bound, and not cut back (the arrivals before step j's schedule time went
        elsewhere, and nothing waits: the async counted loop's). True if it priced a step
        more."""
        return self._resume(pricing, cpu_s, j, cut, join)

    def _resume(self, pricing: Pricing, cpu_s: Callable[[StepPlan], float], j: int,
                cut: float | None, join: AsyncJoin | None) -> bool:
        """``rejoin`` (``cut`` None: step j's schedule time, at which ``join`` is asked) or
        ``extend``."""
        readies, ends = self.readies, self.ends
        assert readies is not None and len(ends) == j
        self.num_steps = self.bound
        sched_at = ends[j - 2] if j >= 2 else self.held_end
        self.priced = [p for p in self.priced if p[0] < j]
        self._price(pricing, cpu_s, j, sched_at, ends[j - 1], readies[j - 1],
                    sched_at if cut is None else cut, join, self.priced, j)
        return self.num_steps > j

    def _price(self, pricing: Pricing, cpu_s: Callable[[StepPlan], float], i: int,
               sched_at: float, free_at: float, cpu_free: float, cut: float,
               join: AsyncJoin | None, priced: list[tuple[int, Prices]],
               priced_end: int) -> None:
        """``price`` from step ``i``, scheduled at ``sched_at`` while the device is busy until
        ``free_at`` and the CPU until ``cpu_free`` (``priced``: the prices of the segments
        before it, up to ``priced_end``)."""
        k, plan, members = self.num_steps, self.first_plan, self.members
        by_sum = None if plan.extra_s else pricing.decode_stretch_sum
        mixed_sum = pricing.mixed_step_sum
        forget = pricing.forget_prices
        starts, durations, ends, segments = self.starts, self.durations, self.ends, self.segments
        # the members decoding (m, their ctx summing to ctx_sum) and running at step i;
        # members whose last step is behind, by step: out of the decodes from step e on, out
        # of running from e + 1 on (its output delivered at e(e - 1))
        if i == 0:
            m = len(members)
            ctx_sum = sum(c for _, c, _, _, _ in members)
            ahead = [(e, c) for _, c, _, e, _ in members if e < k]
            done = [e for _, _, _, e, _ in members if e < k]
            running = m                      # from step 1 on (the finishers in flight gone)
        else:                                # (rejoin: as the loop below left them at step i)
            m = ctx_sum = running = 0
            ahead, done = [], []
            for _, c, _, e, _ in members:
                if e >= i:
                    running += 1
                    if e < k:
                        done.append(e)
                    if e > i:
                        m += 1
                        ctx_sum += c
                        if e < k:
                            ahead.append((e, c))
        heapify(ahead)
        heapify(done)
        last_decode = 0.0                    # the last decode step's duration (how far to price)
        readies = self.readies
        while i < k:
            while ahead and ahead[0][0] <= i:       # members whose last step is behind
                _, c = heappop(ahead)
                m -= 1
                ctx_sum -= c
            if i and sched_at >= cut:               # step i sees an arrival
                while done and done[0] + 1 <= i:
                    heappop(done)
                    running -= 1
                got = join(self, i, sched_at, free_at, m, running) if join is not None \
                    else None
                if got is None:
                    k = i
                    break
                joined, cut = got
                # each computes its prompt past its cached prefix
                prompts = tuple([p - hit for _, p, _, hit in joined])
                hits = tuple([hit for _, _, _, hit in joined])
                total = ctx_sum + m * i
                jplan = join_plan(members, i, joined)
                d = mixed_sum(m, total, prompts, hits) if mixed_sum is not None \
                    else pricing.step_time(jplan)
                o = cpu_s(jplan)
                segments.append((i, m))
                self.joins[i] = (sum(prompts), len(joined))
                cache = self.cache
                for req, p, h, _ in joined:        # step i feeds its prompt: position p - 1
                    c, e = p - 1 - i, i + req.num_output_tokens
                    members.append((req, c, h, e, i))
                    if cache is not None:
                        cache.add(req, c, h, e)
                    self.joined_blocks += h
                    m += 1
                    running += 1
                    ctx_sum += c
                    if e < k:
                        heappush(ahead, (e, c))
                        heappush(done, e)
                start, end, cpu_free = _launch(sched_at, free_at, cpu_free, d, o)
                starts.append(start)
                durations.append(end - start)
                ends.append(end)
                if readies is not None:
                    readies.append(cpu_free)
                sched_at, free_at = free_at, end
                i += 1
                continue
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
            stop = False
            while i < i1:
                if i and sched_at >= cut:          # step i would see the arrival
                    stop = True
                    break
                n = i1 - i
                if cut < INF:                      # about as many as reach the cut (at the
                    # last decode step's duration: a join's mixed step is no guide)
                    d = last_decode or (durations[-1] if durations else 0.0)
                    n = min(n, int(min((cut - sched_at) / d, n)) + 2 if d > 0 else 2)
                chunk = prices(i - i0, n)
                priced_end = i + n
                for d in chunk:
                    if i and sched_at >= cut:
                        stop = True
                        break
                    # (_launch written out: the same operations, the same values)
                    overhead = o if o < d else d
                    cpu_free = (cpu_free if cpu_free > sched_at else sched_at) + overhead
                    end = (free_at if free_at > cpu_free else cpu_free) + (d - overhead)
                    start = free_at if free_at > sched_at else sched_at
                    starts.append(start)
                    last_decode = end - start
                    durations.append(last_decode)
                    ends.append(end)
                    if readies is not None:
                        readies.append(cpu_free)
                    sched_at, free_at = free_at, end
                    i += 1
                if stop:
                    break
            if stop and forget is not None and priced_end > i:
                # (the prices of this segment from step i on: dropped, step i joined or not)
                _forget(forget, priced, i, priced_end)
                priced_end = i
        if forget is not None and priced_end > k:
            _forget(forget, priced, k, priced_end)
            priced_end = k
        self.num_steps = k
        self.cpu_free = cpu_free
        while segments[-1][0] >= k:                # (a segment begun past the cut)
            segments.pop()
        if readies is not None:
            self.forget, self.priced, self.priced_end = forget, priced, priced_end
            del readies[k:]

    def cut_back(self, keep: int) -> None:
        """Keep only its first ``keep`` steps (the counted loop's, engine/loops.py: a request
        routed to its replica while it was in flight is seen by the step scheduled next, as
        stepping would): their times as priced, the CPU free after the last one's CPU part,
        and a model that counts what it prices told to forget the prices of the steps
        dropped, as stepping never prices them. Priced with ``readies`` set (its joins, at
        ``rejoin``, before ``keep``)."""
        assert self.readies is not None and all(j < keep for j in self.joins)
        del self.starts[keep:], self.durations[keep:], self.ends[keep:]
        forget = self.forget
        if forget is not None and self.priced_end > keep:
            _forget(forget, self.priced, keep, self.priced_end)
            self.priced_end = keep
        self.num_steps = keep
        del self.readies[keep:]
        self.cpu_free = self.readies[keep - 1]
        segments = self.segments
        while segments[-1][0] >= keep:
            segments.pop()

    def join_hits(self, specs: list[Any], i: int, decoding: int) -> list[int] | None:
        """For the requests ``specs`` that arrive to join at step ``i``, at which ``decoding``
        members decode: the prompt tokens each finds cached when ``schedule()`` admits it
        then (0 without prefix caching), if their blocks and every member's growth surely fit;
        None otherwise, or where a hit cannot be known for sure now (the cache replay's
        ``hits``, as in a synchronous stretch: the frees before step i are done by then)."""
        return join_hits(self, specs, i, decoding)

    def admit(self, req: Request, p: int, hit: int, i: int, start: float) -> int:
        """Admit the waiting head ``req`` (prompt ``p``, ``hit`` tokens of it cached) at step
        ``i``, starting at ``start``, as ``schedule()`` would; the KV blocks it holds then
        (with prefix caching allocated now, after step i's decodes took theirs, and its cache
        limit set as the step's launch sets it: its prompt; otherwise when applied)."""
        held = self.sched.join_stretch(req, p, start)
        cache = self.cache
        if cache is None:
            return held
        req.num_cached_tokens = req.num_computed_tokens = hit
        held = cache.admit(req, p, hit, i)
        cache.bm.cache_limits[req.id] = p
        return held

    def room_to_join(self, blocks: int, num: int, decoding: int) -> bool:
        """True if ``num`` requests holding ``blocks`` new KV blocks in all may join at the
        step being priced, at which ``decoding`` members are left, and every member still
        fits every later step of the stretch: the blocks in use now (those of the members
        that finished since counted still, as their frees come a step late; the step in
        flight before the stretch was delivered), those of the requests that joined, and at
        most k // bs + 1 blocks each grown over its k steps."""
        bm = self.sched.blocks
        grow = (self.num_steps - 1) // bm.block_size + 1
        held = bm.num_used + self.joined_blocks
        return held + blocks + (decoding + num) * grow <= bm.num_blocks

    # -- what the recorder keeps -------------------------------------------------------------
    def rows(self, running: int, used: int,
             held: int) -> tuple[list[int], list[tuple[int, int, int, int, int]]]:
        """The KV blocks in use after scheduling each step, and the steps in runs of one
        count: (steps, prefill tokens, prefill sequences, decoding, running). ``running``,
        ``used``: the running requests and blocks in use now, after step 0 was scheduled;
        ``held``: the blocks of the running requests that are not members (their last token
        in flight: freed when the step in flight is delivered, before step 1 is
        scheduled)."""
        k = self.num_steps
        cache = self.cache
        if cache is not None:                # (after the step in flight was delivered)
            cache.run_to(2 * k)
            kv = cache.used[:k]
        else:
            kv = self._kv(used, held)
        gone = [0] * (k + 1)                 # running from step i on: + joined, - gone
        for j, (_, _, _, e, o) in enumerate(self.members):
            if o >= k:
                continue
            if j >= self.planned:            # joined at step o
                gone[o] -= 1
            if e + 1 < k:                    # its output delivered before step e + 1
                gone[e + 1] += 1
        segments = self.segments
        bounds = [s for s, _ in segments[1:]] + [k]
        decoding = []
        for (s0, m), s1 in zip(segments, bounds):
            decoding += [m] * (s1 - s0)
        # each step's (decoding, running): running from step 1 on, the members planned less
        # those gone; a run of steps with the same pair is one row, but a join step is a row
        # of its own
        lefts = list(accumulate(gone[1:k], sub, initial=self.planned))
        lefts[0] = running
        pairs = list(zip(decoding, lefts))
        joins = self.joins
        runs: list[tuple[int, int, int, int, int]] = []
        at = 0
        for j in sorted([j for j, (_, n) in joins.items() if n and j < k]):
            runs += [(len(list(g)), 0, 0, m, r) for (m, r), g in groupby(pairs[at:j])]
            tokens, seqs = joins[j]
            m, r = pairs[j]
            runs.append((1, tokens, seqs, m, r))
            at = j + 1
        runs += [(len(list(g)), 0, 0, m, r) for (m, r), g in groupby(pairs[at:])]
        return kv, runs

    def _kv(self, used: int, held: int) -> list[int]:
        """Without prefix caching: the KV blocks in use after scheduling each step, from
        ``used`` after step 0 was scheduled (``held`` of them freed before step 1: ``rows``)."""
        k = self.num_steps
        bs = self.sched.blocks.block_size
        extra = [0] * (k + 1)
        if k > 1:
            extra[1] -= held
        for j, (_, c, h, e, o) in enumerate(self.members):
            if o >= k:
                continue
            if j >= self.planned:            # joined at step o: its prompt's blocks then
                extra[o] += h
            # step i holds ceil((c + i + 1) / bs) blocks from step first = h * bs - c on (one
            # more every bs steps) while it decodes (i < e); freed before step e + 1
            first = h * bs - c
            last = e if e < k else k
            grown = len(range(first, last, bs)) if first < last else 0
            for s in range(first, last, bs):
                extra[s] += 1
            if e + 1 < k:
                extra[e + 1] -= h + grown
        return list(accumulate(extra[1:k], initial=used))

    # -- what a router reads of it in flight (the async counted loop's) ------------------------
    def blocks_used(self) -> list[int]:
        """KV blocks in use after scheduling each of its steps, without prefix caching (from
        ``before``; with it ``kv_at`` tells them)."""
        return self._kv(self.before[0], self.before[1])

    def kv_at(self, i: int) -> int | None:
        """With prefix caching, the KV blocks in use after scheduling its step ``i`` (from its
        schedule time until the next step's: the frees that come with step i - 1's output, at
        that next schedule, not yet), the named blocks' operations replayed that far; None
        without (``blocks_used``). Step 0's is from before the step in flight was
        delivered, as stepping shows it until then."""
        cache = self.cache
        if cache is None:
            return None
        cache.run_to(2 * i + 1)
        return cache.used[i]

    def tokens_left(self, i: int) -> int:
        """Tokens of work its running requests have left (prompt tokens not yet computed plus
        output tokens not yet generated) from step ``i``'s schedule time until the next
        step's, as stepping counts them then: every member whose last output is not
        delivered yet (a member that stops at step e is running until step e + 1 is
        scheduled; one that joins later is not yet running), each having computed
        ``ctx + i + 1`` tokens (the steps launched so far, step i's included), and at step 0
        the running requests whose last token was in flight (``before``)."""
        left = self.before[2] if i == 0 else 0
        planned = self.planned
        for j, (req, c, _, e, o) in enumerate(self.members):
            if i <= e and (o <= i or j < planned):
                left += req.num_prompt_tokens + req.num_output_tokens - (
                    c + (i + 1 if i < e else e))
        return left

    # -- applying --------------------------------------------------------------------------
    def apply(self) -> tuple[list[Request], InFlight]:
        """After the step that was in flight is delivered: steps 0 .. k - 2 delivered (the
        members' counters, their finishes at their last steps' ends, the blocks grown, those
        of the requests that joined allocated) and step k - 1 launched as
        ``Scheduler.launch`` does (what ``deliver`` later takes); the requests that
        finished, and the step in flight."""
        k = self.num_steps
        ends = self.ends
        sched = self.sched
        bs = sched.blocks.block_size
        planned = self.planned
        finished = []
        grown = []
        added = 0
        entries: list[tuple[Request, int]] = []
        sampled: list[Request] = []
        ctx = []
        new: list[int] = []
        for j, (req, c, h, e, o) in enumerate(self.members):
            if e >= k:                  # takes step k - 1, launched: its token in flight
                req.num_computed_tokens = c + k
                req.num_generated += k - o
                req.num_pending += 1
                req.num_in_flight += 1
                need = -(-(c + k) // bs)
                if j >= planned:        # joined: the block manager has none of its blocks
                    grown.append((req.id, need))
                    added += need
                elif need > h:
                    grown.append((req.id, need))
                    added += need - h
                sampled.append(req)
                if o == k - 1:          # joined at the last step: its prompt in flight
                    entries.append((req, c + k))
                    new.append(c + k)
                else:
                    entries.append((req, 1))
                    ctx.append(c + k - 1)
            else:                       # its last token at step e - 1, delivered
                req.num_computed_tokens = c + e
                req.num_generated += e - o
                req.finish_s = ends[e - 1]
                finished.append(req)
        if finished:
            sched.retire(finished, None)    # (with prefix caching released by the replay)
        cache = self.cache
        if cache is not None:
            cache.run_to(2 * k)
            limits = cache.bm.cache_limits   # each in flight: its tokens known so far
            for req in sampled:
                limits[req.id] = req.num_prompt_tokens + req.num_generated - req.num_pending
            cache.settle(self.members, k)
        else:
            fitted = sched.blocks.grow_to(grown, added)   # fits: plan() and joins checked it
            assert fitted is not None
        sched.current_step += k - 1     # the schedule() calls of steps 1 .. k - 1
        sched.steps_in_flight += 1      # (the delivered one was taken off by deliver)
        n = len(ctx)
        plan = StepPlan(tuple([r.id for r in sampled]), (1,) * n + tuple(new), tuple(new),
                        (0,) * len(new), tuple(ctx), n + len(new), 0, 0, 0,
                        self.first_plan.extra_s)
        return finished, InFlight(plan, entries, sampled)


def _launch(sched_at: float, free_at: float, cpu_free: float, d: float,
            o: float) -> tuple[float, float, float]:
    """``AsyncTiming.launch``'s arithmetic for a step of ``d`` seconds, ``o`` of them its CPU
    part, scheduled at ``sched_at`` while the device is busy until ``free_at`` and the CPU
    until ``cpu_free``: its recorded start, its end, and when the CPU is free again."""
    overhead = o if o < d else d
    ready = (cpu_free if cpu_free > sched_at else sched_at) + overhead
    end = (free_at if free_at > ready else ready) + (d - overhead)
    return (free_at if free_at > sched_at else sched_at), end, ready
