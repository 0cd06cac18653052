"""How far to trust a run's latencies: the expected error of a fitted step-time model on each
headline metric, and where a scenario lies outside the measured runs it was fitted on.

A curve set fitted to whole serving runs (``h100-vllm``: docs/latency.md) ships with the median
absolute % error of each metric when each model of its corpus is predicted by a fit made
without it (``expected_error_pct``), and with what its corpus covers (``corpus``). A run priced
with that set carries both in its summary (``latency_trust``), with the ways its scenario leaves
the corpus; other latency models carry none (no measured runs to judge them by).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simserve.latency.efficiency import EfficiencyCurves

# (a Scenario: config.py's, read by attribute; not imported, as config sits above latency)
Scenario = Any

VLLM_V1_POLICIES = ("vllm_v1", "priority", "vllm_native")
ASYNC_OFF = "async_scheduling off"   # (how outside() says it; trust_lines reads it back)
# scenario fields that replace a fitted set's own terms (the band is the set's, not theirs;
# read in this order by outside())
FITTED_TERMS = ("step_overhead_ms", "per_output_token_ms", "frontend_delay_ms",
                "flops_efficiency", "bandwidth_efficiency")


def latency_trust(s: Scenario, curves: EfficiencyCurves | None,
                  longest: int | None = None) -> dict[str, Any] | None:
    """``{"curves", "expected_error_pct", "basis", "outside_corpus": [...]}`` for a scenario
    priced by a fitted curve set (``curves``: the set its roofline uses, or None), else
    None. ``longest``: the longest request of its workload, prompt and output tokens
    (``outside``)."""
    if curves is None or not curves.expected_error_pct:
        return None
    return {"curves": curves.name, "expected_error_pct": dict(curves.expected_error_pct),
            "basis": "median absolute % error per stage over the measured runs, each model "
                     "predicted by a fit without it",
            "outside_corpus": outside(s, curves.corpus, longest)}


def outside(s: Scenario, corpus: dict[str, Any], longest: int | None = None) -> list[str]:
    """The ways ``s`` leaves what ``corpus`` measured, in words (empty: inside). Contexts are
    judged by ``longest``, the longest request of its workload (prompt and output tokens;
    one longer than ``max_model_len`` is rejected, never run), else by ``max_model_len``
    (what the scenario allows)."""
    out: list[str] = []
    e, m = s.engine, s.model
    if corpus.get("hardware") and s.hardware.name != corpus["hardware"]:
        out.append(f"hardware {s.hardware.name}: the runs were on {corpus['hardware']} "
                   f"(efficiencies transferred)")
    if s.policy not in VLLM_V1_POLICIES:
        out.append(f"policy {s.policy}: the runs were vLLM V1's engine (its CPU "
                   f"costs are in the fit)")
    lo, hi = corpus.get("params_b", (0.0, float("inf")))
    params = m.num_params / 1e9
    if not lo <= params <= hi:
        out.append(f"model of {params:.3g} B parameters: the runs' models had {lo:g}-{hi:g} B")
    tp_hi = corpus.get("max_tp", 1)
    if e.tensor_parallel_size > tp_hi:
        out.append(f"tensor_parallel_size {e.tensor_parallel_size}: the runs used at most "
                   f"{tp_hi}")
    if e.pipeline_parallel_size > 1 or e.data_parallel_size > 1:
        out.append("pipeline or data parallelism: the runs had neither")
    ctx, limit = corpus.get("max_context"), s.max_model_len   # (resolved: the card's if unset)
    if ctx and longest is not None and min(longest, limit) > ctx:
        out.append(f"requests of up to {min(longest, limit):,} tokens: the runs' requests "
                   f"held at most {ctx:,} (longer contexts are extrapolated)")
    elif ctx and longest is None and limit > ctx:
        out.append(f"max_model_len {limit:,}: the runs' requests held at most "
                   f"{ctx:,} tokens (longer contexts are extrapolated)")
    moe = corpus.get("moe_models")
    if moe is not None and m.is_moe and m.name not in moe:
        out.append(f"MoE model {m.name}: the cost of an MoE layer was learnt from "
                   + (", ".join(moe) or "no MoE model") + " alone")
    if e.speculative_config is not None:
        out.append("speculative decoding: the runs had none")
    lat = s.latency
    given = (lat.step_overhead_ms, lat.per_output_token_ms, lat.frontend_delay_ms,
             lat.flops_efficiency, lat.bandwidth_efficiency)
    set_terms = [k for k, v in zip(FITTED_TERMS, given) if v is not None]
    if set_terms:
        out.append("latency." + ", latency.".join(set_terms) + " set: the band is for the "
                   "fitted set's own terms, not for these")
    if s.cluster.disaggregated:
        out.append("disaggregated prefill/decode: the runs served on single engines")
    elif not e.async_scheduling and s.policy in VLLM_V1_POLICIES:
        out.append(f"{ASYNC_OFF}: the runs had it on (vLLM's default), so each step "
                   "here also pays the engine's CPU time and an arrival waits one step less")
    return out


def trust_lines(trust: dict[str, Any] | None, can_async: bool = True) -> list[str]:
    """The summary's ``latency_trust`` in words (console and report); ``can_async``: whether
    the run's scenario could turn async scheduling on (what a synchronous run is told to do)."""
    if not trust:
        return []
    err = trust["expected_error_pct"]
    names = {"ttft_mean": "TTFT mean", "e2e_mean": "E2E mean", "itl_mean": "ITL mean",
             "ttft_p99": "TTFT p99", "e2e_p99": "E2E p99"}
    band = ", ".join(f"{label} {err[k]:g} %" for k, label in names.items() if k in err)
    outside_runs = [w for w in trust["outside_corpus"] if not w.startswith(ASYNC_OFF)]
    sync = len(outside_runs) < len(trust["outside_corpus"])
    # (a median, not a bound: said so, and never as "±")
    lines = [f"Expected error of the {trust['curves']} step-time model"
             + (" with async scheduling" if sync else "")
             + f", as the median absolute error over the measured runs (each predicted by a fit "
               f"without its model): {band}."]
    if sync:    # (said once, here)
        lines.append("This run is synchronous (engine.async_scheduling: false), unlike the "
                     "measured runs (vLLM's default is async): each step also pays the "
                     "engine's CPU time and an arrival waits one step less, so the same set is "
                     "further from them, TTFT most (docs/fidelity.md, 'Measured vLLM on H100', "
                     "gives the errors)"
                     + ("; set engine.async_scheduling: true for the band above." if can_async
                        else "."))
    if outside_runs:
        lines.append("Outside the measured runs: " + "; ".join(outside_runs) + ".")
    return lines


