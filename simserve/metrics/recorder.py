"""What happened during a run, recorded as it happens; metrics are computed from it after.

Steps go into flat typed arrays per replica (:class:`StepLog`): a plain step is a group of one;
a fast-forwarded stretch is one group of k steps that share every count but their times and KV
blocks used (``Stretch.segments``: one group per segment). Cluster events are kept beside:
retries per request, KV transfer times, replica failures. Output tokens are recorded by each
replica's token log (``metrics.tokens``).

A long run (a replica past ``FOLD_STEPS`` steps) keeps memory bounded by folding: its oldest
``LEVEL_CHUNK`` steps at a time (completed, and inside the summary's window: ``Recorder.fold``)
are reduced to their time-weighted sums (``metrics.levels.ChunkSums``, the very numbers the
summary would compute from them) and their inter-token gaps to a log histogram
(``metrics.sketch``), and dropped. Runs with at most ``FOLD_STEPS`` steps on every replica fold
nothing and their ITL percentiles are exact; longer runs' are within 0.5 % (docs/metrics.md).
The per-step table of a folded run is gone: ``simserve run --steps`` (``keep_steps``) keeps it.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from simserve.metrics import levels
from simserve.metrics.levels import ChunkSums, chunk_sums, group_of_steps
from simserve.metrics.requests import RequestColumns, resolved
from simserve.metrics.sketch import LogHistogram
from simserve.metrics.sample import WeightedSample
from simserve.metrics.tokens import CHUNK, KEEP_STEPS, TokenLog
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request
from simserve.latency.base import Pricing
from simserve.sched.core import Scheduler
from simserve.sched.stretch import Stretch


class Replica(Protocol):
    """What the recorder reads of a replica (engine/replica.py's ``Replica``)."""

    @property
    def index(self) -> int: ...

    @property
    def scheduler(self) -> Scheduler: ...

    @property
    def pricing(self) -> Pricing: ...

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


class StepLog:
    """One replica's steps, in its own order (step i here is its i-th step)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.steps: dict[str, array[Any]] = {c: array(t) for c, t in STEP_ARRAYS.items()}
        self.group_records = array("i")      # GROUP_FIELDS of each group, one after another
        # added to start times read back (a front-end delay puts the engine's clock behind
        # the client's: runner.collect); the engine itself never reads it
        self.offset = offset
        # a long run's steps folded away (Recorder.fold): how many, and each chunk's sums;
        # the arrays above hold the steps from ``num_folded`` on
        self.num_folded = 0
        self.folded: list[ChunkSums] = []
        self.fold_at = FOLD_STEPS            # (Recorder.stretch: steps kept before trying)

    @property
    def num_steps(self) -> int:
        """Every step of the replica, folded ones included."""
        return self.num_folded + len(self.steps["start_s"])

    def level_columns(self) -> dict[str, Any]:
        """What ``metrics.summary.grouped_levels`` takes for this replica: the kept steps'
        arrays and group columns, and the folded chunks' sums."""
        return {**self.step_arrays(), **self.group_columns(), "folded": self.folded}

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

    def engine_ends(self, n: int) -> np.ndarray:
        """The end times of the first ``n`` kept steps on the engine's clock (no offset: the
        inter-token gaps are differences of these, as ``metrics.tokens.itl_sample`` reads)."""
        return (np.frombuffer(self.steps["start_s"], dtype=np.float64, count=n)
                + np.frombuffer(self.steps["duration_s"], dtype=np.float64, count=n))

    def drop(self, k: int, sums: list[ChunkSums]) -> None:
        """Fold the first ``k`` kept steps away, keeping their chunks' ``sums``; a group they
        end inside keeps its remaining steps."""
        for a in self.steps.values():
            del a[:k]
        g = self.group_records
        counts = np.frombuffer(g, dtype=np.int32)[::_G]
        whole = int(np.searchsorted(np.cumsum(counts, dtype=np.int64), k, side="right"))
        left = k - int(counts[:whole].sum(dtype=np.int64))     # steps of group ``whole`` gone
        del counts
        del g[:whole * _G]
        if left:
            g[0] -= left
        self.num_folded += k
        self.folded.extend(sums)

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
        if self.num_folded:
            raise ValueError("the steps of a long run were folded away (keep_steps=True, "
                             "CLI --steps, keeps them)")
        groups = self.group_columns()
        group_of_step = np.repeat(np.arange(len(groups["num_steps"])), groups["num_steps"])
        steps = self.step_arrays()
        return {c: steps[c] if c in steps else groups[c].take(group_of_step).astype(np.int64)
                for c in STEP_COLUMNS}


_DTYPES = {"d": np.float64, "q": np.int64, "i": np.int32}


# Requests kept as objects before the recorder moves the resolved ones into columns (and at
# least twice those in flight, so that each request is looked at a bounded number of times).
COMPACT_MIN = 4096
# A replica keeps every step up to this many; past it (a long run: ITL from the sketch) the
# recorder folds its oldest steps, in whole LEVEL_CHUNKs, back to half this many (the module
# docstring). Up to it, ITL is exact.
FOLD_STEPS = 1 << 21


@dataclass
class Recorder:
    """Events recorded during the run (see the module docstring).

    ``requests`` are the requests seen; with ``compacting`` only those not yet resolved, the
    others having moved into ``resolved`` (columns: memory O(requests in flight))."""

    requests: list[Request] = field(default_factory=list)
    resolved: RequestColumns = field(default_factory=RequestColumns)
    compacting: bool = False
    compact_at: int = field(default_factory=lambda: COMPACT_MIN)
    # fold a long run's oldest steps (needs ``compacting``: resolved requests bound the window)
    folding: bool = False
    itl_sketch: LogHistogram | None = None     # the folded inter-token gaps (a long run)
    itl_done: bool = False                     # every gap folded (``itl``: after the run)
    # of the requests seen by the first compaction (the workload's first when it is routed
    # ahead: engine/runtime.py's route_ahead, its replicas taking their arrivals out of order)
    first_arrival: float | None = None
    last_finish: float = -math.inf             # latest finish resolved so far (client clock)
    replicas: dict[int, StepLog] = field(default_factory=dict)
    tokens: dict[int, TokenLog] = field(default_factory=dict)     # output tokens per replica
    retries: dict[int, int] = field(default_factory=dict)        # request id -> times retried
    transfer_s: list[float] = field(default_factory=list)         # one per KV handoff
    failures: list[tuple[int, float]] = field(default_factory=list)   # (replica, time)
    # pipeline-parallel replicas' stages (engine/pipeline.py's Stages: their bubbles)
    stages: dict[int, Any] = field(default_factory=dict)

    def add_request(self, req: Request) -> None:
        """A request that has arrived."""
        self.requests.append(req)
        if self.compacting and len(self.requests) >= self.compact_at:
            self.compact()

    def compact(self) -> None:
        """Move the resolved requests into ``resolved`` (and fold what a long run can)."""
        if self.first_arrival is None and self.requests:
            self.first_arrival = min(r.spec.arrival_s for r in self.requests)
        done, self.requests = resolved(self.requests)
        rows = self.resolved.take(done)
        self.compact_at = max(COMPACT_MIN, 2 * len(self.requests))
        if done:
            self._note_finishes(rows)
        if self.folding:
            for index, log in self.replicas.items():
                if log.num_steps - log.num_folded > FOLD_STEPS:
                    self.fold(index)

    def _note_finishes(self, chunk: dict[str, np.ndarray]) -> None:
        """The latest finish among newly resolved requests, on the client's clock (as
        ``runner.collect`` shifts it by the replica's front-end delay)."""
        finish = chunk["finish_s"]
        ok = ~np.isnan(finish)
        if not ok.any():
            return
        finish, where = finish[ok], chunk["replica"][ok]
        shifts = {i: log.offset for i, log in self.replicas.items() if log.offset}
        if shifts:
            finish = finish + np.array([shifts.get(int(i), 0.0) for i in where])
        self.last_finish = max(self.last_finish, float(finish.max()))

    def fold(self, index: int) -> None:
        """Fold replica ``index``'s oldest steps, whole LEVEL_CHUNKs of them, back to half of
        FOLD_STEPS kept (one resize of its arrays for many chunks), as far as they can be:
        completed (its token log has counted them, so no cut or failure trims them), the
        next step too (a gap needs both ends), none in the last group, and all inside the
        summary's window as known so far (starting after the first arrival, ending by the
        latest finish: clipping to the final window cannot change them). Their level sums
        are kept (``StepLog.folded``), their gaps go to ``itl_sketch``."""
        log, tokens = self.replicas[index], self.tokens.get(index)
        c = levels.LEVEL_CHUNK
        kept = log.num_steps - log.num_folded
        if (kept > FOLD_STEPS and tokens is not None and not tokens.record
                and self.first_arrival is not None):
            assert tokens.base == log.num_folded
            sums = self._chunks(log, tokens.num_steps, (kept - FOLD_STEPS // 2) // c)
            if sums:
                if self.itl_sketch is None:
                    self.itl_sketch = LogHistogram()
                k = len(sums) * c
                tokens.fold(self.itl_sketch, log.engine_ends(k + 1), c, len(sums))
                log.drop(k, sums)
                kept -= k
        # next try (Recorder.stretch): past FOLD_STEPS again, or, if some steps could not be
        # folded yet, a quarter chunk later (each try compacts: not at every stretch)
        log.fold_at = FOLD_STEPS if kept <= FOLD_STEPS else kept + c // 4

    def _chunks(self, log: StepLog, completed: int, most: int) -> list[ChunkSums]:
        """The sums of ``log``'s first chunks of LEVEL_CHUNK kept steps, up to ``most``, as
        long as they can be folded (``fold``). A chunk's sums depend on its steps alone: the
        same as if the chunks before it had been folded already. (The arrays' views end with
        this call: a folded log resizes.)"""
        c = levels.LEVEL_CHUNK
        assert self.first_arrival is not None
        counts = log.group_columns()["num_steps"]
        last_group = len(log.steps["start_s"]) - int(counts[-1])   # its first step
        g = log.level_columns()
        start, duration = g["start_s"], g["duration_s"]            # (client clock: offset added)
        group_of = None
        out: list[ChunkSums] = []
        for a in range(0, most * c, c):
            b = a + c
            if (completed < log.num_folded + b + 2 or last_group <= b
                    or start[a] < self.first_arrival
                    or float((start[a:b] + duration[a:b]).max()) > self.last_finish):
                break
            if group_of is None:
                group_of = group_of_steps(counts)
            out.append(chunk_sums(g, group_of, a, b, self.first_arrival, self.last_finish))
        return out

    def itl(self) -> LogHistogram | None:
        """A long run's inter-token gaps, all of them folded into the sketch (None for a run
        that keeps exact ITL: no replica past ``FOLD_STEPS`` steps)."""
        if not any(log.num_steps > FOLD_STEPS for log in self.replicas.values()):
            return None
        if self.itl_done:
            return self.itl_sketch
        sketch = self.itl_sketch if self.itl_sketch is not None else LogHistogram()
        for index in sorted(self.tokens):
            log = self.replicas.get(index)
            tokens = self.tokens[index]
            n = tokens.num_steps - tokens.base if log is not None else 0
            ends = log.engine_ends(n) if log is not None and n else np.empty(0)
            tokens.fold_rest(sketch, ends, levels.LEVEL_CHUNK)
        self.itl_sketch, self.itl_done = sketch, True
        return sketch

    def log(self, replica: Replica) -> StepLog:
        log = self.replicas.get(replica.index)
        if log is None:
            delay = replica.pricing.frontend_delay_s
            log = self.replicas[replica.index] = StepLog(delay)
        return log

    def token_log(self, replica: Replica) -> TokenLog:
        """The replica's token log (every token's time kept if its scheduler asks for it)."""
        log = self.tokens.get(replica.index)
        if log is None:
            log = self.tokens[replica.index] = TokenLog(replica.scheduler.record_tokens)
        return log

    @property
    def num_stretches(self) -> int:
        return sum(int((log.group_columns()["num_steps"] > 1).sum())
                   for log in self.replicas.values())

    def step(self, replica: Replica, start: float, duration: float, plan: StepPlan,
             kv_blocks_used: int | None = None) -> None:
        """One step; ``kv_blocks_used``: the blocks in use after scheduling it, when the block
        manager has moved on since (a stretch cut back to its first step)."""
        log = self.replicas.get(replica.index) or self.log(replica)
        s = log.steps
        s["start_s"].append(start)
        s["duration_s"].append(duration)
        sched = replica.scheduler
        s["kv_blocks_used"].append(sched.blocks.num_used if kv_blocks_used is None
                                   else kv_blocks_used)
        log.group_records.fromlist(_group_row(
            1, replica.index, plan.num_prefill_tokens, len(plan.prefill_lens),
            len(plan.decode_ctx), len(sched.running) + sched.num_parked, sched.num_waiting,
            sched.blocks.num_blocks, plan.num_preempted, plan.swap_out_blocks, plan.swap_in_blocks))

    def stretch(self, replica: Replica, stretch: Stretch, waiting: int | None = None) -> None:
        """A priced stretch's steps, one group per segment begun (``Stretch.begun``): the
        steps of a segment differ only in their times and KV blocks used; every running
        request is in it. The first segment has the stretch plan's counts (a mixed first step
        is a segment of its own); a step at which requests joined is one too; the others
        decode. ``waiting``: the requests waiting at its steps, if not the scheduler's now
        (a stretch recorded once it is over: engine/loops.py's counted loop)."""
        log = self.replicas.get(replica.index) or self.log(replica)
        s = log.steps
        s["start_s"].fromlist(stretch.starts)          # (fromlist: twice as fast as extend)
        s["duration_s"].fromlist(stretch.durations)
        s["kv_blocks_used"].fromlist(stretch.blocks_used())
        k = stretch.num_steps
        plan = stretch.first_plan
        segments = stretch.begun
        index, sched = replica.index, replica.scheduler
        if waiting is None:
            waiting = sched.num_waiting
        num_blocks = sched.blocks.num_blocks
        rows: list[int] = []
        joins = stretch.joins
        ends = [seg[0] for seg in segments]     # (each segment ends where the next begins)
        ends[0] = k
        ends.append(ends.pop(0))
        for (i0, m, _), i1 in zip(segments, ends):
            if i0 >= k:
                break
            if i1 > k:
                i1 = k
            if i0 == 0:
                rows += _group_row(i1, index, plan.num_prefill_tokens, len(plan.prefill_lens),
                                   len(plan.decode_ctx), m, waiting, num_blocks, 0, 0, 0)
            elif i0 in joins:   # requests joined: their prompts beside the m decodes
                # _group_row(1, index, tokens, seqs, m, m + seqs, waiting, num_blocks, 0, 0,
                # 0), inline
                tokens, seqs = joins[i0]
                rows += (1, index, tokens, seqs, m, tokens + m, m + seqs, waiting, num_blocks,
                         0, 0, 0)
            else:   # _group_row(i1 - i0, index, 0, 0, m, m, waiting, num_blocks, 0, 0, 0), inline
                rows += (i1 - i0, index, 0, 0, m, m, m, waiting, num_blocks, 0, 0, 0)
        log.group_records.fromlist(rows)
        if len(s["start_s"]) > log.fold_at and self.folding:
            self.compact()                  # (the latest finishes; folds what it can)

    def async_stretch(self, replica: Replica, starts: list[float], durations: list[float],
                      kv_blocks_used: list[int],
                      runs: list[tuple[int, int, int, int, int]],
                      waiting: int | None = None) -> None:
        """An async decode stretch's steps (sched/async_stretch.py): their starts, durations
        and KV blocks used, and runs of steps of one count, each one group: (steps, prefill
        tokens, prefill sequences, decoding, running); nothing waits (``waiting``: the
        requests that waited at its steps, if some wait now: recorded once it is over)."""
        log = self.replicas.get(replica.index) or self.log(replica)
        s = log.steps
        s["start_s"].fromlist(starts)
        s["duration_s"].fromlist(durations)
        s["kv_blocks_used"].fromlist(kv_blocks_used)
        index, sched = replica.index, replica.scheduler
        num_blocks = sched.blocks.num_blocks
        if waiting is None:
            waiting = sched.num_waiting
        rows: list[int] = []
        for n, tokens, seqs, m, running in runs:
            rows += (n, index, tokens, seqs, m, tokens + m, running, waiting, num_blocks, 0, 0,
                     0)
        log.group_records.fromlist(rows)
        if len(s["start_s"]) > log.fold_at and self.folding:
            self.compact()                  # (the latest finishes; folds what it can)

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
    """One group's record, in GROUP_FIELDS order (written out once more, for speed, in
    Recorder.stretch's decode and join segments)."""
    return [num_steps, replica, prefill_tokens, prefill_seqs, decode_seqs,
            prefill_tokens + decode_seqs, running, waiting, num_blocks, preempted, swap_out,
            swap_in]


def itl_sample(rec: Recorder) -> WeightedSample:
    """Every inter-token gap of a run, as the replicas' token logs gathered them: gap g of a
    replica (between its steps g and g + 1) with its multiplicity, plus the gaps that spanned
    skipped steps. Streamed in chunks of steps, regenerated for each pass."""
    sources = []
    for index in sorted(rec.tokens):
        log, steps = rec.tokens[index], rec.replicas.get(index)
        n = log.num_steps if steps is not None else 0
        start = np.frombuffer(steps.steps["start_s"], dtype=np.float64) \
            if steps is not None and n else None
        duration = np.frombuffer(steps.steps["duration_s"], dtype=np.float64) \
            if steps is not None and n else None
        sources.append((np.frombuffer(log.itl_diff, dtype=np.int32), start, duration, n,
                        np.frombuffer(log.itl_extra, dtype=np.float64)))

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for diff, start, duration, n, extra in sources:
            carry = 0
            for a in range(0, max(n - 1, 0), CHUNK):   # gaps a .. b-1 need step ends a .. b
                b = min(a + CHUNK, n - 1)
                w = np.cumsum(diff[a:b], dtype=np.int64) + carry
                carry = int(w[-1])
                assert start is not None and duration is not None
                ends = start[a:b + 1] + duration[a:b + 1]
                keep = w > 0
                yield np.diff(ends)[keep], w[keep]
            yield extra, np.ones(len(extra), dtype=np.int64)

    if sum(n for _, _, _, n, _ in sources) <= KEEP_STEPS:
        pieces = list(chunks())         # (a short run: made once, not for each of four passes)
        return WeightedSample(chunks=lambda: pieces)
    return WeightedSample(chunks=chunks)
