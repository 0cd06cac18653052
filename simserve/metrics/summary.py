"""One run's headline numbers, with the meaning ``vllm bench serve`` gives them.

Every metric is defined once, with notation, in ``docs/metrics.md``; the names below follow it.
NumPy only: the tables come in as columns (a mapping of column name to array, as
``runner.collect`` hands them over) or as a pandas DataFrame (a replayed run, a table read
back), read one column at a time, so a run whose caller needs only the summary (a capacity
search, a sweep) never imports pandas.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Union

import numpy as np

from simserve.metrics.arith import dot
from simserve.metrics.levels import replica_chunks
from simserve.metrics.sample import WeightedSample
from simserve.metrics.sketch import LogHistogram
from simserve.metrics.slo import SloConfig

if TYPE_CHECKING:
    import pandas as pd

# A table: its columns by name (NumPy arrays, or anything ``np.asarray`` takes: a DataFrame's
# Series); every column as long as the others.
Table = Union[Mapping[str, Any], "pd.DataFrame"]

MS_PER_S = 1000.0


def tpot(ttft: np.ndarray, e2el: np.ndarray, out: np.ndarray,
         finished: np.ndarray | None = None) -> np.ndarray:
    """Each request's time per output token, as ``vllm bench serve`` defines it: TPOT =
    (E2EL − TTFT) / (output tokens − 1), for a (finished) request with more than one output
    token; NaN for the others. The one place it is computed (runs, replays, summaries)."""
    some = out > 1 if finished is None else finished & (out > 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(some, (e2el - ttft) / (out - 1), math.nan)
LATENCIES = ("ttft", "tpot", "itl", "e2el")


def summarize(requests: Table, token_times: Sequence[np.ndarray] | None,
              steps: Table | None, slo: SloConfig = SloConfig(),
              percentiles: Sequence[float] = (50, 90, 99),
              itl: WeightedSample | LogHistogram | None = None,
              class_slos: Mapping[str, SloConfig] | None = None,
              prefix_caching: bool = False,
              levels: Callable[[float, float], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Summarise a run as a flat, JSON-serialisable dict (NaN becomes None).

    ``requests`` (and ``steps``): a table, its columns by name (``runner.REQUEST_COLUMNS``,
    ``recorder.STEP_COLUMNS``) as arrays or a DataFrame; ``steps`` is read only without
    ``levels`` (a callable giving the time-weighted levels over a window).

    ITL comes from ``token_times`` (every token's time, per request) or, equivalently and
    without per-token arrays, from ``itl`` as a :class:`WeightedSample` of gaps (or, for a
    long run, a :class:`LogHistogram` of them: percentiles within 0.5 %, metrics.sketch).
    With ``class_slos`` (request classes present: the ``class`` column) each request is judged
    by its class's SLO (``slo`` for classes not in the mapping) and ``per_class`` breaks the
    numbers down by class; with ``prefix_caching`` the prefix-cache hit rate is added.
    """
    status = column(requests, "status")
    num_requests = len(status)
    if itl is None and (token_times is None or len(token_times) != num_requests):
        raise ValueError("token_times must have one entry per request (or pass itl)")
    finished = np.asarray(status == "finished", dtype=bool)
    num_done = int(finished.sum())

    def done(name: str, dtype: Any = None) -> np.ndarray:
        """A column over the finished requests (one column copied at a time, never the
        table: a run of millions of requests)."""
        values: np.ndarray = column(requests, name, dtype)[finished]
        return values

    # Per finished request i: TTFT_i, E2EL_i, and TPOT_i for out_i > 1.
    arrival = done("arrival_s", float)
    ttft = done("first_token_s", float) - arrival
    e2el = done("finish_s", float) - arrival
    out = done("num_output_tokens", int)
    tpots = tpot(ttft, e2el, out)[out > 1]
    itl_values: WeightedSample | LogHistogram | np.ndarray
    if itl is None:
        assert token_times is not None          # checked above
        gaps = [np.diff(np.asarray(t, float)) for t, ok in zip(token_times, finished) if ok]
        itl_values = np.concatenate(gaps) if gaps else np.empty(0)
    else:
        itl_values = itl

    # The benchmark runs from the first send to the last completion.
    t0 = float(np.nanmin(column(requests, "arrival_s", float))) if num_requests else 0.0
    t1 = float(done("finish_s").max()) if num_done else t0
    duration = t1 - t0

    def per_s(x: float) -> float:
        return x / duration if duration > 0 else 0.0

    total_in = int(done("num_prompt_tokens").sum())
    total_out = int(out.sum())
    summary: dict[str, Any] = {
        "num_requests": num_requests,
        "completed": num_done,
        **_by_reason(requests, status, "rejected", "num_rejected", "rejected_by_reason"),
        **_by_reason(requests, status, "failed", "num_failed", "failed_by_reason"),
        "duration_s": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(num_done),
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
    }
    summary.update(_goodput(slo, ttft, e2el, out, num_requests, per_s))
    for name, values in zip(LATENCIES, (ttft, tpots, itl_values, e2el)):
        summary.update(_latency_stats(name, values, percentiles))
    # the papers' run-level numbers: mean E2EL per output token; arrival -> first scheduled
    norm = e2el / np.maximum(out, 1)
    summary["mean_normalized_latency_ms"] = float(norm.mean()) * MS_PER_S if len(norm) else None
    delay = (done("first_scheduled_s", float) - arrival) if num_done else np.empty(0)
    delay = delay[~np.isnan(delay)]            # a replayed run has no scheduling times
    for key, q in (("median", 50), ("p99", 99)):
        summary[f"{key}_scheduling_delay_ms"] = \
            percentile(delay, q) * MS_PER_S if len(delay) else None
    summary["total_preemptions"] = int(column(requests, "num_preemptions").sum())
    if callable(levels):
        summary.update(levels(t0, t1))
    else:
        if steps is None:
            raise ValueError("steps must be given (or pass levels)")
        summary.update(_levels(steps, _replicas(requests, steps), t0, t1))
    if class_slos is not None:
        summary.update(_by_class(requests, class_slos, slo, per_s, percentiles))
    if slo.has_aggregates:                     # after the per-class verdict, which they join
        summary.update(_aggregates(slo, itl_values, norm, delay, summary))
    if prefix_caching:
        summary.update(_prefix_cache(done("num_cached_tokens"), done("num_prompt_tokens")))
    return {k: _plain(v) for k, v in summary.items()}


