"""The report's figures. Each function returns a matplotlib ``Figure`` drawn on an Agg canvas
(no pyplot, no global backend), so the same calls work in a script, the CLI and Jupyter.

Colours follow :mod:`simserve.report.style`: one fixed colour per policy in every figure.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from simserve.errors import ConfigError, SimserveError
from simserve.fmt import human
from simserve.report.load import PARETO_X, PARETO_Y, CapacityData, PlanData, RunData
from simserve.report.style import (RC, SLO_COLOR, TARGET_COLOR, legend_label, mark_coinciding,
                                   series_styles)

LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2el", "E2EL"))


def _styled(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # rcParams are read as artists are made: style them all
        with matplotlib.rc_context(RC):
            return fn(*args, **kwargs)
    return wrapper


# How to make what each figure takes, said when it is given something else (a bare simserve
# Result was an AttributeError from deep inside the figure)
MADE_BY = {"RunData": "RunData.from_result(label, result)",
           "CapacityData": "CapacityData.from_result(result)",
           "PlanData": "PlanData.from_result(result)", "Curve": "load_curves(table, x, series)"}
T = TypeVar("T")


def _expect(fn: str, where: str, value: object, cls: type[T]) -> T:
    """``value`` is a ``cls``; SimserveError naming ``fn``'s argument ``where`` otherwise."""
    if not isinstance(value, cls):
        raise SimserveError(f"{fn}: {where}: expected {cls.__name__} "
                            f"({MADE_BY[cls.__name__]}), got {type(value).__name__}")
    return value


def _expect_list(fn: str, where: str, values: object, cls: type[T]) -> list[T]:
    """``values`` as a list of ``cls`` (one ``cls`` alone: a list of one). A mapping or a
    table is refused rather than read as its keys or column names: ``simserve.compare``'s
    results by label are a dict, a sweep's results a DataFrame."""
    if isinstance(values, cls):
        return [values]
    if isinstance(values, (Mapping, str, bytes, pd.DataFrame)) or \
            not isinstance(values, Iterable):
        hint = ("; for results by label: [RunData.from_result(label, r) for label, r in "
                "results.items()]" if cls is RunData and isinstance(values, Mapping) else "")
        raise SimserveError(f"{fn}: {where}: expected a list of {cls.__name__} "
                            f"({MADE_BY[cls.__name__]}), got {type(values).__name__}{hint}")
    return [_expect(fn, f"{where}[{i}]", v, cls) for i, v in enumerate(values)]


def _check_target(target: object) -> None:
    """An attainment target is a fraction, as in the data (0.9); the tables show it as a
    percentage, and 90 from them drew the target line at 9000 % and found no knee."""
    if target is None:
        return
    if not isinstance(target, numbers.Real) or isinstance(target, bool):
        raise ConfigError("target", f"must be a number, a fraction in (0, 1], got "
                                    f"{type(target).__name__}")
    if not 0 < target <= 1:
        raise ConfigError("target", f"must be a fraction in (0, 1] (0.9 for 90 %), got "
                                    f"{target:g}")


def _figure(width: float, height: float, rows: int = 1, cols: int = 1, **kw):
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, cols, squeeze=False, **kw)


def _legend(fig: Figure, handles: list) -> None:
    fig.legend(handles=handles, loc="outside right upper", frameon=False)


def _log_axis(ax, which: str = "x") -> None:
    """A log axis labelled in plain numbers (``200``, ``1,000``), as many labels as the range
    has room for: 1, 2 and 5 of each decade over a decade or so, only powers of ten over more,
    1, 2, 3, 5, 7 under one. Matplotlib's default labels minor ticks as ``2×10¹`` once a range
    spans under a few decades, and those print over each other. Call after plotting."""
    axis = ax.xaxis if which == "x" else ax.yaxis
    lo, hi = ax.get_xlim() if which == "x" else ax.get_ylim()
    decades = math.log10(hi / lo) if lo > 0 and hi > lo else 1.0
    subs = (1.0,) if decades > 1.6 else (1.0, 2.0, 5.0) if decades > 0.8 else \
        (1.0, 2.0, 3.0, 5.0, 7.0)
    axis.set_major_locator(LogLocator(base=10, subs=subs, numticks=30))
    axis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10)), numticks=30))
    axis.set_major_formatter(FuncFormatter(_tick))
    axis.set_minor_formatter(NullFormatter())


