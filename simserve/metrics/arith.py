"""Sums of products that come out the same everywhere.

``np.dot`` hands float vectors to the BLAS library NumPy was built with, whose ``ddot`` splits
a long vector among its threads and adds the parts in an order that depends on how many there
are: a summary's last bits would then differ between ``simserve run`` (which runs BLAS on one
thread) and a notebook, or between machines with different core counts. The metrics take
their weighted sums here instead: the products, then NumPy's own pairwise sum, which no thread
count changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def dot(a: Any, b: Any) -> float:
    """Σ a[i]·b[i] in float64 (pairwise summation of the products)."""
    return float(np.multiply(a, b, dtype=np.float64).sum())