def column(table: Table, name: str, dtype: Any = None) -> np.ndarray:
    """One column of a table as an array (no copy where it has that dtype already)."""
    values: np.ndarray = np.asarray(table[name], dtype=dtype)
    return values


def _missing(v: Any) -> bool:
    """None, NaN or pandas' NA: what ``Series.value_counts`` leaves out."""
    return v is None or (isinstance(v, float) and math.isnan(v)) or type(v).__name__ == "NAType"


def _by_reason(requests: Table, status: np.ndarray, which: str, count: str,
               by_reason: str) -> dict[str, Any]:
    """Requests of status ``which`` (rejected; failed: lost to a replica failure), counted
    and by ``reject_reason``."""
    mask = np.asarray(status == which, dtype=bool)
    reasons = Counter(v for v in column(requests, "reject_reason")[mask].tolist()
                      if not _missing(v))
    return {count: int(mask.sum()),
            by_reason: {str(k): int(v) for k, v in sorted(reasons.items())}}


def _good(arrival: np.ndarray, first: np.ndarray, finish: np.ndarray, out: np.ndarray,
          slo: SloConfig) -> np.ndarray:
    """Finished requests (their arrival, first token and finish times, output tokens) within
    every limit of ``slo`` (as ``_goodput``)."""
    ttft = first - arrival
    e2el = finish - arrival
    tpot_or_zero = np.where(out > 1, tpot(ttft, e2el, out), 0.0)
    good = np.ones(len(out), dtype=bool)
    for values, limit_ms in ((ttft, slo.ttft_ms), (tpot_or_zero, slo.tpot_ms),
                             (e2el, slo.e2el_ms)):
        if limit_ms is not None:
            good &= values <= limit_ms / MS_PER_S
    return good


