"""Assemble figures and tables into ``report.html`` plus ``figures/*.png`` (and ``.svg``).

Sections, in order: plans, capacity answers, sweeps, then the runs (a comparison when there are
several). Nothing in the page depends on the clock, so the same inputs give the same report.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import pandas as pd
import yaml
from matplotlib.figure import Figure

from simserve.errors import SimserveError
from simserve.fmt import attainment_percent
from simserve.paths import make_out_dir, clear_report
from simserve.report import figures as F
from simserve.report import html as H
from simserve.report.load import (CapacityData, Inputs, PlanData, RunData, SweepData,
                                  load_inputs)
from simserve.report.style import HATCHES, RC

HEADLINE = {
    "completed": "completed", "num_rejected": "rejected", "request_throughput": "req/s",
    "request_goodput": "goodput req/s", "slo_attainment": "SLO attainment",
    "output_throughput": "out tok/s", "median_ttft_ms": "TTFT p50 ms", "p99_ttft_ms": "TTFT p99 ms",
    "median_tpot_ms": "TPOT p50 ms", "p99_tpot_ms": "TPOT p99 ms", "median_e2el_ms": "E2EL p50 ms",
    "p99_e2el_ms": "E2EL p99 ms", "total_preemptions": "preemptions",
    "mean_kv_utilization": "mean KV use", "prefix_cache_hit_rate": "prefix cache hit rate",
}


@dataclass
class Section:
    title: str
    blocks: list[str] = field(default_factory=list)                     # HTML before figures
    figures: list[tuple[str, str, Figure]] = field(default_factory=list)  # name, caption, fig
    after: list[str] = field(default_factory=list)                      # HTML after figures


def write_report(paths: str | Path | Sequence[str | Path], out: str | Path | None = None, *,
                 svg: bool = False, title: str | None = None) -> Path:
    """Build the report of run/compare/sweep/capacity directories; returns report.html's path.
    ``paths``: one directory, or a list of them. ``out`` defaults to the one directory given
    (a report of several needs ``out``)."""
    # one directory is a list of one, not a string's characters
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    if not paths:
        raise SimserveError("report: give at least one run directory")
    if not isinstance(paths, Sequence) or isinstance(paths, bytes):
        raise SimserveError(f"report: paths: expected a directory or a list of them, got "
                            f"{type(paths).__name__}")
    for i, p in enumerate(paths):
        if not isinstance(p, (str, os.PathLike)):
            raise SimserveError(f"report: paths[{i}]: expected a directory (a str or Path), "
                                f"got {type(p).__name__}")
    if out is None:
        if len(paths) > 1:      # (the CLI's --out is write_report's out)
            raise SimserveError("report: several directories given; say where the report goes "
                                "with out=DIR (on the command line, --out DIR)")
        out = paths[0]
    elif not isinstance(out, (str, os.PathLike)):
        raise SimserveError(f"report: out: expected a directory (a str or Path), got "
                            f"{type(out).__name__}")
    inputs = load_inputs(paths)
    if title is None:
        title = "simserve report: " + ", ".join(Path(p).resolve().name for p in paths)
    return render(inputs, out, svg=svg, title=title)


def render(inputs: Inputs, out: str | Path, *, svg: bool = False, title: str = "") -> Path:
    out = Path(out)
    fig_dir = out / "figures"
    if (out / "report.html").is_file():     # a report written here before: none of its
        clear_report(out)                   # figures may outlive it beside the new one
    make_out_dir(out, fig_dir)
    sections = [*map(plan_section, inputs.plans), *map(capacity_section, inputs.capacities),
                *map(sweep_section, inputs.sweeps)]
    if inputs.runs:
        sections.append(runs_section(inputs.runs))
    blocks = [H.paragraph(_provenance(inputs), "meta")]
    used: set[str] = set()
    for sec in sections:
        blocks.append(H.heading(sec.title))
        blocks.extend(sec.blocks)
        for name, caption, fig in sec.figures:
            name = _unique(_slug(name), used)
            png = _save(fig, fig_dir / name, svg)
            blocks.append(H.figure(png, caption, alt=caption.split(".")[0]))
        blocks.extend(sec.after)
    path = out / "report.html"
    path.write_text(H.page(title, blocks))
    return path


def _save(fig: Figure, stem: Path, svg: bool) -> bytes:
    buf = io.BytesIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
        # the suffix is added, not swapped: a stem such as "timeline_x+scheduler.policy_sarathi"
        # has a dot, and with_suffix would cut it there (two runs' figures, one file)
        if svg:
            fig.savefig(stem.with_name(stem.name + ".svg"), format="svg", metadata={"Date": None})
    png = buf.getvalue()
    stem.with_name(stem.name + ".png").write_bytes(png)
    return png


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "figure"


def _unique(name: str, used: set[str]) -> str:
    candidate, k = name, 2
    while candidate in used:
        candidate, k = f"{name}_{k}", k + 1
    used.add(candidate)
    return candidate


def _provenance(inputs: Inputs) -> str:
    models = sorted({r.summary.get("latency_model") for r in inputs.runs
                     if r.summary.get("latency_model")} |
                    {str(m) for t in [*(s.table for s in inputs.sweeps),
                                      *(c.probes for c in inputs.capacities)]
                     if "latency_model" in t for m in t["latency_model"].dropna().unique()})
    parts = [f"{len(inputs.runs)} run(s), {len(inputs.sweeps)} sweep(s), "
             f"{len(inputs.capacities)} capacity search(es)"
             + (f", {len(inputs.plans)} plan(s)." if inputs.plans else ".")]
    if models:
        parts.append("Step latency: " + "; ".join(models) + ".")
    # each run's trust lines; said once when every run says the same, else each with its run
    from simserve.latency.trust import run_trust_lines
    said = {r.label: run_trust_lines(r.summary) for r in inputs.runs}
    if len({tuple(v) for v in said.values()}) == 1:
        parts.extend(next(iter(said.values()), []))
    else:
        parts.extend(f"{label}: {line}" for label, lines in said.items() for line in lines)
    return " ".join(parts)


def _slo_words(slo: dict) -> str:
    limits = [f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items()
              if k.endswith("_ms") and v is not None]
    return ", ".join(limits) if limits else "no SLO"


# --- sections ----------------------------------------------------------------------------------

def plan_section(plan: PlanData) -> Section:
    a, t = plan.answer, plan.table
    sec = Section(f"Plan: {plan.label}")
    pruned = ", ".join(f"{k} {v}" for k, v in (a.get("pruned") or {}).items())
    sec.blocks.append(H.paragraph(
        f"{a['candidates']} candidate deployments of {a['model']} for {a['target_rate']:g} "
        f"req/s ({_slo_words(a.get('slo') or {})}, attainment "
        f"{(a.get('slo') or {}).get('attainment', 0):.0%}); pruned by bound: {pruned}; "
        f"simulated {a['simulated']}."))
    w = a.get("winner_row")
    if a.get("met") and w:
        sec.blocks.append(H.paragraph(
            f"Cheapest: {w['deployment']} (max_num_batched_tokens "
            f"{w['max_num_batched_tokens']}, max_num_seqs {w['max_num_seqs']}) × "
            f"{w['replicas']} replica(s) = {w['gpus']} GPU(s), ${w['cost_per_hour']:.2f}/hour, "
            f"${w['cost_per_million_output_tokens']:.3f} per million output tokens.", "answer"))
        sec.blocks.append(H.paragraph("vllm serve: " + " | ".join(a.get("vllm_serve") or [])))
    else:
        sec.blocks.append(H.paragraph("No deployment meets the SLOs at this rate; the closest "
                                      "are listed below.", "answer"))
    ids = [a["winner"], *(a.get("runners_up") or [])] if a.get("met") else a.get("closest") or []
    cols = [c for c in ("candidate", "deployment", "max_num_batched_tokens", "max_num_seqs",
                        "replicas", "gpus", "cost_per_hour", "cost_per_million_output_tokens",
                        "max_rate_per_copy", "status") if c in t]
    if not a.get("met"):            # none serves the rate: how each does alone instead
        cols = [c for c in cols if c not in ("replicas", "gpus", "cost_per_hour",
                                             "cost_per_million_output_tokens")]
        cols[4:4] = [c for c in ("lone_ttft_ms", "lone_tpot_ms") if c in t]
    if "short_probe" in t:
        t = t.assign(status=t["status"].where(~t["short_probe"].fillna(False).astype(bool),
                                              t["status"] + " (short probe)"))
    ranked = t.set_index("candidate", drop=False).loc[ids, cols] if ids else t.iloc[:0][cols]
    for col in ("replicas", "gpus", "max_num_batched_tokens", "max_num_seqs"):
        if col in ranked:           # (counts: read back from CSV as floats where some are NaN)
            ranked[col] = ranked[col].astype("Int64")
    sec.after += [H.heading("Cheapest and runners-up" if a.get("met") else "Closest", 3),
                  H.table(ranked.reset_index(drop=True), index=False)]
    if a.get("assumed"):
        sec.blocks.append(H.bullets("Assumed:", a["assumed"]))
    for note in a.get("notes") or []:
        sec.blocks.append(H.paragraph(f"Note: {note}"))
    sec.figures.append((f"{plan.label}_pareto", "Output tokens/s per GPU against tokens/s per "
                        "user of every simulated deployment at its max rate; the line is the "
                        "Pareto frontier, the ring the cheapest deployment for the target.",
                        F.plan_pareto(plan)))
    return sec


def capacity_section(cap: CapacityData) -> Section:
    a = cap.answer
    sec = Section(f"Capacity: {cap.label}")
    answer = (f"Highest rate meeting {a['target_attainment']:.0%} SLO attainment "
              f"({_slo_words(a.get('slo') or {})}): {a['max_rate']:.3g} req/s on "
              f"{a['replicas']} replica(s) × TP {a['tensor_parallel_size']}"
              + (f" × PP {a['pipeline_parallel_size']}" if a.get('pipeline_parallel_size')
                 else "")
              + f" ({a['per_gpu_rate']:.3g} req/s per GPU).")
    if a.get("target_rate") is not None:
        need = a.get("replicas_needed")
        answer += (f" Serving {a['target_rate']:g} req/s takes "
                   + (f"{need} replica(s) "
                      f"({need * a['tensor_parallel_size'] * a.get('pipeline_parallel_size', 1)}"
                      " GPU(s))."
                      if need else "more replicas than were tried."))
    sp = a["spread"]
    sec.blocks += [
        H.paragraph(answer, "answer"),
        H.paragraph(f"Bracketing search then bisection to {a['tolerance']:.0%} relative "
                    f"tolerance; the target is missed at {a['first_failing_rate']:.3g} req/s. "
                    f"A rate passes when the {a.get('aggregate', 'min')} attainment over "
                    f"{len(a['seeds'])} seed(s) meets the target; at the answer the seeds "
                    f"attain min {sp['min']:.1%}, mean {sp['mean']:.1%}, max {sp['max']:.1%}."),
    ]
    probes = cap.probes.assign(policy=a.get("policy", "?"))
    by_rate = probes[probes["replicas"] == a["replicas"]]
    g = by_rate.groupby("rate")["slo_attainment"]
    table = pd.DataFrame({"seeds run": g.size(), "min attainment": g.min(),
                          "mean attainment": g.mean(), "max attainment": g.max()})
    table["meets target"] = table["min attainment"] >= a["target_attainment"]
    table.index.name = "rate (req/s)"
    sec.after += [H.heading("Probes: rate → attainment", 3), H.table(table.reset_index(),
                                                                     index=False)]
    for note in a.get("notes") or []:
        sec.blocks.append(H.paragraph(f"Note: {note}"))
    curves = F.load_curves(by_rate, "rate", default_label=cap.label)
    sec.figures += [
        (f"{cap.label}_attainment", "SLO attainment of every probe against request rate; the "
         "dash-dot line is the target, the shaded band the final bracket, the dashed line the "
         "answer.", F.capacity_attainment(cap)),
        (f"{cap.label}_throughput", "Throughput and goodput against offered load (mean over "
         "seeds), with SLO attainment below; the knee is the capacity found.",
         F.throughput_vs_load(curves, target=a["target_attainment"],
                              knees={cap.label: a["max_rate"]})),
        (f"{cap.label}_latency", "Median and p99 latencies against offered load; dotted red "
         "lines are the SLO limits.", F.latency_vs_load(curves, slo=a.get("slo"))),
    ]
    return sec


def sweep_axes(sweep: SweepData) -> tuple[str | None, str, list[str], bool]:
    """(x column, x label, series columns, draw served = offered) for a sweep's load plots."""
    t = sweep.table
    cols = list(t.columns)
    fields = cols[cols.index("point") + 1: cols.index("policy")] if \
        "point" in cols and "policy" in cols else sweep.fields
    varying = [f for f in fields if f in t and t[f].nunique(dropna=False) > 1]
    if "workload.rate" in varying:
        x, label, diagonal = "workload.rate", "offered load (req/s)", True
    else:
        numeric = [f for f in varying if f != "seed" and pd.api.types.is_numeric_dtype(t[f])]
        x, label, diagonal = (numeric[0] if numeric else None), (numeric[0] if numeric else ""), \
            False
    series = [f for f in varying if f not in (x, "seed")]
    return x, label, series, diagonal


