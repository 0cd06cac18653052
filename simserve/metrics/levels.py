"""Time-weighted scheduler levels from grouped step columns, one chunk of steps at a time.

A replica's steps are summed in chunks of ``LEVEL_CHUNK`` steps (its steps ``[0, C)``,
``[C, 2C)``, ...): the sums of a chunk depend on that chunk alone, so a long run's recorder can
fold its oldest chunks into these few numbers as it goes (``metrics.recorder.StepLog.fold``)
and drop the steps, and the summary adds the folded chunks' numbers and the kept steps' in the
same order as if nothing had been folded: the same bits (``metrics.summary.grouped_levels``).
NumPy only: the recorder imports this during a run.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from simserve.metrics.arith import dot

# (more than runner.STEPS_ROWS: a run whose steps.csv is written by default sums its steps in
# one chunk, as whole arrays; a chunk's temporaries are a few MB)
LEVEL_CHUNK = 1 << 17


class ChunkSums(NamedTuple):
    """One chunk of one replica's steps, clipped to the window [t0, t1]: sum of num_running,
    num_waiting and KV use (fraction) times the step's time in the window; the largest KV use;
    the time in the window (busy); num_batched_tokens summed (an exact integer); steps."""

    running: float
    waiting: float
    kv: float
    kv_max: float
    busy: float
    batched: int
    num_steps: int


def group_of_steps(counts: np.ndarray) -> np.ndarray:
    """The group index (int32) of each step, groups holding ``counts`` steps each."""
    return np.repeat(np.arange(len(counts), dtype=np.int32), counts)


def chunk_sums(g: dict[str, Any], group_of: np.ndarray, a: int, b: int, t0: float,
               t1: float) -> ChunkSums:
    """The sums of steps ``[a, b)`` of one replica's grouped columns ``g`` (``start_s``,
    ``duration_s``, ``kv_blocks_used`` per step; ``num_running``, ``num_waiting``,
    ``num_batched_tokens``, ``kv_blocks_total`` per group; ``group_of`` from
    ``group_of_steps``)."""
    start = g["start_s"][a:b]
    overlap = np.clip(start + g["duration_s"][a:b], t0, t1) - np.clip(start, t0, t1)
    gi = group_of[a:b]
    total = g["kv_blocks_total"][gi].astype(float)
    frac = np.divide(g["kv_blocks_used"][a:b], total, out=np.zeros(b - a), where=total > 0)
    return ChunkSums(dot(g["num_running"][gi], overlap),
                     dot(g["num_waiting"][gi], overlap),
                     dot(frac, overlap), float(frac.max()), float(overlap.sum()),
                     int(g["num_batched_tokens"][gi].sum(dtype=np.int64)), b - a)


def replica_chunks(g: dict[str, Any], t0: float, t1: float,
                   chunk: int | None = None) -> list[ChunkSums]:
    """Every chunk of one replica: those folded during the run (``g["folded"]``, if any),
    then its kept steps', in step order (chunks of ``LEVEL_CHUNK`` steps unless given)."""
    chunk = chunk or LEVEL_CHUNK
    out = list(g.get("folded", ()))
    n = len(g["start_s"])
    if n:
        group_of = group_of_steps(g["num_steps"])
        out.extend(chunk_sums(g, group_of, a, min(a + chunk, n), t0, t1)
                   for a in range(0, n, chunk))
    return out
