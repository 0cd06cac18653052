"""Fast-forward: a decode stretch planned, priced and applied at once.

A *decode stretch* starts with a plan that decodes every running request by one token, with no
prefill, preemption, swap or admission. Step i of the stretch (i = 0 is that plan) feeds
member j's token at position c_j + i, so it needs blocks for c_j + i + 1 tokens::

    block_size 4, c_j = 6:  [x x x x][x x . .]   step 0 writes slot 7, step 1 slot 8,
                                                 step 2 needs a third block, ...

Until someone finishes, arrives, or the blocks run out, every step repeats the decision (for a
policy whose admission is monotone: ``Scheduler.fast_forward``), so the engine can price and
apply k steps at once. A stretch may also start with a step that completes the last prefill
chunks of some requests while the others decode, or wait (vLLM v0's prefill-only steps): when
nothing is left waiting, the next step decodes them all. A member's c is then chosen so that
step i >= 1 still feeds position c + i: a newcomer with prompt p has c = p - 1 (as if it had
decoded at step 0); a request that waits in step 0 has c one less than its context, and takes
the stretch's steps from step 1 (its ``offset`` 1). With ``past_finish`` (nothing can look at
the replica before the stretch is applied) it runs on past finishes: members drop out as they
finish, and each run of one membership, a *segment*, is priced from the plan
``schedule()`` would have made at its first step.

The semantic code (the scheduler, the latency models) reads as if it stepped one iteration at a
time; this module is the optimisation, with one object per stretch:

    stretch = Stretch.plan(sched, plan, max_steps, past_finish)   # None: just one step
    stretch.price(latency, start, cut, cut_end)                   # its steps' times
    finished = stretch.apply(ends)                                # counters, blocks, finishes

The property tests hold fast-forwarded runs to stepped ones, step for step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from simserve.sched.plan import StepPlan

if TYPE_CHECKING:
    from simserve.sched.core import Scheduler
    from simserve.sched.request import Request

INF = float("inf")
_NEAR = 64     # Stretch._segments: the steps whose finishes are sorted first
Prices = Callable[[int, int], list[float]]


# A run of steps of one membership and shape: (the stretch step it starts at, the requests
# decoding in it, the sum of their contexts at its first step). A plain tuple: the loops over
# segments unpack it, which Python does fastest for an exact tuple.
Segment = tuple[int, int, int]

# One request of a stretch, as it was when the stretch was planned:
#   (request, ctx, held, stop, offset)
#   ctx      step i feeds its token at position ctx + i
#   held     the KV blocks it holds at step 0
#   stop     it takes steps offset .. stop - 1 (its last token at step stop - 1)
#   offset   1 if it waits in step 0 (still decoding), else 0
# A plain tuple, unpacked by name in every loop over the members (Python unpacks an exact
# tuple fastest; a stretch is planned at about every arrival).
Member = tuple["Request", int, int, int, int]
_ctx = itemgetter(1)    # a Member's ctx
_stop = itemgetter(3)   # a Member's stop




class Stretch:
    """Steps 0 .. k - 1 of a decode stretch on one scheduler, starting with ``first_plan``.

    Its ``members`` are the running requests, in running order, each a :data:`Member`.

    Built by :meth:`plan` (which bounds k); :meth:`price` sets the steps' start times and
    durations (``starts``, ``durations``, ``end``: the last step's end) and may shorten it
    (``num_steps``); :meth:`apply` advances the scheduler past the steps that ran.
    """

    __slots__ = ("sched", "first_plan", "members", "num_steps", "past_finish", "mixed",
                 "starts", "durations", "begun", "end")

    def __init__(self, sched: Scheduler, plan: StepPlan, members: list[Member], num_steps: int,
                 past_finish: bool, mixed: bool):
        self.sched = sched
        self.first_plan = plan
        self.members = members
        self.num_steps = num_steps
        self.past_finish = past_finish   # members drop out as they finish
        self.mixed = mixed               # step 0 completes some prefills
        # set by price(): the steps' starts and durations, the last one's end, and the
        # segments priced (some may lie past a cut)
        self.starts: list[float]
        self.durations: list[float]
        self.begun: list[Segment]
        self.end: float

    # -- planning --------------------------------------------------------------------------
    @classmethod
    def plan(cls, sched: Scheduler, plan: StepPlan, max_steps: int,
             past_finish: bool = False) -> Stretch | None:
        """The decode stretch that starts with ``plan`` (just made by ``sched.schedule()``),
        of at most ``max_steps`` steps; None when it would be one step.

        ``plan`` must have every request in it sample a token and, but for a mixed first
        step, decode every running request. A mixed first step (with ``past_finish``, for a
        policy that goes on past finishes, with nothing waiting or swapped) completes the
        last prefill chunks of some requests while the others decode or, still decoding, wait;
        it is a segment of its own. Bounded by the KV blocks (the stretch stops before the step
        whose allocations would not fit) and by the earliest finish (its last step ends the
        stretch) unless ``past_finish`` and the policy allows it with nothing waiting or
        swapped: then requests drop out as they finish, and it runs until the last one is done.
        """
        running = sched.running
        everyone = len(plan.request_ids) == len(running)
        if (not sched.monotone_admission or plan.num_preempted
                or plan.swap_in_blocks or plan.swap_out_blocks
                or plan.num_sampled != len(plan.request_ids) or max_steps <= 1
                or sched.blocks.caches_prefixes    # blocks with identities: allocate() each
                or sched.speculative is not None):  # tokens per step drawn per request
            return None
        # if some prefill (their last chunk), the stretch may start with this mixed step when
        # what follows is sure to decode every running request (nothing waits to be admitted
        # or swapped in, and the token budget holds them all) and, as for segments, nothing
        # can look at the stretch before it is applied (``past_finish``)
        mixed = bool(plan.prefill_lens)
        if not mixed and not everyone:
            return None
        batch = sched._batch
        if mixed and (not past_finish or not sched.continues_past_finish or sched.waiting
                      or sched.swapped or batch is None or batch.plan is not plan
                      or len(running) > sched.limits.max_num_batched_tokens):
            return None
        assert batch is not None
        blocks_held = sched.blocks.blocks_held
        # ctx is the tokens computed before step 0 less one, plus the tokens the plan gives
        # the member (1 for a decode, 0 if it waits)
        # every running request is a member: (request, ctx, held, stop, offset)
        if everyone:
            members = [(r, r.num_computed_tokens, blocks_held[r.id],
                        r.num_output_tokens - r.num_generated, 0) for r in running]
            for r, n in batch.prefills if mixed else ():   # their last chunk: ctx moves on
                j = running.index(r)
                _, c, h, e, o = members[j]
                members[j] = (r, c + n - 1, h, e, o)
        else:
            more = {r.id: n - 1 for r, n in batch.prefills}
            scheduled = batch.scheduled
            members = []
            for r in running:
                c, left = r.num_computed_tokens, r.num_output_tokens - r.num_generated
                if r.id in scheduled:
                    members.append((r, c + more.get(r.id, 0), blocks_held[r.id], left, 0))
                elif r.num_generated and c + 1 == r.num_prompt_tokens + r.num_generated:
                    members.append((r, c - 1, blocks_held[r.id], left + 1, 1))   # waits
                else:
                    return None   # a prefill left undone: the next step is no decode step
        past = (past_finish and sched.continues_past_finish
                and not sched.waiting and not sched.swapped)
        k = min(max_steps, (max if past else min)(map(_stop, members)))
        if k <= 1:
            return None
        bs, free = sched.blocks.block_size, sched.blocks.num_free
        if len(members) * (k // bs + 1) > free:   # k steps add at most k // bs + 1 blocks each
            k = _fit_blocks(members, k, bs, free)
            if k <= 1:
                return None
        return cls(sched, plan, members, k, past, mixed)

    def segments(self) -> list[Segment]:
        """The runs of one membership and shape among steps 0 .. num_steps - 1: one unless
        the stretch starts with a mixed step, which is a segment of its own, or requests drop
        out as they finish. Step i of a decode segment starting at i0 decodes its requests
        with every context grown by i - i0 (:meth:`segment_plan` gives its plan; the sum is
        what a latency model with ``decode_stretch_sum`` needs)."""
        segments = list(self._segments())
        segments.pop()                       # (the end marker)
        return segments

    def _segments(self) -> Iterator[Segment]:
        """:meth:`segments` one by one, then ``(num_steps, 0, 0)`` (an end marker): only the
        members that finish before the last step are sorted, and segments are made as far as
        they are asked for (a stretch is usually cut at an arrival long before its last
        planned step)."""
        members = self.members
        m = len(members)
        total = sum(map(_ctx, members))
        k = self.num_steps
        yield (0, m, total)
        # (the step a member is gone by, its ctx, 1); a mixed first step: a boundary at step 1.
        # With past_finish the finishes before step NEAR are sorted first and the rest only
        # if asked for: an arrival usually cuts the stretch within a few dozen steps
        near = min(k, _NEAR)
        tiers = ((0, near), (near, k)) if self.past_finish else ((0, 0),)
        for lo, hi in tiers:
            ends = [(e, c, 1) for _, c, _, e, _ in members if lo <= e < hi] if lo < hi else []
            if self.mixed and not lo:
                ends.append((1, 0, 0))
            ends.sort()
            j, num_ends = 0, len(ends)
            while j < num_ends:
                i0 = ends[j][0]
                while j < num_ends and ends[j][0] == i0:
                    _, c, n = ends[j]
                    m -= n
                    total -= c
                    j += 1
                yield (i0, m, total + m * i0)
        yield (k, 0, 0)

    def segment_plan(self, i0: int) -> StepPlan:
        """The plan of step ``i0``: exactly what ``schedule()`` would make then (the requests
        left, in running order, each decoding; step 0 is the stretch's own plan)."""
        if i0 == 0:
            return self.first_plan
        left = [m for m in self.members if _stop(m) > i0]
        n = len(left)
        return StepPlan(tuple([r.id for r, _, _, _, _ in left]), (1,) * n, (), (),   # (positional)
                        tuple([c + i0 for _, c, _, _, _ in left]), n, 0, 0, 0,
                        self.first_plan.extra_s)

    # -- pricing ---------------------------------------------------------------------------
    def price(self, latency: Any, start: float, cut: float = INF, cut_end: float = INF) -> None:
        """Price the stretch's steps from ``start``: ``starts``, ``durations``, ``end``, and
        keep only the steps after the first that start before ``cut`` and end before
        ``cut_end`` (>= ``cut``): the next outside events (``num_steps`` shrinks to match).

        Step i starts at s_i = (...((s_0 + d_0) + d_1) ...), summed in order exactly as
        stepping would (a cumulative sum adds left to right). Each segment is priced from its
        own plan, and only as far as the cut needs: as many steps as would reach the cut at
        the last price (the first step alone before any is priced), then on the same way (step
        times grow along a segment; if they do not, the loop prices on). Pricing steps past
        the cut costs time only: they are dropped.
        """
        k, plan = self.num_steps, self.first_plan
        segs = self._segments()
        by_sum = None if plan.extra_s else getattr(latency, "decode_stretch_sum", None)
        acc = [start]            # acc[m]: start of step m; acc[-1]: end of the last priced
        durations: list[float] = []
        begun: list[Segment] = []
        nxt = next(segs)
        while nxt[0] < k:
            seg = nxt
            i0, m, total = seg
            nxt = next(segs)
            i1 = nxt[0]
            begun.append(seg)
            if i1 == 1:                      # step 0 alone (a mixed first step, usually)
                d = latency.step_time(plan)
                durations.append(d)
                acc.append(acc[-1] + d)
            else:
                if i0 == 0:
                    prices = stretch_prices(latency, plan)
                elif by_sum is not None:     # a decode segment: its requests, their ctx sum
                    prices = by_sum(m, total)
                else:
                    prices = stretch_prices(latency, self.segment_plan(i0))
                # as many steps as would reach the cut at the last price (a segment's first
                # step alone if nothing is priced yet)
                n = i1 - i0
                if cut < INF:
                    d = durations[-1] if durations else 0.0
                    n = min(n, int((cut - acc[-1]) / d) + 1) if d > 0 else 1
                i = i0
                while True:
                    chunk = prices(i - i0, n)
                    durations += chunk
                    acc += accumulate(chunk, initial=acc.pop())
                    i += n
                    if i == i1 or acc[-1] >= cut:
                        break
                    d = chunk[-1]
                    n = min(i1 - i, int((cut - acc[-1]) / d) + 1) if d > 0 else i1 - i
            if acc[-1] >= cut:
                break
        n = len(durations)
        keep = bisect_left(acc, cut, 0, n) if cut < INF else n            # first start >= cut
        if cut_end < INF:
            keep = min(keep, bisect_left(acc, cut_end, 1, n + 1) - 1)     # first end >= it
        keep = max(keep, 1)                                               # step 0 always runs
        if keep < n:
            del acc[keep + 1:], durations[keep:]
        self.end = acc.pop()
        self.starts, self.durations, self.begun = acc, durations, begun
        self.num_steps = len(acc)

    # -- applying --------------------------------------------------------------------------
    def blocks_used(self) -> list[int]:
        """KV blocks in use after scheduling each of its steps (for the recorder)."""
        k = self.num_steps
        blocks = self.sched.blocks
        bs = blocks.block_size
        extra = [0] * k
        for _, c, h, e, _ in self.members:
            # step i holds ceil((c + i + 1) / bs) blocks: it first needs block h + 1 at step
            # h * bs - c (>= 1, since step 0 fits in h blocks), then every bs steps; a member
            # that finishes at step e - 1 frees all it holds before step e
            first = h * bs - c
            if e >= k:                 # (most members: it runs to the end)
                if first < k:
                    if first + bs >= k:
                        extra[first] += 1
                    else:
                        for i in range(first, k, bs):
                            extra[i] += 1
                continue
            grown = 0
            if first < e:
                for i in range(first, e, bs):
                    extra[i] += 1
                grown = (e - 1 - first) // bs + 1
            extra[e] -= h + grown
        used = accumulate(extra, initial=blocks.num_used)
        next(used)                  # (the blocks before step 0)
        return list(used)

    def apply(self, ends: list[float]) -> list[Request]:
        """Apply its first ``len(ends)`` steps, which ended at ``ends`` (a member takes steps
        offset .. min(k, stop) - 1); the requests that finished. Their tokens are the metrics
        layer's to record (``TokenLog.stretch``)."""
        k = len(ends)
        finished = []
        grown = []                    # (request id, blocks it holds after the steps)
        added = 0                     # the blocks they add (h each held when it was planned)
        bs = self.sched.blocks.block_size
        for req, c, h, e, o in self.members:
            if e > k:                 # (most members: it runs on)
                c += k
                req.num_generated += k - o
            else:
                c += e
                req.num_generated += e - o
                req.finish_s = ends[e - 1]
                finished.append(req)
            req.num_computed_tokens = c
            if c > h * bs:            # it needs more than the h blocks it holds
                need = -(-c // bs)
                grown.append((req.id, need))
                added += need - h
        sched = self.sched
        fitted = sched.blocks.grow_to(grown, added)   # fits: plan() checked the total
        assert fitted is not None
        if finished:
            sched.retire(finished, None)
        return finished


def _fit_blocks(members: list[Member], k: int, bs: int, free: int) -> int:
    """The most steps, at most ``k``, whose new blocks fit in ``free`` (>= 1)."""

    def new_blocks(steps: int) -> int:
        """Blocks to add so that each member fits the steps it takes of ``steps`` (blocks
        freed by members that finish are not counted back: a conservative bound)."""
        total = 0
        for _, c, h, e, _ in members:
            need = -(-(c + min(steps, e)) // bs) - h
            if need > 0:
                total += need
        return total

    if new_blocks(k) <= free:
        return k
    lo, hi = 1, k          # new_blocks(lo) <= free (= 0 for lo = 1), new_blocks(hi) > free
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if new_blocks(mid) <= free:
            lo = mid
        else:
            hi = mid
    return lo


def stretch_prices(latency: Any, plan: StepPlan) -> Prices:
    """``(i, n) -> list`` of the seconds of steps i .. i + n - 1 of a decode stretch starting
    with ``plan`` (step i: every context grown by i). Uses the model's own ``decode_stretch``
    when it has one (its values must be bit-identical to ``step_time`` step by step);
    otherwise prices each step's plan."""
    fast = getattr(latency, "decode_stretch", None)
    if fast is not None:
        return fast(plan)   # type: ignore[no-any-return]

    def prices(i: int, n: int) -> list[float]:
        return [latency.step_time(plan._replace(decode_ctx=tuple(c + m for c in plan.decode_ctx)))
                for m in range(i, i + n)]

    return prices