def _tick(v: float, _pos: object = None) -> str:
    return f"{v:,.0f}" if v >= 1 and float(v).is_integer() else human(v)


SHARED_KNEE_COLOR = "#555555"     # a knee line that several series share


def _near(a: np.ndarray, b: np.ndarray, rel: float = 0.05) -> bool:
    """Two samples whose CDFs a figure cannot tell apart: at the 1st to 99th percentiles,
    within ``rel`` of each other (5 % is 0.02 of a decade on a log axis)."""
    if not len(a) or not len(b):
        return len(a) == len(b)
    q = np.linspace(0.01, 0.99, 99)
    qa, qb = np.quantile(a, q), np.quantile(b, q)
    return bool(np.all(np.abs(qa - qb) <= rel * np.maximum(np.abs(qa), np.abs(qb))))


def _series_handles(styles: dict[str, dict], marker: bool = True) -> list:
    return [Line2D([], [], color=st["color"], linestyle=st["linestyle"] if not marker else "-",
                   marker=st["marker"] if marker else None,
                   markerfacecolor=st.get("markerfacecolor") or st["color"],
                   label=legend_label(label, st))
            for label, st in styles.items()]


def _key(df: pd.DataFrame) -> int:
    """A hash of a table's values: equal for series that would be drawn on top of each other."""
    return int(pd.util.hash_pandas_object(df.reset_index(), index=False).sum())


# --- load curves (sweeps and capacity probes over the request rate) ----------------------------

@dataclass
class Curve:
    """One series of a load sweep: metrics per x value (seeds averaged, attainment's min/max
    over seeds kept as ``attainment_min``/``attainment_max``)."""

    label: str
    policy: str
    points: pd.DataFrame

    def knee(self, target: float | None) -> float | None:
        """The highest x up to which every x meets the attainment target (min over seeds);
        ``target`` a fraction (0.9)."""
        _check_target(target)
        if target is None or "attainment_min" not in self.points:
            return None
        knee = None
        for x, attained in self.points["attainment_min"].items():
            if pd.isna(attained) or attained < target:
                break
            knee = x
        return knee


def load_curves(table: pd.DataFrame, x: str, series: str | Sequence[str] = (),
                default_label: str = "run") -> list[Curve]:
    """Group a sweep-like table (``policy`` column, summary metrics) into curves over ``x``,
    one per value of the ``series`` columns (one column name alone: that column)."""
    if not isinstance(table, pd.DataFrame):
        raise SimserveError(f"load_curves: table: expected a DataFrame (what simserve.sweep "
                            f"returns, or a sweep.csv read back), got {type(table).__name__}")
    # one name is one column, not its characters
    named = [("series", series)] if isinstance(series, str) else \
        [(f"series[{i}]", c) for i, c in enumerate(series)]
    series = [c for _, c in named]
    for where, column in [("x", x), *named, ("table", "policy")]:
        _column(table, where, column)
    if not len(table):
        raise SimserveError("load_curves: table: no rows (a sweep or capacity search with no "
                            "points)")
    if "error" in table:
        table = table[table["error"].isna()]
    table = table[table[x].notna()]
    if not len(table):
        raise SimserveError(f"load_curves: table: no point to draw: every row failed (column "
                            f"'error') or has no {x!r}")
    numeric = table.select_dtypes("number").columns.drop(x, errors="ignore")
    groups = table.groupby(list(series), sort=False) if series else [((), table)]
    curves = []
    for key, group in groups:
        key = key if isinstance(key, tuple) else (key,)
        if len(series) == 1:
            label = str(key[0])
        elif series:
            label = ", ".join(f"{f.split('.')[-1]}={v}" for f, v in zip(series, key))
        else:
            label = default_label
        by_x = group.groupby(x)
        points = by_x[list(numeric)].mean()
        if "slo_attainment" in group and group["slo_attainment"].notna().any():
            points["attainment_min"] = by_x["slo_attainment"].min()
            points["attainment_max"] = by_x["slo_attainment"].max()
        curves.append(Curve(label, str(group["policy"].iloc[0]), points.sort_index()))
    return curves


