"""The ITL sketch of long runs (metrics.sketch.LogHistogram): its stated error bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simserve.metrics.sketch import GAMMA, REL_ERROR, TINY, LogHistogram

QS = [0, 1, 10, 25, 50, 75, 90, 99, 99.9, 100]


def sketch_of(values, weights, pieces: int = 1) -> LogHistogram:
    h = LogHistogram()
    cut = np.linspace(0, len(values), pieces + 1).astype(int)
    for a, b in zip(cut, cut[1:]):
        h.add(np.asarray(values[a:b], float), np.asarray(weights[a:b], np.int64))
    return h


def test_the_stated_bound_covers_the_bins():
    # the bin's answer is (GAMMA - 1) / (GAMMA + 1) from both of its ends, relatively
    assert (GAMMA - 1) / (GAMMA + 1) == pytest.approx(0.0049751, abs=1e-7)
    assert (GAMMA - 1) / (GAMMA + 1) < REL_ERROR


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(1e-6, 1e4, allow_nan=False), st.integers(1, 40)),
                min_size=1, max_size=80),
       st.integers(1, 4))
def test_percentiles_within_the_bound_of_the_expanded_sample(pairs, pieces):
    """Every percentile within REL_ERROR of np.percentile of the expanded sample, however the
    sample is cut into chunks; count, mean and std exact up to rounding; extremes exact."""
    values = np.array([v for v, _ in pairs])
    weights = np.array([w for _, w in pairs])
    expanded = np.repeat(values, weights)
    h = sketch_of(values, weights, min(pieces, len(values)))
    assert len(h) == len(expanded)
    got = h.percentiles(QS)
    for q, x in zip(QS, got):
        want = float(np.percentile(expanded, q))
        assert abs(x - want) <= REL_ERROR * want * (1 + 1e-12), (q, x, want)
    assert got[0] == expanded.min() and got[-1] == expanded.max()
    assert h.mean() == pytest.approx(expanded.mean(), rel=1e-12)
    assert h.std() == pytest.approx(expanded.std(), rel=1e-6, abs=1e-9 * expanded.mean())


def test_error_reaches_but_never_passes_the_bound():
    """Values at the edges of their bins are answered at the worst distance the bound allows
    (the bound is tight, not loose), and never beyond it."""
    edges = GAMMA ** np.arange(-300, 300, 7, dtype=float)
    worst = 0.0
    for v in np.concatenate([edges, np.nextafter(edges * GAMMA, 0)]):
        h = sketch_of(np.array([1e-9, v, 1e9]), np.array([1, 1, 1]))
        got = h.percentile(50)                      # the middle element, alone in its bin
        worst = max(worst, abs(got - v) / v)
    assert worst <= REL_ERROR
    assert worst > 0.99 * (GAMMA - 1) / (GAMMA + 1)


def test_zero_and_tiny_gaps_are_kept_exactly():
    values = np.array([0.0, TINY / 2, 0.02, 0.03])
    weights = np.array([5, 2, 10, 1])
    expanded = np.repeat(values, weights)
    h = sketch_of(values, weights)
    for q in (0, 10, 20, 27):
        assert h.percentile(q) == np.percentile(expanded, q)
    assert abs(h.percentile(50) - 0.02) <= REL_ERROR * 0.02


def test_large_sample_of_lognormal_gaps():
    """Ten million weighted gaps in chunks (a long run's shape): within the bound."""
    rng = np.random.default_rng(3)
    values = rng.lognormal(math.log(0.025), 0.6, 2_000_000)
    weights = rng.integers(1, 10, len(values))
    h = sketch_of(values, weights, pieces=8)
    expanded = np.repeat(values, weights)
    exact = np.percentile(expanded, QS)
    for q, x, want in zip(QS, h.percentiles(QS), exact):
        assert abs(x - want) <= REL_ERROR * want, q
    assert h.mean() == pytest.approx(expanded.mean(), rel=1e-12)
    assert h.std() == pytest.approx(expanded.std(), rel=1e-9)


def test_empty_chunks_are_ignored():
    h = LogHistogram()
    h.add(np.empty(0), np.empty(0, dtype=np.int64))
    assert len(h) == 0
    h.add(np.array([0.5]), np.array([3]))
    assert h.percentiles([0, 50, 100]) == [0.5, 0.5, 0.5] and h.mean() == 0.5 and h.std() == 0
