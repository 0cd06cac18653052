"""A sample given as values with multiplicities, read in chunks: percentiles without ever
expanding it (tens of millions of inter-token gaps need not sit in memory at once)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from simserve.metrics.arith import dot

Chunk = tuple[np.ndarray, np.ndarray]          # (values, weights)
Pieces = Callable[[], Iterable[Chunk]]


class WeightedSample:
    """A sample given as values with multiplicities: ``values[i]`` occurs ``weights[i]`` times.

    ITL comes this way from the engine (a gap between two steps counts once per request that
    emitted a token in both), so no per-token array is ever built. The data may also be given
    as a function returning an iterable of ``(values, weights)`` chunks, regenerated for each
    pass, so that tens of millions of gaps never sit in memory at once.
    """

    def __init__(self, values: Any = None, weights: Any = None, *,
                 chunks: Pieces | None = None) -> None:
        if chunks is None:
            values = np.asarray(values, dtype=np.float64)
            weights = np.asarray(weights, dtype=np.int64)
            chunks = lambda: [(values, weights)]   # noqa: E731
        self._chunks = chunks
        # one pass for the count, the sum and the range (each later pass regenerates the data)
        self._n, self._sum, self._lo, self._hi = 0, 0.0, math.inf, -math.inf
        for v, w in self._pieces():
            self._n += int(w.sum())
            self._sum += dot(v, w)
            self._lo, self._hi = min(self._lo, float(v.min())), max(self._hi, float(v.max()))

    def __len__(self) -> int:
        return self._n

    def _pieces(self) -> Iterator[Chunk]:
        return ((v, w) for v, w in self._chunks() if len(v))

    def mean(self) -> float:
        return self._sum / self._n

    def std(self) -> float:
        mean = self.mean()
        return float(np.sqrt(sum(dot(w, (v - mean) ** 2) for v, w in self._pieces())
                             / self._n))

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """``np.percentile(expanded, q)`` (linear method) for each q, without expanding."""
        n = self._n
        wanted = {}
        for q in qs:
            h = (n - 1) * q / 100.0
            lo = int(np.floor(h))
            wanted[q] = (h, lo, min(lo + 1, n - 1))
        ranks = sorted({r for _, lo, hi in wanted.values() for r in (lo, hi)})
        at = self._at_ranks(ranks)
        return [float(at[lo] + (h - lo) * (at[hi] - at[lo]))
                for h, lo, hi in (wanted[q] for q in qs)]

    def percentile(self, q: float) -> float:
        return self.percentiles([q])[0]

    def _at_ranks(self, ranks: list[int]) -> dict[int, float]:
        """The elements at these 0-based ranks of the sorted expanded sample. A weighted
        histogram locates the bin holding each rank; only those bins' values are then
        gathered and sorted (zooming into a bin that is still crowded). Two passes over the
        data serve all the ranks."""
        lo_v, hi_v = self._lo, self._hi
        return self._select(ranks, lo_v, hi_v, self._pieces) if lo_v < hi_v \
            else dict.fromkeys(ranks, lo_v)

    @staticmethod
    def _select_distinct(rank: int, lo_v: float, hi_v: float, pieces: Pieces) -> float:
        totals: dict[float, int] = {}
        for v, w in pieces():
            inside = (v >= lo_v) & (v <= hi_v)
            values, inverse = np.unique(v[inside], return_inverse=True)
            for value, weight in zip(values.tolist(),
                                     np.bincount(inverse, weights=w[inside]).tolist()):
                totals[value] = totals.get(value, 0) + int(weight)
        seen = 0
        for value in sorted(totals):
            seen += totals[value]
            if seen > rank:
                return value
        return max(totals)

    @staticmethod
    def _select(ranks: list[int], lo_v: float, hi_v: float, pieces: Pieces) -> dict[int, float]:
        """The elements at ``ranks`` among the values in [lo_v, hi_v] of ``pieces()``."""
        if lo_v == hi_v:
            return dict.fromkeys(ranks, lo_v)
        counts = np.zeros(4096)
        try:
            for v, w in pieces():
                c, edges = np.histogram(v, bins=4096, range=(lo_v, hi_v), weights=w)
                counts += c
        except ValueError:   # a range a few ulps wide: only a handful of distinct values
            return {r: WeightedSample._select_distinct(r, lo_v, hi_v, pieces) for r in ranks}
        cum = np.cumsum(counts)
        bin_of = {r: int(np.searchsorted(cum, r, side="right")) for r in ranks}
        last = len(counts) - 1
        gathered: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {
            j: ([], []) for j in set(bin_of.values())}
        for v, w in pieces():
            for j, (bin_v, bin_w) in gathered.items():
                inside = (v >= edges[j]) & ((v <= edges[j + 1]) if j == last
                                            else (v < edges[j + 1]))
                bin_v.append(v[inside])
                bin_w.append(w[inside])
        at: dict[int, float] = {}
        for r, j in bin_of.items():
            before = int(cum[j - 1]) if j else 0
            bv, bw = np.concatenate(gathered[j][0]), np.concatenate(gathered[j][1])
            if len(bv) <= 1 << 16:
                order = np.argsort(bv)
                k = int(np.searchsorted(np.cumsum(bw[order]), r - before, side="right"))
                at[r] = float(bv[order][k])
            else:            # still crowded: zoom into this bin alone
                def crowded(bv: np.ndarray = bv, bw: np.ndarray = bw) -> list[Chunk]:
                    return [(bv, bw)]
                at[r] = WeightedSample._select([r - before], float(edges[j]),
                                               float(edges[j + 1]), crowded)[r - before]
        return at