def _column(table: pd.DataFrame, where: str, column: object) -> None:
    """``column`` is one of ``table``'s; else SimserveError naming the argument and the columns
    it could be: a sweep table's varied fields (between ``point`` and ``policy``), or all."""
    try:
        if column in table.columns:
            return
    except TypeError:           # (unhashable: a list where one name goes)
        raise SimserveError(f"load_curves: {where}: expected a column name, got "
                            f"{type(column).__name__}") from None
    cols = [str(c) for c in table.columns]
    if "point" in cols and "policy" in cols and cols.index("point") < cols.index("policy"):
        varied = cols[cols.index("point") + 1: cols.index("policy")]
        there = (f"the sweep varied {', '.join(varied) or 'nothing'}; each point's scheduler "
                 "policy is column 'policy'")
    else:
        there = "its columns: " + ", ".join(cols[:20]) + (
            f" and {len(cols) - 20} more" if len(cols) > 20 else "")
    what = "a table without a 'policy' column (not a sweep or capacity table?)" \
        if where == "table" else f"no column {column!r} in the table"
    raise SimserveError(f"load_curves: {where}: {what}; {there}")


def _curve_styles(curves: Sequence[Curve]) -> dict[str, dict]:
    styles = series_styles([(c.label, c.policy) for c in curves])
    return mark_coinciding(styles, {c.label: _key(c.points) for c in curves})


@_styled
def throughput_vs_load(curves: Curve | Sequence[Curve], *, x_label: str = "offered load (req/s)",
                       target: float | None = None, knees: dict[str, float] | None = None,
                       diagonal: bool = True, title: str = "") -> Figure:
    """Served throughput and goodput (top) and SLO attainment (bottom) against offered load;
    the knee (highest load meeting the attainment target, a fraction: 0.9) marked per series."""
    curves = _expect_list("throughput_vs_load", "curves", curves, Curve)
    _check_target(target)
    has_slo = target is not None and any("attainment_min" in c.points for c in curves)
    fig, axes = _figure(9.5, 7 if has_slo else 4.5, 2 if has_slo else 1, 1, sharex=True,
                        height_ratios=[3, 2] if has_slo else None)
    top = axes[0][0]
    styles = _curve_styles(curves)
    knees = knees if knees is not None else {c.label: c.knee(target) for c in curves}
    xmax = max((c.points.index.max() for c in curves if len(c.points)), default=1.0)
    if diagonal:
        top.plot([0, xmax], [0, xmax], color="#999999", linestyle=":", linewidth=1)
    for c in curves:
        st, p = styles[c.label], c.points
        hollow = st["markerfacecolor"]       # a curve on top of another: hollow, larger
        top.plot(p.index, p["request_throughput"], color=st["color"], marker=st["marker"],
                 linestyle="-", markerfacecolor=hollow, markersize=st["markersize"])
        if has_slo and "request_goodput" in p:
            top.plot(p.index, p["request_goodput"], color=st["color"], marker=st["marker"],
                     linestyle="--", markerfacecolor=hollow or "white",
                     markersize=st["markersize"])
    top.set_ylabel("requests/s")
    top.set_xlim(left=0)
    top.set_ylim(bottom=0)
    kinds = [Line2D([], [], color="black", linestyle="-", label="throughput (req/s)")]
    if has_slo:
        kinds.append(Line2D([], [], color="black", linestyle="--", markerfacecolor="white",
                            label="goodput (req/s meeting SLO)"))
    if diagonal:
        kinds.append(Line2D([], [], color="#999999", linestyle=":", label="served = offered"))
    if has_slo:
        bottom = axes[1][0]
        for c in curves:
            st, p = styles[c.label], c.points
            if "attainment_min" not in p:
                continue
            bottom.plot(p.index, 100 * p["slo_attainment"], color=st["color"],
                        marker=st["marker"], linestyle="-", markerfacecolor=st["markerfacecolor"],
                        markersize=st["markersize"])
            if (p["attainment_max"] > p["attainment_min"]).any():   # spread over seeds
                bottom.fill_between(p.index, 100 * p["attainment_min"],
                                    100 * p["attainment_max"], color=st["color"], alpha=0.15)
        bottom.axhline(100 * target, color=TARGET_COLOR, linestyle="-.", linewidth=1)
        bottom.set_ylabel("SLO attainment (%)")
        bottom.set_ylim(0, 105)
        kinds.append(Line2D([], [], color=TARGET_COLOR, linestyle="-.",
                            label=f"attainment target ({100 * target:.0f}%)"))
        axes[-1][0].set_xlabel(x_label)
    else:
        top.set_xlabel(x_label)
    # one line per knee value, in its series' colour (grey when series share it), labelled
    # with the value alone: the legend says whose knee it is (series labels are long, and
    # written beside the line they ran into each other and the legend)
    at: dict[float, list[str]] = {}
    for c in curves:
        if knees.get(c.label) is not None:
            at.setdefault(knees[c.label], []).append(c.label)
    for i, (knee, labels) in enumerate(sorted(at.items())):
        color = styles[labels[0]]["color"] if len(labels) == 1 else SHARED_KNEE_COLOR
        for row in axes:
            row[0].axvline(knee, color=color, linewidth=3, alpha=0.3)
        top.annotate(f"knee {knee:.3g}", (knee, 1.0), xycoords=("data", "axes fraction"),
                     xytext=(3, -12 - 11 * i), textcoords="offset points", fontsize=9,
                     color=color)
    if at:
        kinds.append(Line2D([], [], color="black", linewidth=3, alpha=0.3,
                            label="knee: highest load\nmeeting the target"))
    handles = _series_handles(styles)
    if len(curves) > 1:
        for h, c in zip(handles, curves):
            if knees.get(c.label) is not None:
                h.set_label(f"{h.get_label()} (knee {knees[c.label]:.3g})")
    top.set_title(title or f"Throughput and goodput vs {x_label}")
    _legend(fig, handles + kinds)
    return fig


