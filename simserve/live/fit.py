"""Calibration's model side: what the profile predicts for each probe, and the fit.

Each measured probe becomes an :class:`Observation` ``y ≈ x · params``: ``x`` are the probe's
features priced by an uncalibrated profile (steps, tokens sampled, GEMM and attention kernel
seconds, a front-end delay, admissions), in :data:`PARAMS` order; :func:`fit` solves for the
non-negative parameters (see :mod:`simserve.live.calibrate` for the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simserve.errors import SimserveError
from simserve.live.probes import LoadSteps, load_steps, mixed_step, steady_decode_step

if TYPE_CHECKING:
    from simserve.sched.plan import StepPlan

PARAMS = ("step_overhead_s", "per_output_token_s", "scale", "prefill_attention_scale",
          "decode_attention_scale", "frontend_delay_s", "admission_s")


# --------------------------------------------------------------------------------------------
# What the profile predicts for a probe: the step plans, by hand, as vLLM v1 schedules them


def single_prefill_plans(prompt: int, budget: int) -> list[StepPlan]:
    """The prefill steps of one request alone: chunks of at most ``budget`` tokens; the last
    one samples the first token (vLLM v1 samples nothing for a partial prefill)."""
    from simserve.sched.plan import StepPlan
    plans, done = [], 0
    while done < prompt:
        q = min(budget, prompt - done)
        last = done + q == prompt
        plans.append(StepPlan((0,), (q,), (q,), (done,), (), int(last)))
        done += q
    return plans


def mixed_plan(prompt: int, ctx: int) -> StepPlan:
    """A newcomer's whole prompt beside one decode at ``ctx``: the step that admits it."""
    from simserve.sched.plan import StepPlan
    return StepPlan((0, 1), (1, prompt), (prompt,), (0,), (ctx,), 2)


def decode_plan(batch: int, ctx: int) -> StepPlan:
    """One decode step of ``batch`` sequences, each with ``ctx`` tokens already in KV."""
    from simserve.sched.plan import StepPlan
    ids = tuple(range(batch))
    return StepPlan(ids, (1,) * batch, (), (), (ctx,) * batch, batch)


@dataclass(frozen=True)
class Observation:
    """One measured quantity and its linear model: ``y ≈ x · params`` (in :data:`PARAMS`
    order: steps, tokens sampled, GEMM-part kernel seconds, prefill and decode attention kernel
    seconds, 1 for a first-token latency, requests admitted)."""

    probe: str          # e.g. "single P=512 ttft", "batch c=8 step"
    x: tuple[float, ...]
    y: float


GEMM_PARTS = ("embedding", "linear", "lm_head")


def step_features(latency, plans: list[StepPlan]) -> tuple[float, float, float, float, float]:
    """(steps, tokens sampled, GEMM kernels s, prefill attention s, decode attention s)
    summed over ``plans``, priced by an uncalibrated profile model (its ``breakdown``)."""
    steps = sampled = gemm = prefill = decode = 0.0
    for plan in plans:
        parts = latency.breakdown(plan)
        steps += 1
        sampled += plan.num_sampled
        gemm += sum(parts[k] for k in GEMM_PARTS)
        prefill += parts["attn_prefill"]
        decode += parts["attn_decode"]
    return steps, sampled, gemm, prefill, decode


def _mean_features(latency, plans: list[StepPlan]) -> tuple[float, ...]:
    return tuple(v / len(plans) for v in step_features(latency, plans))


def _admitted(plans: list[StepPlan]) -> float:
    """Requests admitted over ``plans`` (prefill chunks at context 0)."""
    return float(sum(plan.prefill_ctx.count(0) for plan in plans))


def single_observations(latency, prompt: int, output: int, budget: int, ttft: float,
                        tpot: float | None) -> list[Observation]:
    pre = single_prefill_plans(prompt, budget)
    obs = [Observation(f"single P={prompt} ttft",
                       (*step_features(latency, pre), 1.0, _admitted(pre)), ttft)]
    if tpot is not None and output > 1:
        # decode steps feed tokens 1 .. output-1 back: contexts prompt .. prompt + output - 2
        dec = [decode_plan(1, prompt + i) for i in range(output - 1)]
        obs.append(Observation(f"single P={prompt} tpot",
                               (*_mean_features(latency, dec), 0.0, 0.0), tpot))
    return obs


def steady_plans(c: int, ctx_lo: float, ctx_hi: float) -> list[StepPlan]:
    """Decode steps of a batch of ``c`` across the context range its steady window covered
    (five points: what a batch probe's measured step is set against)."""
    return [decode_plan(c, int(round(x))) for x in np.linspace(ctx_lo, ctx_hi, 5)]


def batch_observation(latency, c: int, ctx_lo: float, ctx_hi: float,
                      step_s: float, prompt: int | None = None) -> Observation:
    dec = steady_plans(c, ctx_lo, ctx_hi)
    name = f"batch c={c} step" if prompt is None else f"batch c={c} P={prompt} step"
    return Observation(name, (*_mean_features(latency, dec), 0.0, 0.0), step_s)


def mixed_observation(latency, prompt: int, ctx: int, step_s: float) -> Observation:
    plan = [mixed_plan(prompt, ctx)]
    return Observation(f"mixed P={prompt} step", (*step_features(latency, plan), 0.0, 1.0),
                       step_s)


