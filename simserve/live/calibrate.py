"""Black-box calibration of a measured kernel profile against a live server.

A kernel profile prices the device work of a step; a real engine adds what the profiler cannot
see. ``simserve calibrate scenario.yaml --endpoint URL --out calibrated.json`` sends probe
requests, predicts each probe's timings from the profile under the scenario's engine knobs, and
fits by least squares (relative errors, non-negative coefficients)::

    step(plan)  = step_overhead_s                        engine/CPU work of every step
                + per_output_token_s · num_sampled       per sampled token: sampling bookkeeping,
                                                         output processing, detokenising, SSE
                + scale · GEMM kernels(plan)             the profile's measured parts: embedding,
                                                         linear layers, LM head
                + prefill_attention_scale · prefill attention(plan)
                + decode_attention_scale · decode attention(plan)
                                                         (a serving engine's attention kernels
                                                         differ most from the profiler's, and
                                                         its prefill and decode kernels differ
                                                         from each other)
                + admission_s · requests admitted(plan)  the engine's work to take a request in
                                                         (prefill chunks at context 0)
    TTFT        = frontend_delay_s + Σ steps up to the first token

``frontend_delay_s`` is the HTTP server's hand-off to the engine and the stream back: a fixed
per-request latency outside the steps. In a single request's TTFT it and ``admission_s`` both
count once; the mixed probes, whose step admits a request but holds no front end, tell them
apart.

Probes (bounded: a few hundred requests, all sent to one loopback endpoint by default):

* **single** requests, one at a time on an idle server, over prompt lengths: TTFT (the prefill
  steps, chunked by ``max_num_batched_tokens``) and TPOT (decode steps of one sequence);
* **decode batches**: c requests sent together, for several concurrencies c, at a short and a
  long prompt (so that the fit sees decode attention over long contexts); the steady decode
  step time is measured where all c are decoding (after the last first token, before the first
  finish), per request as (last - first chunk time) / tokens between, then the median;
* **mixed steps**: a newcomer's prompt sent into a running decode stream; the stream's gap that
  ends with the newcomer's first token is the step that admitted it beside one decode;
* **a load**: an open-loop Poisson load (``ProbePlan.load_*``), whose decode and mixed steps
  are read off the token streams (``load_steps``): steps as a loaded server runs them, beside
  other requests' arrivals and streaming output, which closed probes run faster.

``speed_check`` re-measures, in seconds, how much slower than at calibration a server runs now;
``rescaled`` applies that factor to a calibrated profile.

The calibrated profile is the base profile plus a ``calibration`` block (read by
``simserve.latency.profile.ProfileLatency``), with provenance: endpoint, engine version (from
``/version`` when the server has it), date, probes, load average, the fit and its residuals. The
server's KV capacity (vLLM logs ``KV cache size: N tokens``) can be recorded too, so simulated
memory matches: ``num_gpu_blocks = N // block_size``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

import numpy as np

from simserve.errors import ConfigError, DataError, SimserveError

if TYPE_CHECKING:   # the CLI builds its parser from this module: keep importing it cheap
    from simserve.config import Scenario
    from simserve.sched.plan import StepPlan

CALIBRATION_VERSION = 1
PARAMS = ("step_overhead_s", "per_output_token_s", "scale", "prefill_attention_scale",
          "decode_attention_scale", "frontend_delay_s", "admission_s")


@dataclass(frozen=True)
class ProbePlan:
    """What calibration sends. Prompt lengths above what ``max_model_len`` allows (with the
    output) are dropped; concurrencies above ``max_num_seqs`` too."""

    prompt_lens: tuple[int, ...] = (16, 128, 384, 512, 700, 1024, 1536)
    single_output: int = 32
    concurrencies: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32)
    batch_prompt: int = 256
    batch_output: int = 64
    # decode batches are also sent at these longer prompts, so that the fit sees decode
    # attention over long contexts (what a loaded server runs), not only at batch_prompt
    long_batch_prompts: tuple[int, ...] = (1024,)
    # mixed steps: a newcomer's prompt sent into a running decode stream (after it has
    # streamed mixed_after tokens); the stall in that stream is the step that admits it
    mixed_prompts: tuple[int, ...] = (32, 128, 384)
    mixed_stream: tuple[int, int] = (256, 96)     # the running stream's prompt and output
    mixed_after: int = 8
    repeats: int = 3               # medians over repeats: the first sight of a shape is slower
    gap_s: float = 0.05            # idle time between probes, so each starts on an idle server
    # an open-loop load, sent once after the rest: Poisson arrivals, uniform prompt and output
    # lengths (inclusive ranges). Its steps, read off the token streams (``load_steps``), show
    # the server as a load finds it: decode steps beside other requests' arrivals and
    # streaming output, and admissions into running batches. 0 requests: no load probe.
    load_requests: int = 100
    load_rate: float = 9.0
    load_prompt: tuple[int, int] = (16, 384)
    load_output: tuple[int, int] = (24, 96)

    def for_scenario(self, s: Scenario) -> ProbePlan:
        longest = s.max_model_len - self.single_output
        stream_fits = sum(self.mixed_stream) <= s.max_model_len and s.engine.max_num_seqs >= 2
        return dataclasses.replace(
            self, prompt_lens=tuple(p for p in self.prompt_lens if p <= longest),
            # the newcomer's whole prompt and the stream's decode in one step's budget
            mixed_prompts=tuple(p for p in self.mixed_prompts
                                if stream_fits and p < s.max_num_batched_tokens),
            concurrencies=tuple(c for c in self.concurrencies if c <= s.engine.max_num_seqs),
            long_batch_prompts=tuple(p for p in self.long_batch_prompts
                                     if p + self.batch_output <= s.max_model_len),
            # a prompt fits one step beside the others' decodes, and the context with its output
            load_prompt=(self.load_prompt[0], max(self.load_prompt[0], min(
                self.load_prompt[1], s.max_num_batched_tokens - s.engine.max_num_seqs,
                s.max_model_len - self.load_output[1]))))

    @property
    def batch_prompts(self) -> tuple[int, ...]:
        return (self.batch_prompt, *self.long_batch_prompts)

    @property
    def num_requests(self) -> int:
        return self.repeats * (len(self.prompt_lens) + 2 * len(self.mixed_prompts)
                               + len(self.batch_prompts) * sum(self.concurrencies)) \
            + self.load_requests


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


def mixed_step(stream_times: list[float], stream_counts: list[int], first_token: float,
               stream_prompt: int) -> tuple[float, int] | None:
    """The running stream's gap that ends with the newcomer's first token (within 5 ms: the
    two tokens come from one step), and the stream's context in that step; None if the
    stream was not running across it or its step merged several tokens."""
    t, cum = np.asarray(stream_times), np.cumsum(stream_counts)
    near = np.flatnonzero((t[1:] >= first_token - 0.005) & (t[1:] <= first_token + 0.005))
    if not len(near):
        return None
    j = int(near[np.argmax(np.diff(t)[near])]) + 1       # the longest such gap ends at t[j]
    if stream_counts[j] != 1:
        return None
    return float(t[j] - t[j - 1]), int(stream_prompt + cum[j - 1] - 1)


def steady_decode_step(times: list[list[float]], counts: list[list[int]],
                       prompt: int) -> tuple[float, float, float] | None:
    """Median decode step time while every request of a batch is decoding, from each
    request's chunk times and token counts; with the context range it covered. None if that
    window holds fewer than 4 tokens per request."""
    if not times or any(not t for t in times):
        return None
    start = max(t[0] for t in times)       # the last first token
    end = min(t[-1] for t in times)        # the first finish
    per_req, ctx_lo, ctx_hi = [], [], []
    for t, n in zip(times, counts):
        t, cum = np.asarray(t), np.cumsum(n)
        inside = (t >= start) & (t <= end)
        if inside.sum() < 2:
            return None
        first, last = np.flatnonzero(inside)[[0, -1]]
        tokens = cum[last] - cum[first]
        if tokens < 4:
            return None
        per_req.append((t[last] - t[first]) / tokens)
        ctx_lo.append(prompt + cum[first] - 1)
        ctx_hi.append(prompt + cum[last] - 1)
    return float(np.median(per_req)), float(np.mean(ctx_lo)), float(np.mean(ctx_hi))


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


# --------------------------------------------------------------------------------------------
# Probing a live server


async def _probe_server(s: Scenario, endpoint: str, model: str | None, plan: ProbePlan,
                        timeout: float, warmup: int, log) -> tuple[dict, list[dict]]:
    import aiohttp

    from simserve.live.replay import EndpointError, Outcome, _probe, _send, prompt_ids, request_body
    from simserve.workload import RequestSpec
    connector = aiohttp.TCPConnector(limit=0, force_close=True)   # as in replay
    records: list[dict] = []
    async with aiohttp.ClientSession(connector=connector) as session:
        info = await _probe(session, endpoint, timeout=min(timeout, 10.0))
        model = model or info["model"]
        if not model:
            raise EndpointError(f"{endpoint}: /v1/models names no model; pass --model")
        url = f"{endpoint}/v1/completions"
        counter = iter(range(10**9))

        async def send(prompt: int, output: int) -> Outcome:
            rid = next(counter)
            out = Outcome(RequestSpec(rid, 0.0, prompt, output))
            body = request_body(model, prompt_ids(s.seed + 1_000_003, rid, prompt,
                                                  s.model.vocab_size), output)
            await _send(session, url, body, out, t0, timeout)
            if out.error:
                raise EndpointError(f"{url}: probe request failed ({out.error})")
            return out

        t0 = time.perf_counter()
        for _ in range(warmup):
            await send(16, 4)
        for rep in range(plan.repeats):
            for p in plan.prompt_lens:
                await asyncio.sleep(plan.gap_s)
                o = await send(p, plan.single_output)
                records.append({"kind": "single", "prompt": p, "output": plan.single_output,
                                "sent": o.sent_s, "times": o.chunk_times,
                                "counts": o.chunk_tokens})
            for p in plan.mixed_prompts:
                await asyncio.sleep(plan.gap_s)
                stream_prompt, stream_output = plan.mixed_stream
                stream = Outcome(RequestSpec(next(counter), 0.0, stream_prompt, stream_output))
                task = asyncio.create_task(_send(
                    session, url, request_body(model, prompt_ids(
                        s.seed + 1_000_003, stream.spec.request_id, stream_prompt,
                        s.model.vocab_size), stream_output), stream, t0, timeout))
                while (sum(stream.chunk_tokens) < plan.mixed_after and not task.done()):
                    await asyncio.sleep(0.002)
                newcomer = await send(p, 2)
                await task
                if stream.error:
                    raise EndpointError(f"{url}: probe request failed ({stream.error})")
                records.append({"kind": "mixed", "prompt": p, "stream_prompt": stream_prompt,
                                "times": stream.chunk_times, "counts": stream.chunk_tokens,
                                "first": newcomer.chunk_times[0]})
            for prompt in plan.batch_prompts:
                for c in plan.concurrencies:
                    await asyncio.sleep(plan.gap_s)
                    outs = await asyncio.gather(*(send(prompt, plan.batch_output)
                                                  for _ in range(c)))
                    records.append({"kind": "batch", "c": c, "prompt": prompt,
                                    "output": plan.batch_output,
                                    "times": [o.chunk_times for o in outs],
                                    "counts": [o.chunk_tokens for o in outs]})
            if log:
                log(f"probe round {rep + 1}/{plan.repeats} done")
        if plan.load_requests:
            rng = np.random.default_rng(s.seed + 1_000_033)
            n = plan.load_requests
            arrivals = np.cumsum(rng.exponential(1.0 / plan.load_rate, n))
            prompts = rng.integers(plan.load_prompt[0], plan.load_prompt[1] + 1, n)
            outputs = rng.integers(plan.load_output[0], plan.load_output[1] + 1, n)
            await asyncio.sleep(plan.gap_s)
            start = time.perf_counter()

            async def at(t: float, prompt: int, output: int) -> Outcome:
                await asyncio.sleep(max(0.0, start + t - time.perf_counter()))
                return await send(prompt, output)

            outs = await asyncio.gather(*(at(float(t), int(p), int(o))
                                          for t, p, o in zip(arrivals, prompts, outputs)))
            records.append({"kind": "load", "streams": [
                {"prompt": o.spec.num_prompt_tokens, "times": o.chunk_times,
                 "counts": o.chunk_tokens} for o in outs]})
            if log:
                log(f"load probe done: {n} requests at {plan.load_rate:g}/s")
    info["model"] = model
    return info, records


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


# --------------------------------------------------------------------------------------------
# Steps of a loaded server, read off its token streams (also benchmarks/fidelity_gaps.py)


@dataclass(frozen=True)
class LoadSteps:
    """Engine steps recognised in the token streams of an open-loop load: each pure decode
    step as (its seconds, the contexts of the requests it decoded), each mixed step that
    completed a newcomer's prompt as (prompt tokens, its seconds, the others' contexts)."""

    decode: list[tuple[float, tuple[int, ...]]]
    mixed: list[tuple[int, float, tuple[int, ...]]]


def deliveries(times, counts, within: float = 0.001) -> tuple[np.ndarray, np.ndarray]:
    """Chunks less than ``within`` apart as one delivery (SSE events read together), with
    their tokens summed: no engine step is that short."""
    out_t, out_n = [float(times[0])], [int(counts[0])]
    for t, k in zip(times[1:], counts[1:]):
        if t - out_t[-1] < within:
            out_n[-1] += int(k)
            out_t[-1] = float(t)
        else:
            out_t.append(float(t))
            out_n.append(int(k))
    return np.array(out_t), np.array(out_n)


def load_steps(streams: list[dict]) -> LoadSteps:
    """Steps of a load from its streams (``prompt``, chunk ``times`` and token ``counts``).

    *Pure decode step*: a gap between two deliveries of a stream with no newcomer's first
    token inside it (nor within 2 ms after); a delivery of n tokens ends n steps of equal
    length. It decoded every stream alive across it, each at context prompt + tokens
    delivered - 1. *Mixed step*: the step that completes a newcomer's prompt shows as the
    longest gap, among streams running across it, that ends within ±5 ms of the newcomer's
    first token (the median over those streams).
    """
    live = [s for s in streams if s["times"]]
    if not live:
        return LoadSteps([], [])
    merged = [deliveries(s["times"], s["counts"]) for s in live]
    prompts = np.array([s["prompt"] for s in live])
    first = np.array([t[0] for t, _ in merged])
    last = np.array([t[-1] for t, _ in merged])
    firsts = np.sort(first)
    cums = [np.cumsum(n) for _, n in merged]

    def contexts(at: float, alive: np.ndarray, skip: int = -1) -> tuple[int, ...]:
        return tuple(int(prompts[j] + cums[j][np.searchsorted(merged[j][0], at, "right") - 1]
                         - 1) for j in np.flatnonzero(alive) if j != skip)

    decode = []
    for ts, ns in merged:
        for a, b, k in zip(ts[:-1], ts[1:], ns[1:]):
            j = np.searchsorted(firsts, a + 1e-6)
            if k < 1 or j < len(firsts) and firsts[j] <= b + 0.002:
                continue                          # a newcomer's prefill ran in this gap
            alive = (first <= a) & (last >= b)
            decode.append(((b - a) / k, contexts(a, alive)))
    mixed = []
    for i, t1 in enumerate(first):
        stalls = []
        across = (first < t1 - 0.006) & (last > t1 + 0.003)
        across[i] = False
        for j in np.flatnonzero(across):
            ts = merged[j][0]
            ends, gaps = ts[1:], np.diff(ts)
            near = (ends >= t1 - 0.005) & (ends <= t1 + 0.005)
            if near.any():
                stalls.append(float(gaps[near].max()))
        if stalls:
            mixed.append((int(prompts[i]), float(np.median(stalls)),
                          contexts(t1 - 0.0051, across)))
    return LoadSteps(decode, mixed)


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


def kv_tokens_from_log(text: str) -> int | None:
    """The KV capacity vLLM logs at start-up (``KV cache size: 262,144 tokens``), or None."""
    m = re.findall(r"KV cache size:\s*([\d,_]+)\s*tokens", text)
    return int(m[-1].replace(",", "").replace("_", "")) if m else None


def calibrate(scenario: Scenario | str | Path, endpoint: str, *, base_profile: str | Path |
              None = None, model: str | None = None, plan: ProbePlan = ProbePlan(),
              num_gpu_blocks: int | None = None, kv_tokens: int | None = None,
              timeout: float = 120.0, warmup: int = 2, allow_remote: bool = False,
              fixed: dict[str, float] | None = None, overrides: list[str] | None = None,
              log=None) -> dict:
    """Probe ``endpoint``, fit, and return the calibrated profile (base profile + a
    ``calibration`` block). The base profile is ``base_profile`` or the scenario's
    ``latency.path`` (``latency.model: profile``)."""
    from simserve.config import Scenario, load_scenario
    from simserve.latency.profile import ProfileLatency
    from simserve.live.replay import check_endpoint_host
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides)
    endpoint = check_endpoint_host(endpoint, allow_remote)
    path = Path(base_profile) if base_profile else _scenario_profile(s)
    base = ProfileLatency.from_file(path, s.model)
    base_dict = {k: v for k, v in base.profile.items() if k != "calibration"}
    kernels = ProfileLatency(base_dict, source=str(path))   # kernels only: no overhead, scale 1
    blocks = _kv_blocks(s, num_gpu_blocks, kv_tokens)
    plan = plan.for_scenario(s)
    if not plan.prompt_lens or not plan.concurrencies:
        raise ConfigError("engine", "no probe fits this scenario's max_model_len/max_num_seqs")
    started = _dt.datetime.now(_dt.timezone.utc)
    load_before = _loadavg()
    t0 = time.perf_counter()
    info, records = asyncio.run(_probe_server(s, endpoint, model, plan, timeout, warmup, log))
    wall = time.perf_counter() - t0
    budget = s.max_num_batched_tokens
    obs = observations_from_probes(records, kernels, budget)
    result = fit(obs, fixed)
    calibration = {
        "version": CALIBRATION_VERSION,
        **result.params,
        "num_gpu_blocks": blocks,
        "kv_tokens": kv_tokens if kv_tokens is not None else (
            blocks * s.engine.block_size if blocks else None),
        "block_size": s.engine.block_size,
        "fit": {"method": "least squares on relative errors, non-negative",
                "fixed": dict(fixed or {}), "num_observations": len(obs),
                "residual_rel_rms": result.rel_rms, "residual_rel_max": result.rel_max,
                "residuals": result.residuals},
        "provenance": {
            "endpoint": endpoint, "model": info["model"], "engine_version": info["engine_version"],
            "date": started.strftime("%Y-%m-%dT%H:%M:%SZ"), "base_profile": str(path),
            "scenario": s.name,
            "engine_knobs": {"max_num_seqs": s.engine.max_num_seqs,
                             "max_num_batched_tokens": budget,
                             "block_size": s.engine.block_size,
                             "max_model_len": s.max_model_len},
            "probes": {**dataclasses.asdict(plan), "num_requests": plan.num_requests,
                       "warmup": warmup, "wall_s": wall},
            "load_average_before": load_before, "load_average_after": _loadavg(),
        },
    }
    return {**base_dict, "calibration": calibration}


# --------------------------------------------------------------------------------------------
# Re-measuring the server's speed since calibration


TIME_TERMS = ("step_overhead_s", "per_output_token_s", "scale", "attention_scale",
              "prefill_attention_scale", "decode_attention_scale", "frontend_delay_s",
              "admission_s")      # every calibrated term that is a time, or scales one
SPEED_PLAN = ProbePlan(prompt_lens=(), mixed_prompts=(), concurrencies=(1, 4, 16),
                       long_batch_prompts=(), batch_output=48, repeats=1, load_requests=0)


def speed_check(scenario: Scenario | str | Path, endpoint: str, calibrated: dict, *,
                plan: ProbePlan = SPEED_PLAN, timeout: float = 60.0, warmup: int = 1,
                allow_remote: bool = False) -> dict:
    """How fast the server runs now against a calibrated profile of it: a few decode batches
    (seconds, not minutes), each one's steady step measured over the step the calibrated
    model predicts. Returns ``{"factor": median ratio, "ratios": {probe: ratio}}``; a factor
    of 1.1 means steps take 10 % longer than at calibration (a shared machine's speed drifts
    by that much within minutes). ``rescaled(calibrated, factor)`` is the profile at that
    speed."""
    from simserve.config import Scenario, load_scenario
    from simserve.latency.profile import ProfileLatency
    from simserve.live.replay import check_endpoint_host
    s = scenario if isinstance(scenario, Scenario) else load_scenario(scenario)
    endpoint = check_endpoint_host(endpoint, allow_remote)
    plan = plan.for_scenario(s)
    if not plan.concurrencies:
        raise ConfigError("engine", "no speed probe fits this scenario's max_num_seqs")
    model = ProfileLatency(calibrated, source="<calibrated profile>")
    _, records = asyncio.run(_probe_server(s, endpoint, None, plan, timeout, warmup, None))
    ratios = {}
    for r in records:
        steady = steady_decode_step(r["times"], r["counts"], r["prompt"])
        if steady is None:
            continue
        step, lo, hi = steady
        predicted = np.mean([model.step_time(p)
                             for p in steady_plans(r["c"], max(lo, r["prompt"]), hi)])
        ratios[f"batch c={r['c']} P={r['prompt']} step"] = float(step / predicted)
    if not ratios:
        raise SimserveError(f"{endpoint}: the speed check measured no steady decode step")
    return {"factor": float(np.median(list(ratios.values()))), "ratios": ratios}


def rescaled(calibrated: dict, factor: float) -> dict:
    """The calibrated profile with every calibrated time (and every scale on the kernel
    times) multiplied by ``factor``: the same server, uniformly ``factor`` times slower."""
    cal = dict(calibrated["calibration"])
    for key in TIME_TERMS:
        if key in cal:
            cal[key] = cal[key] * factor
    if "scale" not in cal:                 # (its default: 1)
        cal["scale"] = factor
    cal["speed_factor"] = factor
    return {**calibrated, "calibration": cal}


def _scenario_profile(s: Scenario) -> Path:
    if s.latency.model != "profile" or not s.latency.path:
        raise ConfigError("latency.path", "calibration needs a base profile: set latency.model: "
                                          "profile and latency.path, or pass --profile")
    p = Path(s.latency.path)
    return p if p.is_absolute() else s.base_dir / p


def _kv_blocks(s: Scenario, num_gpu_blocks: int | None, kv_tokens: int | None) -> int | None:
    if num_gpu_blocks is not None and kv_tokens is not None:
        raise SimserveError("give either --num-gpu-blocks or --kv-tokens, not both")
    if num_gpu_blocks is not None:
        if num_gpu_blocks < 1:
            raise SimserveError(f"--num-gpu-blocks: must be >= 1, got {num_gpu_blocks}")
        return num_gpu_blocks
    if kv_tokens is not None:
        if kv_tokens < s.engine.block_size:
            raise SimserveError(f"--kv-tokens: must be >= block_size "
                                f"({s.engine.block_size}), got {kv_tokens}")
        return kv_tokens // s.engine.block_size
    return None


def _loadavg() -> list[float] | None:
    import os
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def write_calibrated(profile: dict, out: str | Path) -> Path:
    from simserve.latency.schema import validate
    out = Path(out)
    validate(profile, out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(profile, indent=1) + "\n")
    except OSError as e:
        raise SimserveError(f"{out}: cannot write ({e.strerror})") from None
    return out


# --------------------------------------------------------------------------------------------
# Simulating with a calibrated profile, front-end delay included


def run_calibrated(scenario: Scenario | str | Path, overrides: list[str] | None = None):
    """``runner.run`` with the summary's ``frontend_delay_ms`` always present (0 without a
    calibration). ``runner.collect`` applies a calibrated profile's front-end delay ``h``
    itself: each request reaches the engine ``h`` after the client sends it, so every engine
    time moves ``h`` later onto the client's clock: first token and finish (TTFT, E2EL) move by
    ``h``, TPOT and ITL do not, and the run lasts ``h`` longer."""
    from simserve.runner import run
    result = run(scenario, overrides=overrides)
    result.summary.setdefault("frontend_delay_ms", 0.0)
    return result


# --------------------------------------------------------------------------------------------
# Command line


def register(subparsers) -> None:
    p = subparsers.add_parser("calibrate", help="fit per-step overheads and a kernel scale to a "
                                                "live server; write a calibrated profile")
    p.add_argument("scenario", help="scenario YAML: engine knobs of the server, the model, and "
                                    "(latency.path) the base profile")
    p.add_argument("--endpoint", required=True, help="server base URL, e.g. http://127.0.0.1:8011")
    p.add_argument("--out", required=True, help="calibrated profile (JSON) to write")
    p.add_argument("--profile", help="base profile (default: the scenario's latency.path)")
    p.add_argument("--model", help="model name to request (default: the first of /v1/models)")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--num-gpu-blocks", type=int, metavar="N", help="the server's KV blocks")
    kv.add_argument("--kv-tokens", type=int, metavar="N",
                    help="the server's KV capacity in tokens (vLLM: `KV cache size: N tokens`)")
    kv.add_argument("--server-log", metavar="PATH",
                    help="read the KV capacity from the server's start-up log")
    p.add_argument("--repeats", type=int, default=ProbePlan.repeats,
                   help=f"rounds of probes (default {ProbePlan.repeats})")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S",
                   help="per-request timeout in seconds (default 120)")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="FIELD=VALUE", help="override a scenario field (repeatable)")
    p.add_argument("--allow-remote", action="store_true",
                   help="allow a non-loopback endpoint host")
    p.set_defaults(handler=_cmd_calibrate)


def _cmd_calibrate(args) -> int:
    import sys
    kv_tokens = args.kv_tokens
    if args.server_log:
        try:
            text = Path(args.server_log).read_text(errors="replace")
        except OSError as e:
            raise DataError(args.server_log, f"cannot read ({e.strerror})") from None
        kv_tokens = kv_tokens_from_log(text)
        if kv_tokens is None:
            raise DataError(args.server_log, "no 'KV cache size: N tokens' line found")
    if args.repeats < 1:
        raise SimserveError(f"--repeats: must be >= 1, got {args.repeats}")
    plan = dataclasses.replace(ProbePlan(), repeats=args.repeats)
    profile = calibrate(args.scenario, args.endpoint, base_profile=args.profile,
                        model=args.model, plan=plan, num_gpu_blocks=args.num_gpu_blocks,
                        kv_tokens=kv_tokens, timeout=args.timeout,
                        allow_remote=args.allow_remote, overrides=args.overrides,
                        log=lambda line: print(line, file=sys.stderr))
    print(format_calibration(profile["calibration"]))
    out = write_calibrated(profile, args.out)
    cal = profile["calibration"]
    sets = f"--set latency.model=profile --set latency.path={out}"
    if cal["num_gpu_blocks"]:
        sets += f" --set engine.num_gpu_blocks={cal['num_gpu_blocks']}"
    print(f"calibrated profile: {out}\nsimulate with: simserve run SCENARIO {sets}")
    return 0


def format_calibration(cal: dict) -> str:
    f = cal["fit"]
    lines = [
        f"step overhead      {cal['step_overhead_s'] * 1e3:8.3f} ms",
        f"per output token   {cal['per_output_token_s'] * 1e3:8.3f} ms",
        f"GEMM kernel scale  {cal['scale']:8.3f}",
        *([f"attention scale    {cal['attention_scale']:8.3f}"] if "attention_scale" in cal
          else [f"prefill attention  {cal['prefill_attention_scale']:8.3f} (scale)",
                f"decode attention   {cal['decode_attention_scale']:8.3f} (scale)"]),
        f"front-end delay    {cal['frontend_delay_s'] * 1e3:8.3f} ms",
        f"per admission      {cal.get('admission_s', 0.0) * 1e3:8.3f} ms",
        f"fit: {f['num_observations']} observations, relative residual rms "
        f"{100 * f['residual_rel_rms']:.1f} %, max {100 * f['residual_rel_max']:.1f} %",
    ]
    for r in f["residuals"]:
        lines.append(f"  {r['probe']:<24} measured {r['measured_s'] * 1e3:8.2f} ms  fitted "
                     f"{r['fitted_s'] * 1e3:8.2f} ms  {100 * r['rel_error']:+6.1f} %")
    if cal.get("num_gpu_blocks"):
        lines.append(f"KV capacity        {cal['num_gpu_blocks']} blocks of {cal['block_size']} "
                     f"tokens")
    return "\n".join(lines)
