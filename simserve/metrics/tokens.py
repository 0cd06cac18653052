"""Output tokens as they are sampled: inter-token latency and, when asked, every token's time.

The scheduler only says what happened (``Scheduler.sampled``: the requests that sampled a token
in the step it just completed; a stretch's members and their steps); each replica's
:class:`TokenLog` turns that into inter-token-latency statistics as it goes, never per token:
gap g, between the replica's steps g and g + 1, occurs ``itl_diff``-many times, kept as a
difference array (entry g adds to every gap from g on); a gap that spans skipped steps (a
request that waited, was preempted, or came from another replica) is listed in ``itl_extra``.
``metrics.recorder.itl_sample`` reads both back as one weighted sample (metrics.sample).

Every token's time is kept only when asked for (``record``: tokens.csv, ``Result.token_times``):
a request's :class:`TokenTrack` then holds runs ``[first, stop)`` of step indices into the
replica's step end times, plus the times of tokens it received elsewhere (a disaggregated
hand-off, a retry on another replica).

    replica steps      0    1    2    3    4    5
    request A tokens        x    x    x              runs [[1, 4]]; gaps at 1, 2: diff[1] += 1,
                                                     diff[3] -= 1
    request B tokens   x              x    x         gap 0 -> 3 in itl_extra; gap 3: diff
"""

from __future__ import annotations

from array import array
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

from simserve.metrics.levels import LEVEL_CHUNK
from simserve.metrics.sketch import LogHistogram
from simserve.sched.request import Request, TokenTrack

_first = itemgetter(0)

if TYPE_CHECKING:
    from simserve.sched.stretch import Member, Stretch

CHUNK = LEVEL_CHUNK   # steps read at a time after a run: bounds the memory of long runs
# a run of at most this many steps (all replicas) keeps its gaps while they are read (a few MB);
# a longer one makes them again, chunk by chunk, for each pass over them
KEEP_STEPS = 4 * CHUNK