def _by_class(requests: Table, class_slos: Mapping[str, SloConfig], slo: SloConfig,
              per_s: Callable[[float], float], percentiles: Sequence[float]
              ) -> dict[str, Any]:
    """Goodput with each request judged by its class's SLO, and the headline numbers per class.

    The overall goodput keys are replaced (a request is good when it meets its own class's
    limits); they stay None when no class and not the scenario give any limit.
    """
    klass = column(requests, "class").astype(str)
    finished = np.asarray(column(requests, "status") == "finished", dtype=bool)
    arrival, first = column(requests, "arrival_s", float), column(requests, "first_token_s", float)
    finish, tokens = column(requests, "finish_s", float), column(requests, "num_output_tokens", int)
    tpot_all, priority = column(requests, "tpot_s", float), column(requests, "priority")
    per_class: dict[str, dict[str, Any]] = {}
    total_good, any_limits = 0, not slo.is_empty
    for name in sorted(set(klass.tolist())):
        rows = klass == name
        done = rows & finished
        num_rows = int(rows.sum())
        own = class_slos.get(name, slo)
        any_limits = any_limits or not own.is_empty
        num_good = int(_good(arrival[done], first[done], finish[done], tokens[done], own).sum())
        total_good += num_good
        ttft = first[done] - arrival[done]
        tpots = tpot_all[done]
        stats: dict[str, Any] = {"num_requests": num_rows, "completed": int(done.sum()),
                 "priority": int(priority[rows].min()) if num_rows else 0}
        if not own.is_empty:
            stats.update(num_good=num_good, slo_attainment=num_good / num_rows,
                         request_goodput=per_s(num_good))
        stats.update(_latency_stats("ttft", ttft, percentiles))
        stats.update(_latency_stats("tpot", tpots[~np.isnan(tpots)], percentiles))
        per_class[name] = {k: _plain(v) for k, v in stats.items()
                           if not k.startswith(("std_", "median_"))}
    out: dict[str, Any] = {"per_class": per_class}
    if any_limits:
        attainment = total_good / len(klass) if len(klass) else None
        out.update(request_goodput=per_s(total_good), num_good=total_good,
                   slo_attainment=attainment, slo_attainment_target=slo.attainment,
                   slo_met=attainment is not None and attainment >= slo.attainment)
    return out


def spec_decode_summary(totals: Mapping[str, int], per_position: Sequence[int],
                        k: int) -> dict[str, Any]:
    """Speculative decoding's counts over every request (``vllm bench serve``'s definitions,
    ``benchmarks/serve.py``), from their totals (``RequestColumns.spec_totals`` and
    ``spec_per_position``): acceptance rate = accepted / draft tokens, acceptance length =
    1 + accepted / drafts (a draft: one verify step with drafts), per position i the share of
    drafts whose first i+1 tokens were all accepted."""
    drafts = totals["num_drafts"]
    draft_tokens = totals["num_draft_tokens"]
    accepted = totals["num_accepted_tokens"]
    per = [*per_position, *[0] * (k - len(per_position))][:k]
    return {"num_drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
            "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
            "acceptance_length": 1 + accepted / drafts if drafts else 1.0,
            "per_position_acceptance_rate": [a / drafts if drafts else 0.0 for a in per]}


def _prefix_cache(cached: np.ndarray, prompt: np.ndarray) -> dict[str, Any]:
    """Prompt tokens of finished requests found in the prefix cache at first admission."""
    hits = int(cached.sum())
    queries = int(prompt.sum())
    return {"prefix_cache_hit_tokens": hits, "prefix_cache_query_tokens": queries,
            "prefix_cache_hit_rate": hits / queries if queries else 0.0}


