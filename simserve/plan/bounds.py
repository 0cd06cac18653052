"""Cheap bounds that rule candidate deployments out before any simulation (docs/capacity.md).

- **memory**: the weights and one ``max_model_len`` request's KV cache must fit a replica, as
  vLLM refuses to start otherwise (``kv/capacity.py`` sizes the cache);
- **SLO**: a request alone on the deployment is its best case: if more than ``1 − attainment``
  of the workload's requests miss a latency limit even then, no rate meets the SLO;
- **throughput**: no step samples more than ``max_num_seqs`` tokens or prefills more than
  ``max_num_batched_tokens``, and a step is never cheaper than the latency model's price of
  its decodes (or its prefill) alone at the shortest context, so one copy of the deployment
  serves at most

      rate_ub = min(P · prefill_tok_s / mean prompt,  D · decode_tok_s / mean output)

  req/s (P = D = 1 colocated), with ``decode_tok_s = max_b b / t_decode(b)`` over batches up to
  ``max_num_seqs`` and ``prefill_tok_s = T / t_prefill(T)`` at the token budget T (with
  pipeline parallelism, the slowest stage's time; with async scheduling, less its CPU part).
  A finite probe of N requests can pass a little above a sustainable rate before its queue
  breaks a TTFT/E2EL limit L: the i-th request waits about ``i (1/μ − 1/r)``, so a rate passes
  at most while ``a N (1/μ − 1/r) ≤ L``; the bound widens to that, times ``ARRIVAL_MARGIN``
  for Poisson arrivals that are not evenly spaced.

The bounds assume a step's price grows with its tokens and contexts (true of the roofline and
of measured profiles). ``tests/unit/test_plan.py`` holds them to an exhaustive search.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simserve.sched.plan import StepPlan

ARRIVAL_MARGIN = 1.25       # Poisson gaps vs evenly spaced arrivals in the finite-run widening


@dataclass(frozen=True)
class Lengths:
    """The workload's request lengths (what every probe sends, whatever its rate)."""

    prompts: np.ndarray
    outputs: np.ndarray

    @classmethod
    def of(cls, s) -> Lengths:
        from simserve.workload import build_workload
        reqs = build_workload(s.workload, s.seed, s.base_dir)
        return cls(np.array([r.num_prompt_tokens for r in reqs], dtype=np.int64),
                   np.array([r.num_output_tokens for r in reqs], dtype=np.int64))


@dataclass(frozen=True)
class Bound:
    """What the bounds say of one candidate."""

    rate_ub: float          # req/s one copy of the deployment passes a probe at, at most
    sustained: float        # req/s one copy sustains at most (μ, before the finite-run widening)
    lone_ttft_s: float      # TTFT of the attainment-quantile prompt alone
    lone_tpot_s: float      # one decode step alone
    slo_miss: str           # why the SLO cannot be met even by a lone request ("" if it can)


def _decode(n: int, ctx: int) -> StepPlan:
    return StepPlan(tuple(range(n)), (1,) * n, (), (), (ctx,) * n, n)


def _prefill(tokens: int, ctx: int) -> StepPlan:
    return StepPlan((0,), (tokens,), (tokens,), (ctx,), (), 1)


def _cycle_s(lat, s, plan: StepPlan) -> float:
    """The least time between two such steps' ends: a step's price, its slowest stage with
    pipeline parallelism; with async scheduling the CPU part overlaps and is left out."""
    from simserve.latency.base import Pricing
    pricing = Pricing.of(lat)
    t = max(pricing.stages(plan)[0]) if (pricing.stages is not None
                                         and s.engine.pipeline_parallel_size > 1) \
        else lat.step_time(plan)
    if s.engine.async_scheduling:
        t -= pricing.cpu_s(plan)
    return max(t, 1e-12)


def _lone_ttft_s(lat, prompt: int, budget: int) -> float:
    """A prompt's prefill alone: its chunks of at most ``budget`` tokens, one step each."""
    t, done = 0.0, 0
    while done < prompt:
        n = min(budget, prompt - done)
        t += lat.step_time(_prefill(n, done))
        done += n
    return t


def bound(s, lengths: Lengths, prefill: int = 1, decode: int = 1) -> Bound:
    """The bounds of the deployment ``s`` (one replica's scenario) for ``lengths``; a
    disaggregated copy has ``prefill`` and ``decode`` such replicas."""
    from simserve.engine.build import build_latency
    lat = build_latency(s)
    p, o = lengths.prompts, lengths.outputs
    n = len(p)
    ctx = int(p.min())
    budget = s.max_num_batched_tokens
    seqs = s.engine.max_num_seqs
    batches = sorted({min(seqs, 1 << k) for k in range(seqs.bit_length() + 1)})
    decode_tok_s = max(b / _cycle_s(lat, s, _decode(b, ctx)) for b in batches)
    chunk = min(budget, s.max_model_len)
    prefill_tok_s = chunk / _cycle_s(lat, s, _prefill(chunk, 0))
    mu = min(prefill * prefill_tok_s / float(p.mean()), decode * decode_tok_s / float(o.mean()))

    slo, a = s.slo, s.slo.attainment
    limits = [x / 1000 for x in (slo.ttft_ms, slo.e2el_ms) if x is not None]
    rate_ub = math.inf
    if limits:
        slack = min(limits) / (a * n)
        rate_ub = ARRIVAL_MARGIN / (1 / mu - slack) if 1 / mu > slack else math.inf

    # a request alone: the attainment-quantile prompt's TTFT, one decode step's TPOT
    k = min(n - 1, max(0, math.ceil(a * n) - 1))
    lone_ttft = _lone_ttft_s(lat, int(np.sort(p)[k]), budget)
    lone_tpot = lat.step_time(_decode(1, ctx))
    miss = ""
    if slo.ttft_ms is not None and lone_ttft > slo.ttft_ms / 1000:
        miss = (f"a lone request's TTFT at the {a:.0%} prompt ({int(np.sort(p)[k])} tokens) is "
                f"{lone_ttft * 1000:.4g} ms > slo.ttft_ms {slo.ttft_ms:g}")
    elif slo.tpot_ms is not None and lone_tpot > slo.tpot_ms / 1000 \
            and np.mean(o < 2) < a:
        miss = (f"one decode step alone takes {lone_tpot * 1000:.4g} ms > slo.tpot_ms "
                f"{slo.tpot_ms:g}")
    elif slo.e2el_ms is not None:
        e2el = _lone_ttft_s(lat, ctx, budget) + (o - 1) * lone_tpot
        if np.mean(e2el <= slo.e2el_ms / 1000) < a:
            miss = (f"alone, fewer than {a:.0%} of requests finish within slo.e2el_ms "
                    f"{slo.e2el_ms:g}")
    return Bound(rate_ub, mu, lone_ttft, lone_tpot, miss)


def kv_fits(s) -> str:
    """Why the deployment cannot start (weights, or one ``max_model_len`` request's KV cache,
    do not fit), or "" if it can."""
    r = s.replica
    if r.kv_error:
        return r.kv_error
    need = math.ceil(s.max_model_len / r.block_size)
    if r.usable_blocks < need:
        return (f"{r.usable_blocks:,} KV blocks hold {r.usable_blocks * r.block_size:,} tokens, "
                f"fewer than one max_model_len request ({s.max_model_len:,})")
    return ""