class TokenLog:
    """One replica's output tokens (it outlives the replica's schedulers: a restart after a
    failure goes on counting steps)."""

    __slots__ = ("num_steps", "itl_diff", "itl_extra", "record", "step_ends", "base", "carry")

    def __init__(self, record: bool = False):
        self.num_steps = 0                 # steps completed so far (the next step's index)
        self.itl_diff = array("i", [0])    # entry g - base: gap g (a long run folds: fold())
        self.base = 0                      # gaps folded into the recorder's sketch
        self.carry = 0                     # the multiplicity of gap base - 1
        self.itl_extra = array("d")
        self.record = record               # keep every token's time
        self.step_ends = array("d")        # (record) each step's end

    def step(self, t_end: float, sampled: list[Request],
             counts: list[int] | None = None) -> None:
        """A step ended at ``t_end``; ``sampled`` sampled a token in it (in plan order); with
        speculative decoding ``counts`` says how many each (one chunk each: one gap, as
        ``vllm bench serve`` records one ITL sample per streamed chunk)."""
        index = self.num_steps
        self.num_steps = index + 1
        diff, record = self.itl_diff, self.record
        local = index - self.base               # (tracks keep step indices; diff is local)
        diff.append(0)
        if record:
            self.step_ends.append(t_end)
        adjacent = 0                                    # decoded in the previous step too
        for req in sampled:
            tr = req.tokens
            if tr is None:                              # its first token
                req.first_token_s = t_end
                tr = req.tokens = TokenTrack(index, t_end, record)
            else:
                if tr.last_step == index - 1:
                    adjacent += 1
                else:                                   # skipped some steps
                    self.itl_extra.append(t_end - tr.last_s)
                tr.last_step, tr.last_s = index, t_end
            if record:
                self._extend(tr, index, 1)
        if adjacent:                                    # one gap each: the previous step's
            diff[local - 1] += adjacent
            diff[local] -= adjacent
        if record and counts is not None:
            for req, c in zip(sampled, counts):
                if c > 1:
                    tr = req.tokens
                    assert tr is not None           # it sampled: its track exists
                    if tr.extra is None:
                        tr.extra = {}
                    tr.extra[index] = c - 1

    def stretch(self, stretch: Stretch, ends: list[float],
                members: list[Member] | None = None) -> None:
        """The first ``len(ends)`` steps of a fast-forwarded stretch, ending at ``ends``
        (``members``: those of its members that take any of them, where not all do).

        Member j takes steps offset[j] .. min(k, stop[j]) - 1. Inside the stretch every member has
        one gap per step between its steps; entering it, a member that decoded in the step just
        before adds that step gap, others add their own gap since their last token.
        """
        k = len(ends)
        a = self.num_steps
        self.num_steps = a + k
        self.itl_diff.frombytes(bytes(k * 4))     # k zeros ("i": 4 bytes)
        if self.record:
            self.step_ends.extend(ends)
        extra, diff = self.itl_extra, self.itl_diff
        d = a - self.base                        # step a's entry in diff
        if members is None:
            members = stretch.members
        last, t_last = a + k - 1, ends[-1]       # where members that run to the end stop
        adjacent = stays = late = 0
        # the gaps of members whose first step here is not step 0, listed after those of step
        # 0 in step order as stepping lists them (the sums of the ITL come out the same bits):
        # step 1's (those that waited in step 0), then any later step's
        later: list[float] = []
        others: list[tuple[int, float]] = []
        for req, _, _, e, o in members:
            tr = req.tokens
            if tr is None:
                req.first_token_s = ends[o]
                tr = req.tokens = TokenTrack(0, 0.0, self.record)
            elif not o:
                if tr.last_step == a - 1:
                    adjacent += 1
                else:
                    extra.append(ends[0] - tr.last_s)
            elif o == 1:
                later.append(ends[1] - tr.last_s)
            else:
                others.append((o, ends[o] - tr.last_s))
            if e < k:                            # its last token at step e - 1
                tr.last_step, tr.last_s = a + e - 1, ends[e - 1]
                diff[d + e - 1] -= 1             # its gaps a + o .. a + e - 2 (the start: below)
            else:
                tr.last_step, tr.last_s = last, t_last
                stays += 1
            if o:                                # (waited in step 0, or joined at step o)
                late += 1
                diff[d + o] += 1
        if later:
            extra.extend(later)
        if others:
            others.sort(key=_first)              # (stable: in running order within a step)
            extra.extend([g for _, g in others])
        diff[d + k - 1] -= stays
        diff[d] += len(members) - late
        if adjacent:
            diff[d - 1] += adjacent
            diff[d] -= adjacent
        if self.record:
            for req, _, _, e, o in members:
                # (recording gives every request a track)
                self._extend(req.tokens, a + o, (e if e < k else k) - o)  # type: ignore[arg-type]

    def fold(self, sketch: LogHistogram, ends: np.ndarray, chunk: int, m: int = 1) -> None:
        """Fold gaps base .. base + m * chunk - 1 (their steps' ends: ``ends``, m * chunk + 1
        of them, engine clock), a chunk at a time, into ``sketch`` and drop them (a long run:
        ``Recorder.fold``), with every whole chunk of the gaps that spanned skipped steps."""
        for a in range(0, m * chunk, chunk):
            self._gaps(sketch, ends[a:a + chunk + 1], chunk, a)
        del self.itl_diff[:m * chunk]
        self.base += m * chunk
        extra = self.itl_extra
        while len(extra) >= chunk:
            sketch.add(np.frombuffer(extra, dtype=np.float64, count=chunk),
                       np.ones(chunk, dtype=np.int64))
            del extra[:chunk]

    def fold_rest(self, sketch: LogHistogram, ends: np.ndarray, chunk: int) -> None:
        """Fold every gap left into ``sketch`` (the run is over; ``ends``: the kept steps'
        ends), in the chunks ``fold`` folds: the sketch does not depend on when folds
        happened. Leaves nothing to fold."""
        n = len(ends)
        for a in range(0, max(n - 1, 0), chunk):
            b = min(a + chunk, n - 1)
            self._gaps(sketch, ends[a:b + 1], b - a, a)
        extra = self.itl_extra
        for a in range(0, len(extra), chunk):
            v = np.frombuffer(extra, dtype=np.float64)[a:a + chunk]
            sketch.add(v, np.ones(len(v), dtype=np.int64))
        self.itl_diff, self.itl_extra = array("i", [0]), array("d")
        self.base, self.carry = self.num_steps, 0

    def _gaps(self, sketch: LogHistogram, ends: np.ndarray, k: int, at: int = 0) -> None:
        """Gaps base + at .. base + at + k - 1 (``ends``: their k + 1 steps' ends) into
        ``sketch``, as ``itl_sample`` reads them; ``carry`` moves on past them."""
        w = np.cumsum(np.frombuffer(self.itl_diff, dtype=np.int32, count=k, offset=4 * at),
                      dtype=np.int64) + self.carry
        self.carry = int(w[-1])
        keep = w > 0
        sketch.add(np.diff(ends)[keep], w[keep])

    def delivered(self, req: Request, t: float) -> None:
        """A token produced on another replica (a disaggregated prefill's) reaches the client
        at ``t``; the gap since the request's previous token is this replica's."""
        tr = req.tokens
        if tr is None:
            req.first_token_s = t
            tr = req.tokens = TokenTrack(-2, t, self.record)
        else:
            self.itl_extra.append(t - tr.last_s)
            tr.last_step, tr.last_s = -2, t
        if tr.runs is not None:
            tr.flatten()
            tr.earlier.append(t)

    def _extend(self, tr: TokenTrack, first: int, k: int) -> None:
        """Add this replica's steps [first, first + k) to a request's runs, merging adjacent
        runs; tokens recorded on another replica become its earlier times first."""
        if tr.ends is not self.step_ends:
            tr.flatten()
            tr.ends = self.step_ends
        runs = tr.runs
        assert runs is not None
        if runs and runs[-1][1] == first:
            runs[-1][1] = first + k
        else:
            runs.append([first, first + k])


def moved(req: Request) -> None:
    """The request starts over elsewhere (a retry after a failure): its next token's gap
    spans skipped steps."""
    if req.tokens is not None:
        req.tokens.last_step = -2
