"""One look for every figure: a fixed colour per policy, units on axes, readable legends.

A policy always has the same colour, in every figure of every report. Series that share a policy
(``sarathi-512`` and ``sarathi-2048``) keep its colour and differ by line style and bar hatch.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

POLICY_COLORS = {
    "static": "#7f7f7f",     # grey
    "orca": "#9467bd",       # purple
    "vllm_v0": "#ff7f0e",    # orange
    "vllm_v1": "#1f77b4",    # blue
    "sarathi": "#2ca02c",    # green
}
# Policies added later get one of these by a stable hash of the name (same colour every run).
_SPARE = ("#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79", "#ad494a")
LINESTYLES = ("-", "--", ":", "-.")
HATCHES = ("", "//", "..", "xx")
MARKERS = ("o", "s", "^", "D")

RC = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
    "axes.spines.right": False, "svg.hashsalt": "simserve", "figure.dpi": 100,
}
SLO_COLOR = "#d62728"
TARGET_COLOR = "#444444"


def policy_color(policy: str) -> str:
    if policy in POLICY_COLORS:
        return POLICY_COLORS[policy]
    return _SPARE[zlib.crc32(policy.encode()) % len(_SPARE)]


def series_styles(series: Sequence[tuple[str, str]]) -> dict[str, dict]:
    """``{label: {color, linestyle, hatch, marker}}`` for (label, policy) pairs, in order."""
    seen: dict[str, int] = {}
    out = {}
    for label, policy in series:
        k = seen.get(policy, 0)
        seen[policy] = k + 1
        out[label] = {"color": policy_color(policy), "linestyle": LINESTYLES[k % len(LINESTYLES)],
                      "hatch": HATCHES[k % len(HATCHES)], "marker": MARKERS[k % len(MARKERS)]}
    return out