@_styled
def latency_vs_load(curves: Curve | Sequence[Curve], *, x_label: str = "offered load (req/s)",
                    slo: dict | None = None, title: str = "") -> Figure:
    """Median and p99 TTFT, TPOT and E2EL against load (log scale), SLO limits drawn."""
    curves = _expect_list("latency_vs_load", "curves", curves, Curve)
    fig, axes = _figure(13, 4.2, 1, 3)
    styles = _curve_styles(curves)
    slo = slo or {}
    for ax, (key, name) in zip(axes[0], LATENCIES):
        for c in curves:
            st, p = styles[c.label], c.points
            for pct, ls, fill in (("p99", "-", None), ("median", "--", "white")):
                col = f"{pct}_{key}_ms"
                if col in p:
                    ax.plot(p.index, p[col], color=st["color"], marker=st["marker"],
                            linestyle=ls, markerfacecolor=st["markerfacecolor"] or fill,
                            markersize=st["markersize"] - 1)
        if slo.get(f"{key}_ms"):
            ax.axhline(slo[f"{key}_ms"], color=SLO_COLOR, linestyle=":", linewidth=1.5)
        ax.set_yscale("log")
        _log_axis(ax, "y")
        ax.set_xlabel(x_label)
        ax.set_ylabel(f"{name} (ms, log scale)")
        ax.set_title(name)
    kinds = [Line2D([], [], color="black", linestyle="-", label="p99"),
             Line2D([], [], color="black", linestyle="--", markerfacecolor="white",
                    label="median")]
    if any(slo.get(f"{k}_ms") for k, _ in LATENCIES):
        kinds.append(Line2D([], [], color=SLO_COLOR, linestyle=":", label="SLO limit"))
    fig.suptitle(title or f"Latency vs {x_label}")
    _legend(fig, _series_handles(styles) + kinds)
    return fig


# --- runs: latency distributions, headline bars, timelines --------------------------------------

def _run_styles(runs: Sequence[RunData]) -> dict[str, dict]:
    """Each run's style; runs with identical per-request latencies marked ``=`` an earlier one,
    runs whose latency distributions are too close to tell apart drawn (``_near``) ``≈``."""
    styles = series_styles([(r.label, r.policy) for r in runs])
    columns = [c for c in ("ttft_s", "tpot_s", "e2el_s") if all(c in r.requests for r in runs)]
    if not columns:
        return styles
    exact = {r.label: _key(r.requests[columns]) for r in runs}
    mark_coinciding(styles, exact)
    samples = {r.label: [r.requests[c].dropna().to_numpy(float) for c in columns] for r in runs}
    near: dict[str, str] = {}
    firsts: list[str] = []
    for r in runs:
        if styles[r.label]["same_as"]:
            continue
        match = next((f for f in firsts if all(_near(a, b) for a, b in
                                               zip(samples[r.label], samples[f]))), None)
        if match is None:
            firsts.append(r.label)
        near[r.label] = match or r.label
    rest = {label: key for label, key in near.items()}
    if any(key != label for label, key in rest.items()):
        mark_coinciding(styles, rest, approx=True)
    return styles