def sweep_section(sweep: SweepData) -> Section:
    t = sweep.table
    sec = Section(f"Sweep: {sweep.label}")
    failed = t[t["error"].notna()] if "error" in t else t.iloc[:0]
    x, x_label, series, diagonal = sweep_axes(sweep)
    sec.blocks.append(H.paragraph(
        f"{len(t)} points ({len(failed)} failed); SLO: {_slo_words(sweep.slo)}."
        + (f" Curves over {x}, one per {', '.join(series)}." if x and series else "")))
    target = None
    if "slo_attainment_target" in t and t["slo_attainment_target"].notna().any():
        target = float(t["slo_attainment_target"].dropna().iloc[0])
    if x is not None and len(t) > len(failed):
        curves = F.load_curves(t, x, series, default_label=sweep.label)
        sec.figures += [
            (f"{sweep.label}_throughput", "Throughput and goodput against "
             f"{x_label}, with SLO attainment below (shaded: spread over seeds); the knee is "
             "the highest load at which every lower point meets the attainment target.",
             F.throughput_vs_load(curves, x_label=x_label, target=target, diagonal=diagonal)),
            (f"{sweep.label}_latency", f"Median and p99 latencies against {x_label}; dotted "
             "red lines are the SLO limits.",
             F.latency_vs_load(curves, x_label=x_label, slo=sweep.slo)),
        ]
    shown = [c for c in t.columns if c in ("point", "policy", "offered_rate", "error")
             or c in sweep.fields or c in HEADLINE]
    sec.after += [H.heading("Points", 3),
                  H.table(t[shown].rename(columns=HEADLINE), index=False)]
    for _, row in failed.iterrows():
        sec.after.append(H.paragraph(f"Point {row['point']} failed: {row['error']}"))
    return sec


