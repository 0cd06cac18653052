"""What happened during a run, recorded as it happens; metrics are computed from it after.

Steps go into flat typed arrays per replica (:class:`StepLog`): a plain step is a group of one;
a fast-forwarded stretch is one group of k steps that share every count but their times and KV
blocks used (``Stretch.segments``: one group per segment). Cluster events are kept beside:
retries per request, KV transfer times, replica failures. Output tokens are recorded by each
replica's token log (``metrics.tokens``).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from simserve.metrics.requests import RequestColumns, resolved
from simserve.metrics.tokens import TokenLog
from simserve.sched.plan import StepPlan
from simserve.sched.request import Request
from simserve.sched.stretch import Stretch

if TYPE_CHECKING:
    from simserve.engine.replica import Replica

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

    def __init__(self) -> None:
        self.steps: dict[str, array[Any]] = {c: array(t) for c, t in STEP_ARRAYS.items()}
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


# Requests kept as objects before the recorder moves the resolved ones into columns (and at
# least twice those in flight, so that each request is looked at a bounded number of times).
COMPACT_MIN = 4096


@dataclass
class Recorder:
    """Events recorded during the run (see the module docstring).

    ``requests`` are the requests seen; with ``compacting`` only those not yet resolved, the
    others having moved into ``resolved`` (columns: memory O(requests in flight))."""

    requests: list[Request] = field(default_factory=list)
    resolved: RequestColumns = field(default_factory=RequestColumns)
    compacting: bool = False
    compact_at: int = field(default_factory=lambda: COMPACT_MIN)
    replicas: dict[int, StepLog] = field(default_factory=dict)
    tokens: dict[int, TokenLog] = field(default_factory=dict)     # output tokens per replica
    retries: dict[int, int] = field(default_factory=dict)        # request id -> times retried
    transfer_s: list[float] = field(default_factory=list)         # one per KV handoff
    failures: list[tuple[int, float]] = field(default_factory=list)   # (replica, time)

    def add_request(self, req: Request) -> None:
        """A request that has arrived."""
        self.requests.append(req)
        if self.compacting and len(self.requests) >= self.compact_at:
            self.compact()

    def compact(self) -> None:
        """Move the resolved requests into ``resolved``."""
        done, self.requests = resolved(self.requests)
        self.resolved.take(done)
        self.compact_at = max(COMPACT_MIN, 2 * len(self.requests))

    def log(self, replica: Replica) -> StepLog:
        log = self.replicas.get(replica.index)
        if log is None:
            log = self.replicas[replica.index] = StepLog()
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

    def step(self, replica: Replica, start: float, duration: float, plan: StepPlan) -> None:
        log = self.replicas.get(replica.index) or self.log(replica)
        s = log.steps
        s["start_s"].append(start)
        s["duration_s"].append(duration)
        sched = replica.scheduler
        s["kv_blocks_used"].append(sched.blocks.num_used)
        log.group_records.fromlist(_group_row(
            1, replica.index, plan.num_prefill_tokens, len(plan.prefill_lens),
            len(plan.decode_ctx), len(sched.running) + sched.num_parked, sched.num_waiting,
            sched.blocks.num_blocks, plan.num_preempted, plan.swap_out_blocks, plan.swap_in_blocks))

    def stretch(self, replica: Replica, stretch: Stretch) -> None:
        """A priced stretch's steps, one group per segment begun (``Stretch.segments``): the
        steps of a segment differ only in their times and KV blocks used; every running
        request is in it. The first segment has the stretch plan's counts (a mixed first step
        is a segment of its own); the others decode."""
        log = self.replicas.get(replica.index) or self.log(replica)
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
            else:   # _group_row(i1 - i0, index, 0, 0, m, m, waiting, num_blocks, 0, 0, 0), inline
                rows += (i1 - i0, index, 0, 0, m, m, m, waiting, num_blocks, 0, 0, 0)
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
    """One group's record, in GROUP_FIELDS order (written out once more, for speed, in
    Recorder.stretch's decode segments)."""
    return [num_steps, replica, prefill_tokens, prefill_seqs, decode_seqs,
            prefill_tokens + decode_seqs, running, waiting, num_blocks, preempted, swap_out,
            swap_in]