def observations_from_probes(records: list[dict], latency, budget: int) -> list[Observation]:
    """Turn recorded probes into observations, repeats of one probe merged by median."""
    singles: dict[int, list[tuple[float, float | None]]] = {}
    batches: dict[tuple[int, int], list[tuple[float, float, float]]] = {}   # (prompt, c)
    mixed: dict[int, list[tuple[float, int]]] = {}
    outputs: dict[int, int] = {}
    obs: list[Observation] = []
    for r in records:
        if r["kind"] == "load":
            obs += load_observations(load_steps(r["streams"]), latency)
        elif r["kind"] == "mixed":
            found = mixed_step(r["times"], r["counts"], r["first"], r["stream_prompt"])
            if found is not None:
                mixed.setdefault(r["prompt"], []).append(found)
        elif r["kind"] == "single":
            t, n = r["times"], r["counts"]
            ttft = t[0] - r["sent"]
            tokens = sum(n)
            # TPOT from token counts: (last - first) / (tokens - 1)
            tpot = (t[-1] - t[0]) / (tokens - 1) if tokens > 1 else None
            singles.setdefault(r["prompt"], []).append((ttft, tpot))
            outputs[r["prompt"]] = r["output"]
        else:
            steady = steady_decode_step(r["times"], r["counts"], r["prompt"])
            if steady is not None:
                batches.setdefault((r["prompt"], r["c"]), []).append(steady)
    for p, vals in sorted(singles.items()):
        ttft = float(np.median([v[0] for v in vals]))
        tpots = [v[1] for v in vals if v[1] is not None]
        obs += single_observations(latency, p, outputs[p], budget, ttft,
                                   float(np.median(tpots)) if tpots else None)
    for (prompt, c), vals in sorted(batches.items()):
        step, lo, hi = (float(np.median([v[i] for v in vals])) for i in range(3))
        obs.append(batch_observation(latency, c, max(lo, prompt), hi, step, prompt))
    for p, vals in sorted(mixed.items()):
        step = float(np.median([v[0] for v in vals]))
        obs.append(mixed_observation(latency, p, int(np.median([v[1] for v in vals])), step))
    return obs


def load_observations(steps: LoadSteps, latency, min_count: int = 20) -> list[Observation]:
    """Observations from a load's steps: decode steps binned by the requests they decoded
    (the median step; features of the bin's median total context spread evenly), mixed steps
    by prompt length in 128-token bins (the median step; features averaged over the bin)."""
    from simserve.sched.plan import StepPlan
    obs = []
    by_b: dict[int, list[tuple[float, int]]] = {}
    for sec, ctx in steps.decode:
        if ctx:
            by_b.setdefault(len(ctx), []).append((sec, sum(ctx)))
    for b, vals in sorted(by_b.items()):
        if len(vals) < min_count:
            continue
        step = float(np.median([v[0] for v in vals]))
        ctx = int(round(np.median([v[1] for v in vals]) / b))
        obs.append(Observation(f"load decode b={b} step",
                               (*step_features(latency, [decode_plan(b, ctx)]), 0.0, 0.0), step))
    by_p: dict[int, list[tuple[float, StepPlan]]] = {}
    for prompt, sec, ctx in steps.mixed:
        plan = StepPlan(tuple(range(len(ctx) + 1)), (*[1] * len(ctx), prompt), (prompt,), (0,),
                        ctx, len(ctx) + 1)
        by_p.setdefault((prompt - 1) // 128, []).append((sec, plan))
    for k, vals in sorted(by_p.items()):
        if len(vals) < 5:
            continue
        plans = [v[1] for v in vals]
        obs.append(Observation(f"load mixed P={128 * k + 1}-{128 * (k + 1)} step",
                               (*_mean_features(latency, plans), 0.0, 1.0),
                               float(np.median([v[0] for v in vals]))))
    return obs


# --------------------------------------------------------------------------------------------
# The fit


@dataclass(frozen=True)
class Fit:
    params: dict[str, float]
    residuals: list[dict[str, Any]]       # per observation: probe, measured, fitted, rel. error
    rel_rms: float
    rel_max: float


def fit(observations: list[Observation], fixed: dict[str, float] | None = None) -> Fit:
    """Least squares on relative errors with non-negative coefficients (an active set: a
    coefficient that comes out negative is pinned at 0 and the rest refitted). ``fixed`` pins
    parameters by name."""
    if not observations:
        raise SimserveError("calibrate: no usable probe observations")
    X = np.array([o.x for o in observations], dtype=float)
    y = np.array([o.y for o in observations], dtype=float)
    w = 1.0 / np.maximum(y, 1e-6)                 # relative errors: every probe weighs alike
    fixed = dict(fixed or {})
    free = [i for i, name in enumerate(PARAMS) if name not in fixed]
    beta = np.zeros(len(PARAMS))
    for i, name in enumerate(PARAMS):
        if name in fixed:
            beta[i] = fixed[name]
    while True:
        rhs = y - X[:, [i for i in range(len(PARAMS)) if i not in free]] @ \
            beta[[i for i in range(len(PARAMS)) if i not in free]]
        A = X[:, free] * w[:, None]
        sol = np.linalg.lstsq(A, rhs * w, rcond=None)[0] if free else np.empty(0)
        if (sol >= 0).all() or not free:
            beta[free] = sol
            break
        worst = free[int(np.argmin(sol))]
        beta[worst] = 0.0
        free.remove(worst)
    fitted = X @ beta
    rel = (fitted - y) / y
    residuals = [{"probe": o.probe, "measured_s": float(o.y), "fitted_s": float(f),
                  "rel_error": float(r)} for o, f, r in zip(observations, fitted, rel)]
    return Fit(dict(zip(PARAMS, (float(b) for b in beta))), residuals,
               float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel))))