def _goodput(slo: SloConfig, ttft: np.ndarray, e2el: np.ndarray, out: np.ndarray,
             num_requests: int, per_s: Callable[[float], float]) -> dict[str, Any]:
    """Good = finished and within every given limit; a one-token request's TPOT counts as 0."""
    keys = ("request_goodput", "num_good", "slo_attainment", "slo_attainment_target", "slo_met")
    if slo.is_empty:
        return dict.fromkeys(keys)
    tpot_or_zero = np.where(out > 1, tpot(ttft, e2el, out), 0.0)
    good = np.ones(len(out), dtype=bool)      # without per-request limits: every finished one
    for values, limit_ms in ((ttft, slo.ttft_ms), (tpot_or_zero, slo.tpot_ms), (e2el, slo.e2el_ms)):
        if limit_ms is not None:
            good &= values <= limit_ms / MS_PER_S
    num_good = int(good.sum())
    # Rejected (and any unfinished) requests were sent, so they count as misses.
    attainment = num_good / num_requests if num_requests else None
    return dict(zip(keys, (per_s(num_good), num_good, attainment, slo.attainment,
                           attainment is not None and attainment >= slo.attainment)))


def _aggregates(slo: SloConfig, itl: Any, norm: np.ndarray, delay: np.ndarray,
                summary: dict[str, Any]) -> dict[str, Any]:
    """The run-level SLO criteria: each measured value, and ``slo_met`` with them all."""
    out: dict[str, Any] = {}
    met = summary.get("slo_met") is not False
    if slo.tbt_ms is not None:
        q = slo.tbt_percentile
        if isinstance(itl, (WeightedSample, LogHistogram)):
            value = itl.percentiles([q])[0] if len(itl) else 0.0
        else:
            value = percentile(itl, q) if len(itl) else 0.0
        out["slo_tbt_ms"] = value * MS_PER_S
        out["slo_tbt_percentile"], out["slo_tbt_limit_ms"] = q, slo.tbt_ms
        met &= out["slo_tbt_ms"] <= slo.tbt_ms
    if slo.scheduling_delay_ms is not None:
        q = slo.scheduling_delay_percentile
        out["slo_scheduling_delay_ms"] = percentile(delay, q) * MS_PER_S \
            if len(delay) else float("inf")
        out["slo_scheduling_delay_percentile"] = q
        out["slo_scheduling_delay_limit_ms"] = slo.scheduling_delay_ms
        met &= out["slo_scheduling_delay_ms"] <= slo.scheduling_delay_ms
    if slo.normalized_latency_ms is not None:
        out["slo_normalized_latency_ms"] = float(norm.mean()) * MS_PER_S if len(norm) \
            else float("inf")
        out["slo_normalized_latency_limit_ms"] = slo.normalized_latency_ms
        met &= out["slo_normalized_latency_ms"] <= slo.normalized_latency_ms
    out["slo_met"] = bool(met)
    return out


def _latency_stats(name: str, values_s: np.ndarray, percentiles: Sequence[float]) -> dict[str, Any]:
    """mean/median/std/pXX in ms; an empty list gives 0.0 (vllm's ``np.mean(x or 0)``)."""
    if isinstance(values_s, (WeightedSample, LogHistogram)) and len(values_s):
        w = values_s
        qs = [50, *percentiles]
        pct = dict(zip(qs, (x * MS_PER_S for x in w.percentiles(qs))))
        stats = {f"mean_{name}_ms": w.mean() * MS_PER_S, f"median_{name}_ms": pct[50],
                 f"std_{name}_ms": w.std() * MS_PER_S}
        for p in percentiles:
            stats[f"p{_pct_word(p)}_{name}_ms"] = pct[p]
        return stats
    x = values_s * MS_PER_S if len(values_s) else np.zeros(1)
    stats = {f"mean_{name}_ms": np.mean(x), f"median_{name}_ms": median(x),
             f"std_{name}_ms": np.std(x)}
    for p in percentiles:
        stats[f"p{_pct_word(p)}_{name}_ms"] = percentile(x, p)
    return stats


# np.median and np.percentile import numpy.ma on first use (np.unique, the NaN check): a
# hundredth of a second of every run's summary. These two give their bits without it
# (tests/unit/test_metrics.py holds them to NumPy's on random samples).

def median(x: np.ndarray) -> Any:
    """``np.median(x)`` of a non-empty 1-D float array: the middle element, or ``np.mean`` of
    the two middle ones; NaN if ``x`` holds one."""
    n = len(x)
    h = n // 2
    part = np.partition(x, [h, -1] if n % 2 else [h - 1, h, -1])
    if math.isnan(part[-1]):
        return part[-1]
    return np.mean(part[h:h + 1] if n % 2 else part[h - 1:h + 1])


