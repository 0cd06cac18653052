"""Calibration probes: what is sent to a live server, and the step times read off its streams.

:class:`ProbePlan` says what is sent; :func:`probe_server` sends it through the shared HTTP
client (:mod:`simserve.live.client`) and records every probe's chunk times and token counts; the
readers (:func:`mixed_step`, :func:`steady_decode_step`, :func:`load_steps`) turn streams into
measured step times. What the profile predicts for them, and the fit, are in
:mod:`simserve.live.fit`; the whole calibration in :mod:`simserve.live.calibrate`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simserve.live.client import (EndpointError, Outcome, no_model, probe, prompt_ids,
                                  request_body, send)

if TYPE_CHECKING:
    from simserve.config import Scenario


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
# Probing a live server


async def probe_server(s: Scenario, endpoint: str, model: str | None, plan: ProbePlan,
                       timeout: float, warmup: int, log) -> tuple[dict, list[dict]]:
    """Send ``plan``'s probes to ``endpoint`` (one at a time, batches together, then the load);
    return the server's info and one record per probe (chunk times and token counts)."""
    import aiohttp

    from simserve.workload import RequestSpec
    connector = aiohttp.TCPConnector(limit=0, force_close=True)   # as in replay
    records: list[dict] = []
    async with aiohttp.ClientSession(connector=connector) as session:
        info = await probe(session, endpoint, timeout=min(timeout, 10.0))
        model = model or info["model"]
        if not model:
            raise no_model(endpoint, info)
        url = f"{endpoint}/v1/completions"
        counter = iter(range(10**9))

        async def one(prompt: int, output: int) -> Outcome:
            rid = next(counter)
            out = Outcome(RequestSpec(rid, 0.0, prompt, output))
            body = request_body(model, prompt_ids(s.seed + 1_000_003, rid, prompt,
                                                  s.model.vocab_size), output)
            await send(session, url, body, out, t0, timeout)
            if out.error:
                raise EndpointError(f"{url}: probe request failed ({out.error})")
            return out

        t0 = time.perf_counter()
        for _ in range(warmup):
            await one(16, 4)
        for rep in range(plan.repeats):
            for p in plan.prompt_lens:
                await asyncio.sleep(plan.gap_s)
                o = await one(p, plan.single_output)
                records.append({"kind": "single", "prompt": p, "output": plan.single_output,
                                "sent": o.sent_s, "times": o.chunk_times,
                                "counts": o.chunk_tokens})
            for p in plan.mixed_prompts:
                await asyncio.sleep(plan.gap_s)
                stream_prompt, stream_output = plan.mixed_stream
                stream = Outcome(RequestSpec(next(counter), 0.0, stream_prompt, stream_output))
                task = asyncio.create_task(send(
                    session, url, request_body(model, prompt_ids(
                        s.seed + 1_000_003, stream.spec.request_id, stream_prompt,
                        s.model.vocab_size), stream_output), stream, t0, timeout))
                while (sum(stream.chunk_tokens) < plan.mixed_after and not task.done()):
                    await asyncio.sleep(0.002)
                newcomer = await one(p, 2)
                await task
                if stream.error:
                    raise EndpointError(f"{url}: probe request failed ({stream.error})")
                records.append({"kind": "mixed", "prompt": p, "stream_prompt": stream_prompt,
                                "times": stream.chunk_times, "counts": stream.chunk_tokens,
                                "first": newcomer.chunk_times[0]})
            for prompt in plan.batch_prompts:
                for c in plan.concurrencies:
                    await asyncio.sleep(plan.gap_s)
                    outs = await asyncio.gather(*(one(prompt, plan.batch_output)
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
                return await one(prompt, output)

            outs = await asyncio.gather(*(at(float(t), int(p), int(o))
                                          for t, p, o in zip(arrivals, prompts, outputs)))
            records.append({"kind": "load", "streams": [
                {"prompt": o.spec.num_prompt_tokens, "times": o.chunk_times,
                 "counts": o.chunk_tokens} for o in outs]})
            if log:
                log(f"load probe done: {n} requests at {plan.load_rate:g}/s")
    info["model"] = model
    return info, records


# --------------------------------------------------------------------------------------------
# Step times read off token streams


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