@_styled
def latency_cdfs(runs: RunData | Sequence[RunData], title: str = "") -> Figure:
    """Empirical CDFs of per-request TTFT, TPOT and E2EL (finished requests), one line per run."""
    runs = _expect_list("latency_cdfs", "runs", runs, RunData)
    fig, axes = _figure(13, 4.2, 1, 3)
    styles = _run_styles(runs)
    slo = runs[0].slo if runs else {}
    for ax, (key, name) in zip(axes[0], LATENCIES):
        drawn: list[tuple[str, np.ndarray]] = []
        hidden: list[str] = []   # runs this panel draws under another's line, legend silent
        for r in runs:
            done = r.requests[r.requests["status"] == "finished"]
            values = np.sort(done[f"{key}_s"].dropna().to_numpy(float) * 1000.0)
            values = values[values > 0]
            if len(values):
                st = styles[r.label]
                if not st.get("same_as"):    # (the legend says = or ≈ already otherwise)
                    match = next((f for f, v in drawn if _near(values, v)), None)
                    if match is not None:
                        hidden.append(f"{r.label} ≈ {match}")
                    drawn.append((r.label, values))
                frac = np.arange(1, len(values) + 1) / len(values)
                # a marker at every tenth of the requests: near colours still tell apart
                marks = sorted({min(len(values) - 1, int(f * len(values)))
                                for f in np.arange(0.1, 1.0, 0.2)})
                ax.step(values, frac, where="post", color=st["color"],
                        linestyle=st["linestyle"], linewidth=1.6, marker=st["marker"],
                        markevery=marks, markersize=st["markersize"],
                        markerfacecolor=st["markerfacecolor"] or st["color"])
        if slo.get(f"{key}_ms"):
            ax.axvline(slo[f"{key}_ms"], color=SLO_COLOR, linestyle=":", linewidth=1.5)
        if hidden:      # too close to tell apart in this panel alone: said where it happens
            ax.text(0.98, 0.03, "here " + "; ".join(hidden), transform=ax.transAxes,
                    ha="right", va="bottom", fontsize=8, wrap=True)
        ax.set_xscale("log")
        _log_axis(ax, "x")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(f"{name} (ms, log scale)")
        ax.set_ylabel("fraction of finished requests")
        ax.set_title(f"{name} CDF")
    handles = []
    for r in runs:
        rejected = r.summary.get("num_rejected") or 0
        label = legend_label(r.label, styles[r.label]) + (f" ({rejected} rejected)"
                                                          if rejected else "")
        st = styles[r.label]
        handles.append(Line2D([], [], color=st["color"], linestyle=st["linestyle"],
                              marker=st["marker"], markersize=st["markersize"],
                              markerfacecolor=st["markerfacecolor"] or st["color"],
                              label=label))
    if any(slo.get(f"{k}_ms") for k, _ in LATENCIES):
        handles.append(Line2D([], [], color=SLO_COLOR, linestyle=":", label="SLO limit"))
    fig.suptitle(title or "Latency distributions")
    _legend(fig, handles)
    return fig


BARS = (
    ("request_throughput", "Request throughput", "req/s", 1.0),
    ("request_goodput", "Goodput (meeting SLO)", "req/s", 1.0),
    ("slo_attainment", "SLO attainment", "%", 100.0),
    ("p99_ttft_ms", "p99 TTFT", "ms", 1.0),
    ("p99_tpot_ms", "p99 TPOT", "ms", 1.0),
    ("total_preemptions", "Preemptions", "count", 1.0),
)