def no_band_line(latency_label: str) -> str:
    """What a run priced by a model with no measured error says instead of a band (a roofline
    on a spec sheet or unfitted curves, a kernel profile): "" for the test models (constant,
    linear), which make no claim."""
    if latency_label.startswith("roofline"):
        return ("No measured error for this step-time model: an estimate from the hardware's "
                "spec sheet (and efficiency curves where it has them), not checked against "
                "served runs on it (docs/fidelity.md).")
    if latency_label.startswith("profile") and latency_label.endswith("calibrated)"):
        return ("No measured error for this step-time model: kernel times measured on the "
                "profile's device, calibrated against one live server (docs/fidelity.md).")
    if latency_label.startswith("profile"):
        return ("No measured error for this step-time model: kernel times measured on the "
                "profile's device, not whole served runs; `simserve calibrate` fits it to a "
                "live server (docs/fidelity.md).")
    return ""


def run_trust_lines(summary: dict[str, Any], can_async: bool = True) -> list[str]:
    """What a run says of how far to trust its latencies: its band (``trust_lines``), or that
    its model has none (``no_band_line``); ``can_async``: whether its scenario could turn async
    scheduling on."""
    trust = summary.get("latency_trust")
    if trust:
        return trust_lines(trust, can_async)
    line = no_band_line(str(summary.get("latency_model") or ""))
    return [line] if line else []
