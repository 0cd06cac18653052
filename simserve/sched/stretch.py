"""Fast-forward: a decode stretch planned, priced and applied at once.

A *decode stretch* starts with a plan that decodes every running request by one token, with no
prefill, preemption, swap or admission. Step i of the stretch (i = 0 is that plan) feeds
member j's token at position c_j + i, so it needs blocks for c_j + i + 1 tokens::

    block_size 4, c_j = 6:  [x x x x][x x . .]   step 0 writes slot 7, step 1 slot 8,
                                                 step 2 needs a third block, ...

Until someone finishes, arrives, or the blocks run out, every step repeats the decision (for a
policy whose admission is monotone: ``PolicyFacts.monotone_admission``), so the engine can price and
apply k steps at once. A stretch may also start with a step that completes the last prefill
chunks of some requests while the others decode, or wait (vLLM v0's prefill-only steps): when
nothing is left waiting, the next step decodes them all. A member's c is then chosen so that
step i >= 1 still feeds position c + i: a newcomer with prompt p has c = p - 1 (as if it had
decoded at step 0); a request that waits in step 0 has c one less than its context, and takes
the stretch's steps from step 1 (its ``offset`` 1). With ``past_finish`` (nothing can look at
the replica before the stretch is applied) it runs on past finishes: members drop out as they
finish, and each run of one membership, a *segment*, is priced from the plan
``schedule()`` would have made at its first step. Requests that arrive meanwhile may *join* it
(``price``'s ``join``: the solo loop's, for a policy with ``joins_stretch``): at the first step
that sees them, if ``schedule()`` would admit their whole prompts there beside the decodes
(``Scheduler.stretch_admits``) and their blocks surely fit (``room_to_join``), that step is a
mixed step of the stretch, a segment of its own, and they are members from it on (offset j,
c = p - 1 - j: step j feeds the prompt's last position); their blocks are allocated when the
stretch is applied, after those of the members that finished are freed. With prefix caching the
stretch names its blocks instead, as stepping would, step by step where something happens
(``_CacheReplay``): a joining request's cache hits are looked up, and its blocks allocated,
at its step.

The semantic code (the scheduler, the latency models) reads as if it stepped one iteration at a
time; this module is the optimisation, with one object per stretch:

    stretch = Stretch.plan(sched, plan, max_steps, past_finish)   # None: just one step
    stretch.price(latency, start, cut, cut_end, join)             # its steps' times
    finished = stretch.apply(ends)                                # counters, blocks, finishes

The property tests hold fast-forwarded runs to stepped ones, step for step.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from heapq import heapify, heappop, heappush
from itertools import accumulate
from operator import add, itemgetter
from typing import TYPE_CHECKING, Any, Protocol

from simserve.kv.prefix import PrefixBlockManager
from simserve.sched.plan import Prices, StepPlan

if TYPE_CHECKING:
    from simserve.sched.core import Scheduler
    from simserve.sched.request import Request

INF = float("inf")


class Pricing(Protocol):
    """What a stretch needs of its replica's latency model: latency/base.py's ``Pricing``
    (its fast-forward capabilities, None where the model has none)."""

    @property
    def step_time(self) -> Callable[[StepPlan], float]: ...

    @property
    def decode_stretch(self) -> Callable[[StepPlan], Prices]: ...

    @property
    def decode_stretch_sum(self) -> Callable[[int, int], Prices] | None: ...

    @property
    def mixed_step_sum(self) -> Callable[[int, int, tuple[int, ...], tuple[int, ...]],
                                         float] | None: ...

    @property
    def forget_prices(self) -> Callable[[Any, int, int], None] | None: ...


# A run of steps of one membership and shape: (the stretch step it starts at, the requests
# decoding in it, the sum of their contexts at its first step). A plain tuple: the loops over
# segments unpack it, which Python does fastest for an exact tuple.
Segment = tuple[int, int, int]

# One request of a stretch, as it was when the stretch was planned:
#   (request, ctx, held, stop, offset)
#   ctx      step i feeds its token at position ctx + i
#   held     the KV blocks it holds at step 0
#   stop     it takes steps offset .. stop - 1 (its last token at step stop - 1)
#   offset   1 if it waits in step 0 (still decoding), else 0; a request that joins the
#            stretch at step j (``Stretch.price``'s ``join``): j
# A plain tuple, unpacked by name in every loop over the members (Python unpacks an exact
# tuple fastest; a stretch is planned at about every arrival).
Member = tuple["Request", int, int, int, int]

# Requests that join a stretch at one of its steps (``Join``): (request, prompt tokens, KV
# blocks allocated for them, prompt tokens that were prefix-cache hits); and what the engine's
# ``Join`` gives back: those, and the next outside event's time (the new cut).
Joined = list[tuple["Request", int, int, int]]
Join = Callable[["Stretch", int, float, int], "tuple[Joined, float] | None"]
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
                 "starts", "durations", "begun", "end", "planned", "joins", "freed",
                 "joined_blocks", "cache", "forget", "priced", "bound")

    def __init__(self, sched: Scheduler, plan: StepPlan, members: list[Member], num_steps: int,
                 past_finish: bool, mixed: bool):
        self.sched = sched
        self.first_plan = plan
        self.members = members
        self.num_steps = num_steps
        self.past_finish = past_finish   # members drop out as they finish
        self.mixed = mixed               # step 0 completes some prefills
        self.planned = len(members)      # members[planned:] joined while it was priced
        # the steps at which requests joined: step -> (their prompt tokens, how many)
        self.joins: dict[int, tuple[int, int]] = {}
        # while it is priced (``room_to_join``): the blocks held (when planned or joining) by
        # the members that finished before the step being priced, and the blocks the members
        # that joined hold (allocated when the stretch is applied)
        self.freed = 0
        self.joined_blocks = 0
        # with prefix caching, the named blocks' operations in stepping's order
        self.cache = _CacheReplay(sched.blocks, members, num_steps, plan) \
            if isinstance(sched.blocks, PrefixBlockManager) else None
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
        if (not sched.facts.monotone_admission or plan.num_preempted
                or plan.swap_in_blocks or plan.swap_out_blocks
                or plan.num_sampled != len(plan.request_ids) or max_steps <= 1
                # named blocks: the prefix cache's own (a host tier's writes follow each block
                # filled: stepped)
                or (sched.blocks.caches_prefixes and type(sched.blocks) is not PrefixBlockManager)
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
        if mixed and (not past_finish or not sched.facts.continues_past_finish or sched.waiting
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
        past = (past_finish and sched.facts.continues_past_finish
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

    def segment_plan(self, i0: int) -> StepPlan:
        """The plan of step ``i0``: exactly what ``schedule()`` would make then (the requests
        left, in running order, each decoding; step 0 is the stretch's own plan)."""
        return segment_plan(self.first_plan, self.members, i0)

    # -- pricing ---------------------------------------------------------------------------
    def price(self, latency: Pricing, start: float, cut: float = INF, cut_end: float = INF,
              join: Join | None = None) -> None:
        """Price the stretch's steps from ``start``: ``starts``, ``durations``, ``end``, and
        keep only the steps after the first that start before ``cut`` and end before
        ``cut_end`` (>= ``cut``): the next outside events (``num_steps`` shrinks to match).

        Step i starts at s_i = (...((s_0 + d_0) + d_1) ...), summed in order exactly as
        stepping would (a cumulative sum adds left to right). Each segment (a run of steps of
        one membership) is priced from its own plan, and only as far as the cut needs: as many
        steps as would reach the cut at the last price (the first step alone before any is
        priced), then on the same way (step times grow along a segment; if they do not, the
        loop prices on). Pricing steps past the cut costs time only: they are dropped.

        ``join`` (the solo loop's, for a policy with ``joins_stretch``; ``cut_end`` infinite):
        when step j is the first to start at or after ``cut`` (an arrival), ``join(self, j,
        s_j, m)`` (m: the members decoding at step j) either returns None, and the stretch
        ends before step j as without it, or admits the requests that arrived, exactly as
        ``schedule()`` at step j would (their whole prompts in step j, beside the m decodes)
        and returns them with the next cut: step j becomes a mixed step (a segment of its
        own), they are members from step j on (offset j), and pricing goes on.
        """
        self.bound = self.num_steps
        self._price(latency, 0, [start], [], [], [], cut, cut_end, join, 1)

    def rejoin(self, latency: Pricing, j: int, start: float, join: Join) -> bool:
        """Go on pricing a stretch past finishes from its step ``j``,
        which starts at ``start``: it was priced and cut back to its first ``j`` steps, and the
        requests that arrived since (the counted loop's: engine/loops.py) ``join`` it there, as
        they would have joined it while it was priced (``price``'s ``join``), then pricing goes
        on to the cut ``join`` returns, as ``price`` does. True if they joined; otherwise it
        ends before step j, as it was."""
        return self._resume(latency, j, start, start, join)

    def extend(self, latency: Pricing, j: int, start: float, cut: float,
               join: Join | None) -> bool:
        """Go on pricing a stretch past finishes from its step ``j``, which starts at ``start``
        (its first ``j`` steps priced, short of its bound), to ``cut``, as ``price`` would
        have gone on with a later cut: the counted loop's, where the arrivals that came
        before ``start`` went elsewhere and nothing waits. True if it priced a step more."""
        return self._resume(latency, j, start, cut, join)

    def _resume(self, latency: Pricing, j: int, start: float, cut: float,
                join: Join | None) -> bool:
        """``rejoin`` (``cut`` is ``start``: ``join`` is asked at step j) or ``extend``."""
        assert self.past_finish
        self.num_steps = self.bound      # (room_to_join reads the bound while pricing)
        self.freed = 0                   # (counted again up to step j)
        acc = self.starts[:j]
        acc.append(start)
        self._price(latency, j, acc, self.durations[:j], [s for s in self.begun if s[0] < j],
                    [p for p in self.priced if p[0] < j], cut, INF, join, j)
        return self.num_steps > j

    def _price(self, latency: Pricing, i0: int, acc: list[float], durations: list[float],
               begun: list[Segment], priced: list[tuple[int, Prices]], cut: float,
               cut_end: float, join: Join | None, floor: int) -> None:
        """``price`` from step ``i0`` (``acc``: the starts of the steps before it and its own;
        ``durations``, ``begun``, ``priced``: theirs), keeping at least ``floor`` steps."""
        k, plan = self.bound, self.first_plan
        members = self.members
        by_sum = None if plan.extra_s else latency.decode_stretch_sum
        mixed_sum = latency.mixed_step_sum
        # a model that counts something as it prices (a profile's grid lookups) takes back
        # what steps priced and then dropped counted: (segment start, its prices) to tell it
        forget = latency.forget_prices
        last_decode = 0.0        # the last decode step priced (to guess how far to price)
        # the membership: m members left, their ctx summing to ctx_sum; the finishes ahead,
        # (the step a member is gone by, its ctx), in a heap (a member runs past k otherwise)
        m = len(members)
        ctx_sum = sum(map(_ctx, members))
        ahead = [(e, c, h) for _, c, h, e, _ in members if e < k] if self.past_finish else []
        heapify(ahead)
        while i0 < k:
            while ahead and ahead[0][0] <= i0:     # members that finished before step i0
                _, c, h = heappop(ahead)
                m -= 1
                ctx_sum -= c
                self.freed += h
            if i0 and acc[-1] >= cut:              # step i0 is the first at or past the cut
                assert join is not None            # (the loop below stops otherwise)
                got = join(self, i0, acc[-1], m)
                if got is None:
                    break
                joined, cut = got
                total = ctx_sum + m * i0
                # each computes its prompt past its cached prefix
                prompts: tuple[int, ...]
                hits: tuple[int, ...]
                if len(joined) == 1:
                    _, p, _, hit = joined[0]
                    prompts, hits = (p - hit,), (hit,)
                else:
                    prompts = tuple([p - hit for _, p, _, hit in joined])
                    hits = tuple([hit for _, _, _, hit in joined])
                if mixed_sum is not None:        # (a model that reads Σ ctx of the decodes)
                    d = mixed_sum(m, total, prompts, hits)
                else:
                    d = latency.step_time(join_plan(members, i0, joined))
                durations.append(d)
                acc.append(acc[-1] + d)
                begun.append((i0, m, total))
                self.joins[i0] = (sum(prompts), len(joined))
                cache = self.cache
                for req, p, h, _ in joined:   # step i0 feeds its prompt: position p - 1 = c + i0
                    c, e = p - 1 - i0, i0 + req.num_output_tokens
                    members.append((req, c, h, e, i0))
                    if cache is not None:
                        cache.add(req, c, h, e)
                    self.joined_blocks += h
                    m += 1
                    ctx_sum += c
                    if e < k:
                        heappush(ahead, (e, c, h))
                i0 += 1
                continue
            i1 = ahead[0][0] if ahead else k
            if not i0 and self.mixed:
                i1 = 1                             # a mixed first step: a segment of its own
            begun.append((i0, m, ctx_sum + m * i0))
            if i1 == 1:                      # step 0 alone (a mixed first step, usually)
                d = latency.step_time(plan)
                durations.append(d)
                acc.append(acc[-1] + d)
            else:
                if i0 == 0:
                    prices = stretch_prices(latency, plan)
                elif by_sum is not None:     # a decode segment: its requests, their ctx sum
                    prices = by_sum(m, ctx_sum + m * i0)
                else:
                    prices = stretch_prices(latency, self.segment_plan(i0))
                if forget is not None:
                    priced.append((i0, prices))
                # as many steps as would reach the cut at the last decode step's price (a
                # join's mixed step is no guide to the decodes after it; a segment's first
                # step alone if nothing is priced yet)
                n = i1 - i0
                if cut < INF:
                    d = last_decode or (durations[-1] if durations else 0.0)
                    n = min(n, int((cut - acc[-1]) / d) + 1) if d > 0 else 1
                i = i0
                while True:
                    chunk = prices(i - i0, n)
                    durations += chunk
                    acc += accumulate(chunk, initial=acc.pop())
                    i += n
                    d = chunk[-1]
                    if i == i1 or acc[-1] >= cut:
                        break
                    n = min(i1 - i, int((cut - acc[-1]) / d) + 1) if d > 0 else i1 - i
                last_decode = d
            if acc[-1] >= cut:
                if join is None:
                    break
                j = bisect_left(acc, cut, i0 + 1)   # the first step at or past the cut
                if j >= k:
                    break
                if forget is not None:
                    _forget(forget, priced, j, len(durations))
                del acc[j + 1:], durations[j:]      # (priced past it: dropped)
                i0 = j
            else:
                i0 = i1
        n = len(durations)
        keep = bisect_left(acc, cut, 0, n) if cut < INF else n            # first start >= cut
        if cut_end < INF:
            keep = min(keep, bisect_left(acc, cut_end, 1, n + 1) - 1)     # first end >= it
        keep = max(keep, floor)                                           # step 0 always runs
        if keep < n:
            if forget is not None:
                _forget(forget, priced, keep, n)
            del acc[keep + 1:], durations[keep:]
        self.end = acc.pop()
        self.starts, self.durations, self.begun = acc, durations, begun
        self.num_steps = len(acc)
        self.forget, self.priced = forget, priced    # (cut_back's, if cut back in flight)
        # (with prefix caching, the named blocks' operations of the steps priced are replayed
        # only as far as something reads them: blocks_used, kv_at, apply; a stretch in flight
        # in the counted loop may be cut back before)

    def cut_back(self, keep: int) -> None:
        """Keep only its first ``keep`` steps (a stretch in flight cut back: engine/runtime.py's
        ``cut_back``): a model that counts what it prices takes back what the others counted,
        as stepping never prices them."""
        n = len(self.starts)
        if self.forget is not None and keep < n:
            _forget(self.forget, self.priced, keep, n)
        del self.starts[keep:]

    # -- joining -----------------------------------------------------------------------------
    def room_to_join(self, blocks: int, num: int, decoding: int) -> bool:
        """True if ``num`` requests holding ``blocks`` new KV blocks in all may join at the
        step being priced, at which ``decoding`` members are left, and every member still
        fits every later step of the stretch, however its finishes fall: then the blocks a
        joining request asks for are free at its step whatever happened before, as stepping
        would find them. (The members left hold what they held when planned or joining,
        ``num_used`` and ``joined_blocks`` less what those that finished held, plus at most
        k // bs + 1 blocks each grown over the stretch's k steps.)"""
        bm = self.sched.blocks
        grow = (self.num_steps - 1) // bm.block_size + 1
        held = bm.num_used + self.joined_blocks - self.freed
        return held + blocks + (decoding + num) * grow <= bm.num_blocks

    def join_hits(self, specs: list[Any], j: int, decoding: int) -> list[int] | None:
        """For the requests ``specs`` that arrive to join at step ``j``, at which ``decoding``
        members are left: the prompt tokens each would find cached when ``schedule()`` admits
        it then (0 without prefix caching), if their blocks and every member's growth surely
        fit (``room_to_join``); None otherwise, or where a hit cannot be known for sure now
        (``_CacheReplay.hits``): the stretch then ends before step j."""
        return join_hits(self, specs, j, decoding)

    def admit(self, req: Request, p: int, hit: int, j: int, start: float) -> int:
        """Admit the waiting head ``req`` (prompt ``p``, ``hit`` tokens of it cached:
        ``join_hits``) at step ``j``, starting at ``start``, as ``schedule()`` would; the KV
        blocks it holds then (with prefix caching allocated now, after step j's decodes took
        theirs; otherwise when the stretch is applied)."""
        held = self.sched.join_stretch(req, p, start)
        if self.cache is None:
            return held
        req.num_cached_tokens = req.num_computed_tokens = hit
        return self.cache.admit(req, p, hit, j)

    def tokens_left(self, i: int) -> int:
        """Tokens of work its members have left (prompt tokens not yet computed plus output
        tokens not yet generated) while step ``i`` runs, as stepping would count them then
        over its running requests: those not finished by then (one that waits in step 0 is
        running; one that joins later is not yet), each having computed the tokens it had
        when planned (or joining) up to its first step, and ctx + i (its steps so far)
        after it."""
        left, planned = 0, self.planned
        for j, (req, c, _, e, o) in enumerate(self.members):
            if i < e and (o <= i or j < planned):
                left += req.num_prompt_tokens + req.num_output_tokens - (
                    req.num_computed_tokens if i <= o else c + i)
        return left

    # -- applying --------------------------------------------------------------------------
    def blocks_used(self) -> list[int]:
        """KV blocks in use after scheduling each of its steps (for the recorder)."""
        k = self.num_steps
        cache = self.cache
        if cache is not None:         # named blocks: replayed up to its last step's takes
            cache.run_to(2 * k - 1)
            return cache.used[:k]
        blocks = self.sched.blocks
        bs = blocks.block_size
        extra = [0] * k
        # a member adds a block every bs steps from its first new one: counted once where it
        # starts (and once less where it stops), then summed along each residue mod bs
        every = [0] * (k + bs)
        members = self.members
        for j in range(self.planned, len(members)):   # joined at step o, h blocks since
            _, _, h, _, o = members[j]
            extra[o] += h
        for _, c, h, e, _ in members:
            # step i holds ceil((c + i + 1) / bs) blocks: it first needs block h + 1 at step
            # h * bs - c (>= 1, since step 0 fits in h blocks), then every bs steps; a member
            # that finishes at step e - 1 frees all it holds before step e
            first = h * bs - c
            if e >= k:                 # (most members: it runs to the end)
                if first < k:
                    every[first] += 1
                continue
            if first < e:
                grown = (e - 1 - first) // bs + 1
                every[first] += 1
                every[first + grown * bs] -= 1        # (< e + bs: past its last new block)
                extra[e] -= h + grown
            else:
                extra[e] -= h
        if k > bs:                     # (else no residue repeats within the k steps)
            for r in range(bs):
                every[r::bs] = accumulate(every[r::bs])
        used = accumulate(map(add, extra, every), initial=blocks.num_used)
        next(used)                  # (the blocks before step 0)
        return list(used)

    def kv_at(self, i: int) -> int | None:
        """With prefix caching, the KV blocks in use after scheduling its step ``i``, the
        named blocks' operations replayed that far (a stretch in flight in the counted loop:
        its later steps may still be cut back); None without (``blocks_used`` counts them)."""
        cache = self.cache
        if cache is None:
            return None
        cache.run_to(2 * i + 1)
        return cache.used[i]

    def apply(self, ends: list[float]) -> list[Request]:
        """Apply its first ``len(ends)`` steps, which ended at ``ends`` (a member takes steps
        offset .. min(k, stop) - 1); the requests that finished. Their tokens are the metrics
        layer's to record (``TokenLog.stretch``). The blocks of those that joined are allocated
        now, after those that finished are freed (as stepping had them)."""
        k = len(ends)
        cache = self.cache
        if cache is not None:         # named blocks: each step's, in stepping's order
            cache.run_to(2 * k)
            planned = len(self.members)   # (blocks all allocated: nothing left to grow)
        else:
            planned = self.planned
        finished = []
        grown = []                    # (request id, blocks it holds after the steps)
        added = 0                     # the blocks they add to what the block manager has
        bs = self.sched.blocks.block_size
        for j, (req, c, h, e, o) in enumerate(self.members):
            if e > k:                 # (most members: it runs on)
                c += k
                req.num_generated += k - o
                if j >= planned:      # joined: the block manager has none of its blocks yet
                    need = -(-c // bs)
                    grown.append((req.id, need))
                    added += need
                elif c > h * bs:      # it needs more than the h blocks it holds
                    need = -(-c // bs)
                    grown.append((req.id, need))
                    added += need - h
            else:
                c += e
                req.num_generated += e - o
                req.finish_s = ends[e - 1]
                finished.append(req)
            req.num_computed_tokens = c
        sched = self.sched
        if finished:                  # (their blocks first: members may have joined since)
            sched.retire(finished, None)
        if cache is not None:
            cache.settle(self.members, k)
            return finished
        fitted = sched.blocks.grow_to(grown, added)   # fits: plan() and joins checked it
        assert fitted is not None
        return finished


def join_hits(stretch: Any, specs: list[Any], j: int, decoding: int) -> list[int] | None:
    """``join_hits`` of a synchronous or async stretch (``stretch``: its ``cache`` replay or
    None, ``sched``, ``num_steps`` and ``room_to_join``)."""
    cache: _CacheReplay | None = stretch.cache
    if cache is not None:
        return cache.hits(specs, j, decoding, stretch.num_steps)
    bm = stretch.sched.blocks
    need = sum(bm.blocks_for(s.num_prompt_tokens) for s in specs)
    return [0] * len(specs) if stretch.room_to_join(need, len(specs), decoding) else None


def segment_plan(first_plan: StepPlan, members: list[Member], i0: int) -> StepPlan:
    """The plan of a stretch's step ``i0`` (a sync or an async one): what ``schedule()``
    makes then, the members left, in running order, each decoding (step 0: ``first_plan``)."""
    if i0 == 0:
        return first_plan
    left = [m for m in members if _stop(m) > i0]
    n = len(left)
    return StepPlan(tuple([r.id for r, _, _, _, _ in left]), (1,) * n, (), (),   # (positional)
                    tuple([c + i0 for _, c, _, _, _ in left]), n, 0, 0, 0, first_plan.extra_s)


def join_plan(members: list[Member], j: int, joined: Joined) -> StepPlan:
    """The plan of a stretch's step ``j`` at which ``joined`` join: what ``schedule()`` makes
    then (the members left decoding, in running order, then each newcomer's prompt past its
    cached prefix)."""
    left = [(r, c) for r, c, _, e, _ in members if e > j]
    n = len(left)
    new = tuple([p - hit for _, p, _, hit in joined])
    return StepPlan(tuple([r.id for r, _ in left] + [r.id for r, _, _, _ in joined]),
                    (1,) * n + new, new, tuple([hit for _, _, _, hit in joined]),
                    tuple([c + j for _, c in left]), n + len(joined))


def _forget(forget: Callable[[Prices, int, int], None], priced: list[tuple[int, Prices]],
            a: int, b: int) -> None:
    """Steps a .. b - 1, priced and now dropped: ``forget`` what each segment's prices counted
    for those of its steps (``priced``: each segment's first step and prices, in order; a
    segment runs to the next one's first step)."""
    for j, (s0, prices) in enumerate(priced):
        s1 = priced[j + 1][0] if j + 1 < len(priced) else b
        lo, hi = max(a, s0), min(b, s1)
        if lo < hi:
            forget(prices, lo - s0, hi - lo)


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


def stretch_prices(latency: Pricing, plan: StepPlan) -> Prices:
    """``(i, n) -> list`` of the seconds of steps i .. i + n - 1 of a decode stretch starting
    with ``plan`` (step i: every context grown by i): the model's own ``decode_stretch`` (its
    values bit-identical to ``step_time`` step by step), else each step's plan priced."""
    return latency.decode_stretch(plan)


class _CacheReplay:
    """A stretch's operations on named KV blocks (prefix caching, ``kv/prefix.py``), done in
    the order stepping does them, only where something happens: at step i, the decodes that
    start a block take one from the pool's head each (``T(i)``); requests that join at step i
    then take their cached prefix and new blocks (``J(i)``, live: ``admit``); at its end the
    members whose last token it was free their blocks, in plan order (``F(i)``, ``release``:
    those their decodes filled being cached first). A block a decode takes lies past its
    request's prompt, so it is anonymous (kv/prefix.py: nobody else can hit it): the takes of
    the steps between two frees are one count taken off the pool's head, and each member is
    credited with its own (one every ``block_size`` steps from its first) when it frees or the
    stretch is applied (``settle``). The blocks a decode fills hold content no other request
    has, so they are cached only then too: nothing can hit or evict them before. Stepping's
    order of T, J, F over the steps is kept exactly, so the pool's LRU order, the evictions
    and every later hit are stepping's.

    ``pos`` counts the operations done: 2i is T(i), 2i + 1 is F(i); step 0's blocks were
    taken by ``schedule()`` itself, so it starts at 1. ``takes``: the blocks each step's
    decodes take; ``frees``: step -> (request id, its tokens, the blocks its decodes took),
    ``due``: those steps in order. ``used``: the blocks in use after each step's T and J (the
    recorder's ``kv_blocks_used``), as far as done. ``owed``: takes counted (``used``) but not
    yet taken off the pool, done with the next join's (``admit``) or by the next ``run_to``."""

    __slots__ = ("bm", "takes", "frees", "due", "pos", "used", "found", "owed", "delay",
                 "fresh")

    def __init__(self, bm: PrefixBlockManager, members: list[Member], k: int,
                 first_plan: StepPlan, delay: int = 0):
        # ``delay`` 1: async scheduling's (sched/async_stretch.py), where a member's blocks are
        # freed when its last step's output is delivered, after the next step's takes (its
        # free is F(e), not F(e - 1)); the step in flight before the stretch is delivered for
        # real after step 0's takes, before the replay goes on (``fresh``: it then reads the
        # blocks in use afresh), and a member's cache limit goes as it frees
        # (no reference back to the stretch: a cycle would keep both alive until the cyclic
        # collector, paused during a run, frees them)
        self.bm = bm
        self.takes = [0] * k
        self.frees: dict[int, list[tuple[int, int, int]]] = {}
        self.due: list[int] = []
        self.pos = 1
        self.owed = 0
        self.used = [bm.num_used]
        self.delay = delay
        self.fresh = bool(delay)
        # (``hits``: a single newcomer's hit blocks, for admit)
        self.found: list[int] | None = None
        for req, c, h, e, _ in members:
            self.add(req, c, h, e)
        first = self.frees.get(0)
        if first and len(first) > 1:     # step 0 frees in its plan's order
            order = {rid: i for i, rid in enumerate(first_plan.request_ids)}
            first.sort(key=lambda f: order[f[0]])

    def add(self, req: Request, c: int, h: int, e: int) -> None:
        """A member's operations: a take every ``block_size`` steps from the first step that
        feeds a position past its ``h`` blocks (h * bs - c, >= 1), and its free at step e - 1."""
        takes, bs, k = self.takes, self.bm.block_size, len(self.takes)
        first = h * bs - c
        for i in range(first, min(k, e), bs):
            takes[i] += 1
        at = e - 1 + self.delay              # F(at): its free
        if at < k:
            f = self.frees.get(at)
            entry = (req.id, c + e, len(range(first, e, bs)))
            if f is None:
                self.frees[at] = [entry]
                due = self.due
                if due and due[-1] > at:
                    due.insert(bisect_left(due, at), at)
                else:
                    due.append(at)
            else:
                f.append(entry)

    def run_to(self, pos: int, defer: bool = False) -> None:
        """Do the operations up to (not including) ``pos``: the takes of the steps up to each
        free at once (their count), then the free. ``defer``: the takes after the last free
        are only counted (``owed``), to be taken with the next operation's (``admit``) or
        before it (any other ``run_to``)."""
        bm = self.bm
        if self.owed:
            bm.take_anonymous(self.owed)
            self.owed = 0
        p = self.pos
        if p >= pos:
            return
        takes, used, frees, due = self.takes, self.used, self.frees, self.due
        release = self._release if self.delay else bm.release
        i = p >> 1
        cur = used[-1]                     # blocks in use
        if self.fresh:                     # (the step in flight delivered since: delay 1)
            cur = bm.num_blocks - bm.num_free
            self.fresh = False
        f_end = pos >> 1                   # F(j) for j < f_end; T(j) for j < (pos + 1) >> 1
        lo = bisect_left(due, i)
        if p & 1:                          # F(i) first
            if lo < len(due) and due[lo] == i:
                if i < f_end:
                    self._free(frees[i])
                    cur = bm.num_blocks - bm.num_free
                lo += 1
            i += 1
        while lo < len(due) and due[lo] < f_end:
            f = due[lo]
            chunk = takes[i:f + 1]         # T(i) .. T(f), then F(f)
            n = sum(chunk)
            chunk[0] += cur
            used += accumulate(chunk)
            if n:
                bm.take_anonymous(n)
            for rid, c, grown in frees[f]:   # F(f): each credited with its decodes' blocks
                release(rid, c, grown)
            cur = bm.num_blocks - bm.num_free
            i = f + 1
            lo += 1
        t_end = (pos + 1) >> 1
        if i < t_end:
            chunk = takes[i:t_end]
            n = sum(chunk)
            chunk[0] += cur
            used += accumulate(chunk)
            if n:
                if defer:
                    self.owed = n
                else:
                    bm.take_anonymous(n)
        self.pos = pos

    def _free(self, frees: list[tuple[int, int, int]]) -> None:
        """F(i): each member that finished credited with the blocks its decodes took, then
        released (its tokens' full blocks cached first)."""
        release = self._release if self.delay else self.bm.release
        for rid, n, grown in frees:
            release(rid, n, grown)

    def _release(self, rid: int, n: int, grown: int) -> None:
        """A member's free under async scheduling: its cache limit went when its last token
        was delivered, just before (``StepsInFlight.deliver``)."""
        self.bm.cache_limits.pop(rid, None)
        self.bm.release(rid, n, grown)

    def hits(self, specs: list[Any], j: int, decoding: int, k: int) -> list[int] | None:
        """The cached prompt tokens of the requests ``specs`` arriving to join at step ``j``
        (``decoding`` members decode then), as ``schedule()`` would find them after step j's
        decodes took their blocks and the requests before each were admitted; None where that
        cannot be known now for sure (step it): the decodes' or an earlier newcomer's new
        blocks might evict a block it would hit, or an earlier newcomer's blocks might lengthen
        its hit. Also None unless their blocks, and every member's growth for the rest of the
        stretch, surely fit."""
        # the blocks as they are before step j (for j = 1: after the frees that end step 0;
        # if the stretch then ends before step 1, step 0 is completed as a plain step, and
        # finds its requests released already: ``release`` does nothing twice)
        self.run_to(2 * j, True)           # (but for the takes since the last free: owed)
        self.found = None
        bm = self.bm
        bs = bm.block_size
        # those and step j's decodes' take these from the head, before any newcomer's
        taken = cost = self.owed + self.takes[j]
        if len(specs) == 1:                # (the usual: one newcomer, as below)
            spec = specs[0]
            rid, p = spec.request_id, spec.num_prompt_tokens
            bm.register(rid, p, spec.hash_ids)
            found = bm.hit_blocks(rid, p)
            # (a take reaches a hit only if it is free: the hits in use are never taken)
            if bm.takes_any(taken, found):
                return None
            # its new blocks, and its hits in the pool (at most all: counted only if need be)
            cost += -(-p // bs) + (decoding + 1) * ((k - 1 - j) // bs + 1)
            if cost > bm.num_free and cost - len(found) + len(bm.lookup(rid, p)[1]) \
                    > bm.num_free:
                return None
            self.found = found
            return [len(found) * bs]
        # (several: admitted in turn, each finds its own hits)
        before: set[int] = set()           # the keys the newcomers before cache
        out = []
        for spec in specs:
            rid, p = spec.request_id, spec.num_prompt_tokens
            bm.register(rid, p, spec.hash_ids)
            found, pooled = bm.lookup(rid, p)
            n = len(found)
            if before and n < (p - 1) // bs and bm.prompt_keys(rid, (n + 1) * bs)[n] in before:
                return None
            if bm.takes_any(taken, pooled):
                return None
            new = -(-p // bs) - n + len(pooled)   # blocks it takes off the pool
            cost += new
            taken += new
            before.update(bm.prompt_keys(rid, p))
            out.append(n * bs)
        grow = (k - 1 - j) // bs + 1       # per member, over the steps j + 1 .. k - 1
        if cost + (decoding + len(specs)) * grow > bm.num_free:
            return None
        return out

    def admit(self, req: Request, p: int, hit: int, j: int) -> int:
        """Allocate the blocks of ``req`` (prompt ``p``, ``hit`` tokens cached: ``hits``),
        joining at step ``j`` after the decodes took theirs; the blocks it holds."""
        bm = self.bm
        n = 0                              # the takes owed and step j's decodes', not done
        used = self.used
        if self.pos == 2 * j:              # (after ``hits``: only those)
            n = self.owed + self.takes[j]
            self.owed = 0
            used.append(0)                 # (set below)
            self.pos = 2 * j + 1
        elif self.pos < 2 * j:
            self.run_to(2 * j + 1)
        found = self.found
        if found is not None:              # (one newcomer: its hits as ``hits`` found them)
            self.found = None
            # (the takes owed and the decodes' done with its new blocks: ``hits`` found none
            # of its hits among them, so taking them after its hits left the pool is the same)
            nh = len(found)
            got = bm.allocate_hits(req.id, p, found, n)
            assert got is not None                      # (``hits`` checked the room)
            used[j] = bm.num_blocks - bm.num_free
            return nh + got
        else:
            if n:
                bm.take_anonymous(n)
            got = bm.allocate_cached(req.id, p, hit) if hit else bm.allocate(req.id, p)
        assert got is not None                          # (``hits`` checked the room)
        used[j] = bm.num_blocks - bm.num_free
        return bm.held(req.id)

    def settle(self, members: list[Member], k: int) -> None:
        """After ``k`` steps applied: the members still running are credited with the blocks
        their decodes took, and the blocks they filled are cached."""
        bs, late = self.bm.block_size, self.delay
        self.bm.hand_over_all([(req.id, len(range(h * bs - c, k, bs)), c + k - late)
                               for req, c, h, e, _ in members if e > k - late])