def runs_section(runs: list[RunData]) -> Section:
    several = len(runs) > 1
    one_policy = len({r.policy for r in runs}) == 1
    sec = Section(f"Run: {runs[0].label}" if not several else
                  f"Comparison of {len(runs)} {runs[0].policy} runs" if one_policy else
                  "Policy comparison")
    slo = runs[0].slo
    sec.blocks.append(H.paragraph(
        f"SLO: {_slo_words(slo)}, attainment target {slo.get('attainment', 0.9):.0%}."
        if slo else "No SLO given."))
    overridden = {r.label: r.overrides for r in runs if r.overrides}
    if overridden:             # what made these runs differ from their scenario files
        shared = set.intersection(*(set(o) for o in overridden.values()))
        if len(overridden) == len(runs) and all(set(o) == shared for o in overridden.values()):
            sec.blocks.append(H.paragraph("Overrides: " + " ".join(
                f"--set {o}" for o in overridden[runs[0].label]) + "."))
        else:
            for label, o in overridden.items():
                sec.blocks.append(H.paragraph(f"Overrides of {label}: "
                                              + " ".join(f"--set {x}" for x in o) + "."))
    rows = {r.label: {"policy": r.policy, **{HEADLINE[k]: r.summary.get(k) for k in HEADLINE}}
            for r in runs}
    table = attainment_percent(pd.DataFrame.from_dict(rows, orient="index"))
    sec.blocks.append(H.table(table if several else table.T))
    sec.figures.append(("latency_cdf", "Per-request latency CDFs (finished requests); dotted "
                        "red lines are the SLO limits.", F.latency_cdfs(runs)))
    if several:
        sec.figures.append(("policy_bars", "Headline metrics side by side, one colour per "
                            "policy" + ("; runs of one policy differ by hatch." if one_policy
                                        and len(runs) <= len(HATCHES) else "."),
                            F.policy_bars(runs)))
    for r in runs:
        if r.steps is None:
            sec.blocks.append(H.paragraph(
                f"No timeline for {r.label}: the run wrote no per-step table (a long run "
                "writes steps.csv only when asked: simserve run --steps)."))
            continue
        if not len(r.steps):
            sec.blocks.append(H.paragraph(
                f"No timeline for {r.label}: its per-step table has no steps (a replay of a "
                "live server sees only its requests, not the engine's steps)."))
            continue
        sec.figures.append((f"timeline_{r.label}", f"{r.label}: requests running and "
                            "waiting, tokens per step (prefill vs decode), KV blocks in use, "
                            "and preemptions over simulated time.", F.timeline(r)))
    for r in runs:
        sec.after.append(H.details(f"scenario: {r.label}",
                                   yaml.safe_dump(r.scenario, sort_keys=False)))
    return sec