@_styled
def policy_bars(runs: RunData | Sequence[RunData], title: str = "") -> Figure:
    """Headline metrics side by side, one bar per run in its policy's colour."""
    runs = _expect_list("policy_bars", "runs", runs, RunData)
    fig, axes = _figure(12, 6.5, 2, 3)
    styles = _run_styles(runs)
    labels = [r.label for r in runs]
    x = np.arange(len(runs))
    many = len(runs) > 4            # labels above the bars turn upright so they cannot overlap
    for ax, (key, name, unit, scale) in zip(axes.flat, BARS):
        values = [r.summary.get(key) for r in runs]
        heights = [scale * v if v is not None else 0.0 for v in values]
        positive = [h for h in heights if h > 0]
        # one run dwarfing the rest (static batching's TTFT): a log axis keeps the others legible
        # (not with zeros, which a log axis cannot show)
        log = (unit != "%" and len(positive) == len(heights) > 1
               and max(positive) / min(positive) > 30)
        bars = ax.bar(x, heights, color=[styles[lb]["color"] for lb in labels],
                      hatch=None, edgecolor="white")
        for bar, lb in zip(bars, labels):
            bar.set_hatch(styles[lb]["hatch"])
        for xi, h, v in zip(x, heights, values):
            ax.annotate("n/a" if v is None else human(v if scale == 1 else h), (xi, h),
                        ha="center",
                        va="bottom", xytext=(0, 2), textcoords="offset points",
                        fontsize=7 if many else 8, rotation=90 if many else 0)
        ax.set_title(name)
        ax.set_ylabel(f"{unit}, log scale" if log else unit)
        # upright names past six bars: slanted ones reach under their neighbours
        ax.set_xticks(x, labels, rotation=90 if len(runs) > 6 else 30 if len(runs) > 3 else 0,
                      ha="right" if 3 < len(runs) <= 6 else "center",
                      rotation_mode="anchor" if 3 < len(runs) <= 6 else "default",
                      fontsize=8 if len(runs) > 6 else None)
        if log:
            ax.set_yscale("log")
            ax.set_ylim(min(positive) / 2, max(positive) * (12 if many else 4))
            _log_axis(ax, "y")
        else:
            ax.set_ylim(0, max(heights + [0.0]) * (1.35 if many else 1.15) or 1.0)
        ax.grid(axis="x", visible=False)
    fig.suptitle(title or ("Policy comparison" if len({r.policy for r in runs}) > 1 else
                           f"Comparison of {len(runs)} {runs[0].policy} runs" if runs else ""))
    return fig


def _integral(start: np.ndarray, end: np.ndarray, values: np.ndarray, at: np.ndarray):
    """∫ v(t) dt from -∞ to each of ``at``, where v = values[k] during step k and 0 between
    steps (steps sorted and disjoint). Piecewise linear: exact at every breakpoint."""
    cum = np.cumsum(values * (end - start))
    t = np.column_stack([start, end]).ravel()
    integral = np.column_stack([np.concatenate([[0.0], cum[:-1]]), cum]).ravel()
    return np.interp(at, t, integral, left=0.0, right=cum[-1] if len(cum) else 0.0)


