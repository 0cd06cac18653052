"""One look for every figure: a fixed colour per policy, units on axes, readable legends.

Colours come from one qualitative palette, assigned in order — never from a hash of the name,
which gave ``priority``, ``lmdeploy`` and ``s3`` the same colour. Every shipped policy has its own
(in ``POLICY_COLORS``, the same in every figure of every report); a policy name we do not ship
takes the next unused colour of ``_SPARE`` in the order the series appear. Series that share a
policy (``sarathi-512`` and ``sarathi-2048``) keep its colour and differ by line style, marker
and bar hatch; series whose data coincide, exactly or within what a figure can show, are
drawn with another line style and hollow, larger markers and say so in the legend
(``mark_coinciding``: ``=`` or ``≈``), so one never hides the other. Every shipped policy
also has its own marker.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

# Matplotlib's "tab10" for the first policies (kept from earlier reports), then darker tones
# of distinct hues. Red is kept for SLO limits (SLO_COLOR), black and grey for reference lines.
POLICY_COLORS = {
    "static": "#7f7f7f",                    # grey
    "orca": "#9467bd",                      # purple
    "vllm_v0": "#ff7f0e",                   # orange
    "vllm_v1": "#1f77b4",                   # blue
    "sarathi": "#2ca02c",                   # green
    "tgi": "#8c564b",                       # brown
    "lmdeploy": "#e377c2",                  # pink
    "fastserve": "#17becf",                 # cyan
    "s3": "#bcbd22",                        # olive
    "trtllm_guaranteed_no_evict": "#393b79",   # indigo
    "trtllm_max_utilization": "#9c9ede",       # lavender
    "priority": "#fb9a99",                  # salmon (maroon was within ΔE 12 of tgi's brown)
}
# One marker per shipped policy, so that lines of near colours still differ (up to ten policies
# in one figure: tests/unit/test_report.py checks colours and markers stay apart).
POLICY_MARKERS = {
    "static": "x", "orca": "v", "vllm_v0": "s", "vllm_v1": "o", "sarathi": "^", "tgi": "D",
    "lmdeploy": "P", "fastserve": "*", "s3": "h", "trtllm_guaranteed_no_evict": "<",
    "trtllm_max_utilization": ">", "priority": "X", "vllm_native": "d",
}
# For policy names not above (a plug-in, a label from another tool), in order of appearance.
_SPARE = ("#637939", "#e7ba52", "#7b4173", "#3182bd", "#31a354", "#756bb1", "#636363")
LINESTYLES = ("-", "--", ":", "-.")
HATCHES = ("", "//", "..", "xx")
MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h", "<", ">", "X", "d", "x")

RC = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "legend.fontsize": 9,
    "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
    "axes.spines.right": False, "svg.hashsalt": "simserve", "figure.dpi": 100,
}
SLO_COLOR = "#d62728"
TARGET_COLOR = "#444444"


def policy_color(policy: str) -> str:
    """The shipped policy's colour; an unknown name gets the first spare (see series_styles)."""
    return POLICY_COLORS.get(policy, _SPARE[0])


def series_styles(series: Sequence[tuple[str, str]]) -> dict[str, dict]:
    """``{label: {color, linestyle, hatch, marker}}`` for (label, policy) pairs, in order.
    Unknown policies take spare colours in order of first appearance (distinct while spares
    last)."""
    spare = iter(c for c in _SPARE if c not in POLICY_COLORS.values())
    colors = dict(POLICY_COLORS)
    seen: dict[str, int] = {}
    out = {}
    for label, policy in series:
        if policy not in colors:
            colors[policy] = next(spare, _SPARE[len(colors) % len(_SPARE)])
        k = seen.get(policy, 0)
        seen[policy] = k + 1
        base = MARKERS.index(POLICY_MARKERS.get(policy, MARKERS[0]))
        out[label] = {"color": colors[policy], "linestyle": LINESTYLES[k % len(LINESTYLES)],
                      "hatch": HATCHES[k % len(HATCHES)],
                      "marker": MARKERS[(base + k) % len(MARKERS)],
                      "markerfacecolor": None, "markersize": 6, "same_as": None,
                      "approx": False}
    return out


def mark_coinciding(styles: dict[str, dict], keys: Mapping[str, Hashable],
                    approx: bool = False) -> dict[str, dict]:
    """Series whose data are identical (equal ``keys``) to an earlier one's — or, ``approx``,
    too close to tell apart when drawn — are drawn with the next line style and marker, hollow
    and larger, and ``same_as`` naming the first, for the legend (``=``, or ``≈``)."""
    first: dict[Hashable, str] = {}
    count: dict[Hashable, int] = {}
    for label, st in styles.items():
        key = keys.get(label)
        if key is None:
            continue
        if key not in first:
            first[key], count[key] = label, 0
            continue
        count[key] += 1
        k = count[key]
        st.update(linestyle=LINESTYLES[(LINESTYLES.index(st["linestyle"]) + k) % len(LINESTYLES)],
                  marker=MARKERS[(MARKERS.index(st["marker"]) + k) % len(MARKERS)],
                  markerfacecolor="none", markersize=6 + 3 * k, same_as=first[key],
                  approx=approx)
    return styles


def legend_label(label: str, style: dict) -> str:
    if not style.get("same_as"):
        return label
    return f"{label} ({'≈' if style.get('approx') else '='} {style['same_as']})"