def percentile(x: np.ndarray, q: float) -> float:
    """``float(np.percentile(x, q))`` of a non-empty 1-D float array (the linear method, as
    NumPy computes it: the virtual index (n - 1) * (q / 100) and its floor i, the fraction g
    between x(i) and x(i+1), interpolated from the nearer end); NaN if ``x`` holds one."""
    n = len(x)
    v = (n - 1) * (q / 100)
    if v >= n - 1:
        lo = hi = n - 1
        g = v + 1.0                 # (NumPy's index -1: irrelevant, x(i) = x(i+1))
    elif v < 0:
        lo = hi = 0
        g = v
    else:
        lo = math.floor(v)
        hi = lo + 1
        g = v - lo
    part = np.partition(x, sorted({0, lo, hi, n - 1}))
    if math.isnan(part[-1]):
        return math.nan
    a, b = float(part[lo]), float(part[hi])
    d = b - a
    return b - d * (1 - g) if g >= 0.5 else a + d * g


def _pct_word(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def _replicas(requests: Table, steps: Table) -> int:
    ids = set(column(steps, "replica").tolist()) | set(column(requests, "replica").tolist())
    return len({r for r in ids if r >= 0})


def _levels(steps: Table, num_replicas: int, t0: float, t1: float) -> dict[str, Any]:
    """Time-weighted levels over [t0, t1]; a step's values hold over [start, start + duration].

    Idle gaps contribute zero. All replicas share the window, so the sum over replicas of their
    time averages is the pooled integral divided by (t1 - t0); KV use is then averaged per replica.
    """
    width = t1 - t0
    kv_total = column(steps, "kv_blocks_total", float)
    n = len(kv_total)
    kv_frac = np.divide(column(steps, "kv_blocks_used", float), kv_total,
                        out=np.zeros(n), where=kv_total > 0)
    start = column(steps, "start_s", float)
    end = start + column(steps, "duration_s", float)
    overlap = np.clip(end, t0, t1) - np.clip(start, t0, t1)

    def time_avg(values: np.ndarray) -> float:
        return dot(values, overlap) / width if width > 0 and n else 0.0

    return {
        "num_steps": n,
        "mean_running": time_avg(column(steps, "num_running", float)),
        "mean_waiting": time_avg(column(steps, "num_waiting", float)),
        "mean_kv_utilization": time_avg(kv_frac) / num_replicas if num_replicas else 0.0,
        "max_kv_utilization": float(kv_frac.max()) if n else 0.0,
        # (the column's own mean: a DataFrame's Series or an array)
        "mean_batched_tokens": float(steps["num_batched_tokens"].mean()) if n else 0.0,
    }


def grouped_levels(groups: list[dict[str, Any]], t0: float, t1: float,
                   chunk: int | None = None) -> dict[str, Any]:
    """``_levels`` for steps stored in groups (a fast-forwarded stretch is one group of k steps
    sharing every count): the same numbers without expanding every column to every step, and
    in chunks of steps so that a long run needs little extra memory (``metrics.levels``).

    Each item of ``groups`` is one replica: arrays ``start_s``, ``duration_s``,
    ``kv_blocks_used`` per step, and ``num_steps``, ``num_running``, ``num_waiting``,
    ``num_batched_tokens``, ``kv_blocks_total`` per group (any integer type); and, for a long
    run's replica, ``folded``: the ``ChunkSums`` of its steps folded away during the run (the
    chunks before those given).
    """
    width = t1 - t0
    parts = [replica_chunks(g, t0, t1, chunk) if width > 0 else [] for g in groups]
    num_steps = sum(len(g["start_s"]) + sum(c.num_steps for c in g.get("folded", ()))
                    for g in groups)
    if not num_steps or width <= 0:
        return {"num_steps": num_steps, "mean_running": 0.0, "mean_waiting": 0.0,
                "mean_kv_utilization": 0.0, "max_kv_utilization": 0.0,
                "mean_batched_tokens": 0.0}
    running = waiting = kv = batched = 0.0
    kv_max = 0.0
    for chunks in parts:
        for c in chunks:
            running += c.running
            waiting += c.waiting
            kv += c.kv
            kv_max = max(kv_max, c.kv_max)
        batched += float(sum(c.batched for c in chunks))        # may exceed int32
    return {
        "num_steps": num_steps,
        "mean_running": running / width,
        "mean_waiting": waiting / width,
        "mean_kv_utilization": kv / width / len(groups),
        "max_kv_utilization": kv_max,
        "mean_batched_tokens": batched / num_steps,
    }


def _plain(v: Any) -> Any:
    """numpy scalars to Python ones, non-finite floats to None (JSON has no NaN)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(v) else None
    return v


# --- printout ---------------------------------------------------------------------------------

_SECTIONS = (("ttft", "TTFT", "Time to First Token"),
             ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
             ("itl", "ITL", "Inter-token Latency"),
             ("e2el", "E2EL", "End-to-end Latency"))


def format_summary(summary: dict[str, Any], title: str = "Serving Benchmark Result",
                   scheduler: bool = True, subtitle: str = "") -> str:
    """A fixed-width table laid out like ``vllm bench serve``'s printout. ``scheduler=False``
    (a replay's summary: a client sees tokens, not the server's steps, queues or KV cache)
    leaves the scheduler's figures out and says so."""
    lines = [format(f" {title} ", "=^50")]
    if subtitle:                          # what was simulated (model, hardware, load)
        lines.append(subtitle)

    def row(label: str, value: Any, fmt: str = ".2f") -> None:
        if value is None:
            text = "n/a"
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, (int, str)):
            text = str(value)
        else:
            text = format(value, fmt)
        lines.append(f"{label:<40} {text}")

    def section(header: str) -> None:
        lines.append(format(header, "-^50"))

    has_slo = summary.get("slo_attainment_target") is not None
    row("Successful requests:", summary["completed"])
    row("Rejected requests:", summary["num_rejected"])
    for reason, count in summary["rejected_by_reason"].items():
        row(f"  {reason}:", count)
    if summary.get("num_failed"):
        row("Failed requests:", summary["num_failed"])
        for reason, count in summary.get("failed_by_reason", {}).items():
            row(f"  {reason}:", count)
    if summary.get("num_replica_failures"):      # (failure injection: what it did)
        row("Replica failures:", summary["num_replica_failures"])
        row("Retries (requests retried):", f"{summary['num_retries']} "
                                           f"({summary.get('num_retried_requests', 0)})")
    row("Benchmark duration (s):", summary["duration_s"])
    row("Total input tokens:", summary["total_input_tokens"])
    row("Total generated tokens:", summary["total_output_tokens"])
    row("Request throughput (req/s):", summary["request_throughput"])
    if has_slo:
        row("Request goodput (req/s):", summary["request_goodput"])
    row("Output token throughput (tok/s):", summary["output_throughput"])
    row("Total Token throughput (tok/s):", summary["total_token_throughput"])
    for name, short, header in _SECTIONS:
        section(header)
        row(f"Mean {short} (ms):", summary[f"mean_{name}_ms"])
        row(f"Median {short} (ms):", summary[f"median_{name}_ms"])
        for word in _percentile_words(summary, name):
            row(f"P{word} {short} (ms):", summary[f"p{word}_{name}_ms"])
    if "mean_normalized_latency_ms" in summary:     # absent in summaries written before
        row("Mean normalized latency (ms/token):", summary["mean_normalized_latency_ms"])
    section("Scheduler")
    if not scheduler:
        lines.append("steps, queues, KV cache: not observed by a client")
    else:
        row("Engine steps:", summary["num_steps"])
        if "median_scheduling_delay_ms" in summary:
            row("Median scheduling delay (ms):", summary["median_scheduling_delay_ms"])
            row("P99 scheduling delay (ms):", summary["p99_scheduling_delay_ms"])
        row("Preemptions:", summary["total_preemptions"])
        row("Mean running requests:", summary["mean_running"])
        row("Mean waiting requests:", summary["mean_waiting"])
        row("Mean KV cache utilization (%):", _pct(summary["mean_kv_utilization"]))
        row("Max KV cache utilization (%):", _pct(summary["max_kv_utilization"]))
        row("Mean batched tokens per step:", summary["mean_batched_tokens"])
        if "prefix_cache_hit_rate" in summary:
            row("Prefix cache hit rate (%):", _pct(summary["prefix_cache_hit_rate"]))
        if "pipeline" in summary:                # stage time idle while the pipeline had work
            row("Pipeline bubbles (%):", _pct(summary["pipeline"]["bubble_fraction"]))
        if "kv_offload" in summary:
            ko = summary["kv_offload"]
            row("KV offload: blocks loaded from host:", ko["loaded_blocks"])
            row("KV offload: blocks stored to host:", ko["stored_blocks"])
    if "spec_decode" in summary:
        sd = summary["spec_decode"]
        section("Speculative Decoding")
        row("Acceptance rate (%):", _pct(sd["acceptance_rate"]))
        row("Acceptance length:", sd["acceptance_length"])
        row("Drafts:", sd["num_drafts"])
        row("Draft tokens:", sd["draft_tokens"])
        row("Accepted tokens:", sd["accepted_tokens"])
        lines.append("Per-position acceptance (%):")
        for i, rate in enumerate(sd["per_position_acceptance_rate"]):
            row(f"  Position {i}:", _pct(rate))
    if has_slo:
        section("SLO")
        row("Good requests:", summary["num_good"])
        row("SLO attainment (%):", _pct(summary["slo_attainment"]))
        for name, label, unit in (("tbt", "TBT", "ms"),
                                  ("scheduling_delay", "scheduling delay", "ms"),
                                  ("normalized_latency", "normalized latency", "ms/token")):
            if f"slo_{name}_ms" in summary:
                row(*_criterion(summary, name, label, unit))
        row("SLO attainment target (%):", _pct(summary["slo_attainment_target"]))
        row("SLO met:", summary["slo_met"])
    if summary.get("per_replica"):
        section("Replicas")
        for r in summary["per_replica"]:
            role = "" if r["role"] == "mixed" else r["role"]
            where = "/".join(x for x in (r["group"], role) if x)
            busy, kv = 100 * r["busy_fraction"], 100 * r["mean_kv_utilization"]
            lines.append(f"{r['replica']:>3} {where[:16]:<16} {r['completed']:>6} done "
                         f"{busy:5.1f}% busy {kv:5.1f}% KV")
        row("Completed max/mean:", summary.get("load_imbalance_completed"), ".3f")
        row("Busy time max/mean:", summary.get("load_imbalance_busy"), ".3f")
    for name, c in summary.get("per_class", {}).items():
        section(f"Class {name or '(none)'} (priority {c['priority']})")
        row("Successful requests:", c["completed"])
        if "request_goodput" in c:
            row("Request goodput (req/s):", c["request_goodput"])
            row("SLO attainment (%):", _pct(c["slo_attainment"]))
        row("Mean TTFT (ms):", c["mean_ttft_ms"])
        row("Mean TPOT (ms):", c["mean_tpot_ms"])
    lines.append("=" * 50)
    return "\n".join(lines)


def _criterion(summary: dict[str, Any], name: str, label: str, unit: str) -> tuple[str, Any]:
    """A run-level SLO criterion's printed row: which percentile, the measured value and its
    limit (a summary written before they were kept names neither)."""
    q = summary.get(f"slo_{name}_percentile")
    if q is not None:
        label = f"{'median' if q == 50 else f'P{q:g}'} {label}"
    value, limit = summary[f"slo_{name}_ms"], summary.get(f"slo_{name}_limit_ms")
    if limit is not None and value is not None:
        value = f"{value:.2f} (limit {limit:g})"
    return f"SLO {label} ({unit}):", value


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else 100.0 * fraction


def _percentile_words(summary: dict[str, Any], name: str) -> list[str]:
    pattern = re.compile(rf"p(.+)_{name}_ms")
    words = [m.group(1) for key in summary if (m := pattern.fullmatch(key))]
    return sorted(words, key=float)