def _binned(steps: pd.DataFrame, column: str | np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Per time bin, the time average of a step value (zero while idle), summed over replicas."""
    total = np.zeros(len(edges) - 1)
    values = steps[column].to_numpy(float) if isinstance(column, str) else column
    start = steps["start_s"].to_numpy(float)
    end = start + steps["duration_s"].to_numpy(float)
    for idx in steps.groupby("replica").indices.values():
        total += np.diff(_integral(start[idx], end[idx], values[idx], edges))
    return total / np.diff(edges)


@_styled
def timeline(run: RunData, bins: int = 150, title: str = "") -> Figure:
    """One run over time: requests running and waiting, tokens per step (prefill vs decode),
    KV blocks in use, and cumulative preemptions."""
    _expect("timeline", "run", run, RunData)
    if run.steps is None:
        raise SimserveError(f"timeline: run: {run.label} has no per-step table (a long run "
                            "keeps one only when asked: simserve.run(..., keep_steps=True), "
                            "simserve run --steps)")
    steps = run.steps.sort_values(["replica", "start_s"], kind="stable")
    fig, axes = _figure(11, 8.5, 4, 1, sharex=True)
    ax_req, ax_tok, ax_kv, ax_pre = (row[0] for row in axes)
    color = series_styles([(run.label, run.policy)])[run.label]["color"]
    replicas = steps["replica"].nunique()
    if len(steps):
        t_end = float((steps["start_s"] + steps["duration_s"]).max())
        edges = np.linspace(0.0, t_end, min(bins, max(len(steps), 2)) + 1)
        mid = (edges[:-1] + edges[1:]) / 2
        ax_req.plot(mid, _binned(steps, "num_running", edges), color=color, label="running")
        ax_req.plot(mid, _binned(steps, "num_waiting", edges), color="#555555",
                    linestyle="--", label="waiting")
        # tokens per second: a step's tokens spread over its duration, so prefill bursts and
        # the steady decode stream are on one comparable scale
        width = np.maximum(steps["duration_s"].to_numpy(float), 1e-12)
        prefill = steps["num_prefill_tokens"].to_numpy(float)
        decode = steps["num_batched_tokens"].to_numpy(float) - prefill
        ax_tok.stackplot(mid, _binned(steps, decode / width, edges),
                         _binned(steps, prefill / width, edges), colors=["#bbbbbb", color],
                         labels=["decode tokens", "prefill tokens"], alpha=0.85)
        ax_kv.plot(mid, _binned(steps, "kv_blocks_used", edges), color=color,
                   label="KV blocks used")
        capacity = steps.groupby("replica")["kv_blocks_total"].max().sum()
        ax_kv.axhline(capacity, color=TARGET_COLOR, linestyle="-.", linewidth=1,
                      label=f"capacity ({capacity:,} blocks)")
        end = (steps["start_s"] + steps["duration_s"]).to_numpy(float)
        order = np.argsort(end, kind="stable")
        ax_pre.step(np.concatenate([[0.0], end[order]]),
                    np.concatenate([[0], np.cumsum(steps["num_preempted"].to_numpy()[order])]),
                    where="post", color=color, label="preemptions (cumulative)")
    ax_req.set_ylabel("requests")
    ax_tok.set_ylabel("batched tokens/s")
    ax_kv.set_ylabel("KV blocks")
    ax_pre.set_ylabel("preemptions")
    ax_pre.set_xlabel("simulated time (s)")
    for ax in (ax_req, ax_tok, ax_kv, ax_pre):
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], 1.0))
        ax.legend(loc="best", frameon=False)
    ax_pre.set_xlim(left=0)
    where = f"sum over {replicas} replicas" if replicas > 1 else "one replica"
    ax_req.set_title(title or f"{run.label} ({run.policy}): timeline, {where}, "
                              f"{len(edges) - 1 if len(steps) else 0} time bins")
    return fig


# --- capacity --------------------------------------------------------------------------------

@_styled
def capacity_attainment(cap: CapacityData, title: str = "") -> Figure:
    """SLO attainment of every probe against rate: the target, the answer and its bracket;
    and, when a target rate was given, attainment against replica count."""
    _expect("capacity_attainment", "cap", cap, CapacityData)
    a, probes = cap.answer, cap.probes
    by_rate = probes[probes["replicas"] == a["replicas"]]
    # the replica search may reuse a rate-search run at the target rate: take every such run
    by_replicas = probes[probes["rate"] == a["target_rate"]] \
        if (probes["phase"] == "replicas").any() else probes.iloc[:0]
    cols = 2 if len(by_replicas) else 1
    fig, axes = _figure(7 * cols, 4.5, 1, cols)
    color = series_styles([(cap.label, a.get("policy", "?"))])[cap.label]["color"]
    target = 100 * a["target_attainment"]
    ax = axes[0][0]
    ax.scatter(by_rate["rate"], 100 * by_rate["slo_attainment"], color=color, alpha=0.6,
               s=25, label="one probe (one seed)")
    worst = by_rate.groupby("rate")["slo_attainment"].min()
    ax.plot(worst.index, 100 * worst, color=color, linewidth=1.2,
            label=f"{a.get('aggregate', 'min')} over seeds")
    ax.axhline(target, color=TARGET_COLOR, linestyle="-.", linewidth=1,
               label=f"target ({target:.0f}%)")
    ax.axvspan(a["max_rate"], a["first_failing_rate"], color=color, alpha=0.15,
               label="final bracket")
    ax.axvline(a["max_rate"], color=color, linestyle=(0, (2, 2)))
    ax.annotate(f"max rate {a['max_rate']:.3g} req/s\n({a['per_gpu_rate']:.3g} per GPU)",
                (a["max_rate"], 0.05), xycoords=("data", "axes fraction"), xytext=(-6, 0),
                textcoords="offset points", ha="right", fontsize=9, color=color)
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel("SLO attainment (%)")
    ax.set_ylim(0, 105)
    ax.set_xlim(left=0)
    ax.set_title(title or f"{cap.label}: SLO attainment vs rate")
    ax.legend(loc="center left", frameon=False)
    if cols == 2:
        ax = axes[0][1]
        ax.scatter(by_replicas["replicas"], 100 * by_replicas["slo_attainment"], color=color,
                   alpha=0.6, s=25, label="one probe (one seed)")
        ax.axhline(target, color=TARGET_COLOR, linestyle="-.", linewidth=1,
                   label=f"target ({target:.0f}%)")
        if a.get("replicas_needed"):
            ax.axvline(a["replicas_needed"], color=color, linestyle=(0, (2, 2)),
                       label=f"fewest replicas: {a['replicas_needed']}")
        ax.set_xlabel("replicas")
        ax.set_ylabel("SLO attainment (%)")
        ax.set_ylim(0, 105)
        ax.set_xlim(0, by_replicas["replicas"].max() + 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_title(f"at the target rate {a['target_rate']:g} req/s")
        ax.legend(loc="lower right", frameon=False)
    return fig


# --- plan --------------------------------------------------------------------------------------

@_styled
def plan_pareto(plan: PlanData, title: str = "") -> Figure:
    """Output tokens/s per GPU against tokens/s per user (1 / median TPOT) of every simulated
    candidate at its max rate, by hardware; the Pareto frontier joined, the cheapest ringed."""
    _expect("plan_pareto", "plan", plan, PlanData)
    a, t = plan.answer, plan.table
    pts = t[t[PARETO_X].notna() & t[PARETO_Y].notna()] if PARETO_X in t else t.iloc[:0]
    fig, axes = _figure(8, 5)
    ax = axes[0][0]
    cards = sorted(pts["hardware"].unique()) if len(pts) else []
    styles = series_styles([(c, c) for c in cards])
    for card in cards:
        own = pts[pts["hardware"] == card]
        colo = own["mode"] == "colocated"
        ax.scatter(own.loc[colo, PARETO_X], own.loc[colo, PARETO_Y], s=28, alpha=0.7,
                   color=styles[card]["color"], marker="o", label=f"{card} colocated")
        if (~colo).any():
            ax.scatter(own.loc[~colo, PARETO_X], own.loc[~colo, PARETO_Y], s=34, alpha=0.7,
                       color=styles[card]["color"], marker="^",
                       label=f"{card} disaggregated")
    front = t.set_index("candidate").loc[a.get("pareto") or []]
    if len(front):
        front = front.sort_values(PARETO_X)
        ax.plot(front[PARETO_X], front[PARETO_Y], color="black", linewidth=1, marker=".",
                label="Pareto frontier")
    w = a.get("winner")
    if w is not None and w in set(pts["candidate"]):
        row = t.set_index("candidate").loc[w]
        ax.scatter([row[PARETO_X]], [row[PARETO_Y]], s=160, facecolors="none",
                   edgecolors=TARGET_COLOR, linewidths=1.8,
                   label=f"cheapest for {a['target_rate']:g} req/s")
        ax.annotate(str(row["deployment"]), (row[PARETO_X], row[PARETO_Y]), xytext=(8, 6),
                    textcoords="offset points", fontsize=8)
    ax.set_xlabel("tokens/s per user (1000 / median TPOT ms, at max rate)")
    ax.set_ylabel("output tokens/s per GPU (at max rate)")
    ax.set_ylim(bottom=0)
    ax.set_title(title or f"{plan.label}: throughput per GPU vs speed per user")
    if len(pts):
        ax.legend(loc="best", frameon=False, fontsize=8)
    else:                           # (no candidate sustained a load: nothing to plot)
        ax.text(0.5, 0.5, "no simulated deployment sustained any load", ha="center",
                va="center", transform=ax.transAxes)
    return fig
