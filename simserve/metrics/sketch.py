"""A streaming sketch of a large weighted sample: a fixed log-binned histogram.

The inter-token gaps of a run of millions of requests are billions of tokens over hundreds of
millions of engine steps; the exact percentiles (``metrics.sample.WeightedSample``) need every
step's end time kept to the end of the run. Above a size (``metrics.recorder.FOLD_STEPS``) the
recorder instead folds the gaps, a million steps at a time, into a :class:`LogHistogram`, whose
memory is fixed (about 90 KB):

* **percentiles** within a relative error of ``(GAMMA - 1) / (GAMMA + 1)`` = 0.4975 % (stated
  as 0.5 %: ``REL_ERROR``) of ``np.percentile`` of the expanded sample, linear method, for every
  value in ``[TINY, HUGE]`` = [2**-40 s, 2**40 s] (about 0.9 ps to 35,000 years); values below
  ``TINY`` (zero gaps) are kept exactly, by value; the minimum and the maximum are exact;
* **count** exact; **mean** the correctly rounded sum of per-chunk sums (``math.fsum``) over the
  exact count, and **std** (population, ``np.std``'s definition) from each chunk's count, sum
  and sum of squared deviations from its own mean (Chan et al.'s pairwise combination, summed
  with ``math.fsum``): both exact up to floating-point rounding, and independent of the order
  in which chunks arrive (a run's replicas fold theirs in any order).

Bin ``k`` holds ``[GAMMA**k, GAMMA**(k + 1))`` and answers with ``2 GAMMA**(k + 1) / (1 + GAMMA)``,
the point of the bin at the same relative distance from both ends (clamped to the exact minimum
and maximum). The rank a percentile needs is located exactly (counts are exact integers), so only
the value within its bin is approximate; ``np.percentile`` interpolates between two ranks, and a
convex combination of two estimates each within ε of positive values is within ε of their
combination. (The same idea as HdrHistogram and DDSketch's log-spaced buckets.)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from simserve.metrics.arith import dot

GAMMA = 1.01
REL_ERROR = 0.005                      # the stated bound: (GAMMA - 1) / (GAMMA + 1) = 0.004975
TINY, HUGE = 2.0 ** -40, 2.0 ** 40
_LN_GAMMA = math.log(GAMMA)
_K0 = math.floor(math.log(TINY) / _LN_GAMMA)          # the lowest bin (TINY falls in it)
_NBINS = math.floor(math.log(HUGE) / _LN_GAMMA) - _K0 + 1


class LogHistogram:
    """A weighted sample folded into log-spaced bins (see the module docstring). ``add``
    chunks of ``(values, weights)``; read back ``len``, ``mean``, ``std``, ``percentiles`` as
    :class:`~simserve.metrics.sample.WeightedSample` does (its stand-in in the summary)."""

    def __init__(self) -> None:
        self.counts = np.zeros(_NBINS, dtype=np.int64)
        self.small: dict[float, int] = {}       # values below TINY, exactly
        self.n = 0
        self._chunks: list[tuple[int, float, float]] = []   # (count, sum, squared deviations)
        self.lo, self.hi = math.inf, -math.inf

    def __len__(self) -> int:
        return self.n

    def add(self, values: np.ndarray, weights: np.ndarray) -> None:
        """Fold ``values[i]`` occurring ``weights[i]`` times (weights > 0, integers)."""
        if not len(values):
            return
        v = np.asarray(values, dtype=np.float64)
        w = np.asarray(weights, dtype=np.int64)
        n = int(w.sum())
        self.n += n
        wf = w.astype(np.float64)
        total = dot(v, wf)
        dev = v - total / n
        self._chunks.append((n, total, dot(wf * dev, dev)))
        self.lo, self.hi = min(self.lo, float(v.min())), max(self.hi, float(v.max()))
        small = v < TINY
        if small.any():
            for value, weight in zip(v[small].tolist(), w[small].tolist()):
                self.small[value] = self.small.get(value, 0) + weight
            v, w = v[~small], w[~small]
        k = np.floor(np.log(np.minimum(v, HUGE)) / _LN_GAMMA).astype(np.int64) - _K0
        np.clip(k, 0, _NBINS - 1, out=k)
        # (bincount sums weights as floats: exact while a chunk's bin holds < 2**53 tokens)
        self.counts += np.bincount(k, weights=w, minlength=_NBINS).astype(np.int64)

    def mean(self) -> float:
        return math.fsum(s for _, s, _ in self._chunks) / self.n

    def std(self) -> float:
        mean = self.mean()
        terms = [m2 for _, _, m2 in self._chunks]
        terms += [n * (s / n - mean) ** 2 for n, s, _ in self._chunks]
        return math.sqrt(max(math.fsum(terms) / self.n, 0.0))

    def percentile(self, q: float) -> float:
        return self.percentiles([q])[0]

    def percentiles(self, qs: Sequence[float]) -> list[float]:
        """``np.percentile(expanded, q)`` (linear method) for each q, each within
        ``REL_ERROR`` of the exact value (see the module docstring)."""
        n = self.n
        out = []
        for q in qs:
            h = (n - 1) * q / 100.0
            lo = int(np.floor(h))
            hi = min(lo + 1, n - 1)
            a, b = self._at(lo), self._at(hi)
            out.append(float(a + (h - lo) * (b - a)))
        return out

    def _at(self, rank: int) -> float:
        """The estimate of the element at 0-based ``rank`` of the sorted expanded sample."""
        if rank <= 0:
            return self.lo
        if rank >= self.n - 1:
            return self.hi
        seen = 0
        for value in sorted(self.small):
            seen += self.small[value]
            if seen > rank:
                return value
        cum = np.cumsum(self.counts)
        j = int(np.searchsorted(cum, rank - seen, side="right"))
        estimate = 2.0 * GAMMA ** (j + _K0 + 1) / (1.0 + GAMMA)
        return min(max(estimate, self.lo), self.hi)
