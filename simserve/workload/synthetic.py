"""Synthetic workloads: an arrival process plus prompt and output length distributions.

Randomness comes from one root seed split into independent streams (``SeedSequence(seed)
.spawn(4)``: arrivals, prompt lengths, output lengths, request classes), so changing one
distribution never reshuffles the others.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from simserve.errors import ConfigError
from simserve.limits import MAX_SECONDS
from simserve.workload.datasets import read_sharegpt, sample_in_order
from simserve.workload.config import ArrivalConfig, LengthDist, WorkloadConfig
from simserve.workload.spec import RequestSpec, SpecColumns


def generate(cfg: WorkloadConfig, seed: int, base_dir: Path) -> Sequence[RequestSpec]:
    """Requests of a synthetic ``cfg``, ids 0..n-1 in arrival order."""
    assert cfg.arrival is not None, "generate() needs a synthetic workload"
    arrival_rng, prompt_rng, output_rng, class_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4))
    arrival = (stage_arrivals(cfg, arrival_rng) if cfg.stages
               else arrival_times(cfg.arrival, arrival_rng))
    n = len(arrival)
    if n and not arrival[-1] <= MAX_SECONDS:   # a heavy gamma tail can still overshoot
        raise ConfigError("workload.rate", f"the arrivals drawn span {arrival[-1]:.3g} s, more "
                                           f"than the {MAX_SECONDS:g} s a run can represent")
    if cfg.lengths is not None:   # (traces.py imports pandas: only a run that reads files pays)
        from simserve.workload.traces import read_length_columns, resolve_path
    if cfg.shared_prefix is not None:
        return shared_prefix_specs(cfg, arrival)
    if cfg.lengths is not None and cfg.lengths.format == "sharegpt":
        j = cfg.lengths
        prompts, outputs = read_sharegpt(resolve_path(j.path, base_dir, "workload.lengths.path"),
                                         j.chars_per_token, j.output_len)
        rows = sample_in_order(len(prompts), n, prompt_rng)
        prompt, output = prompts[rows], outputs[rows]
    elif cfg.lengths is not None:
        # One row index per request keeps each (prompt, output) pair together; it uses the
        # prompt stream, and the output stream is left unused.
        prompts, outputs = read_length_columns(
            resolve_path(cfg.lengths.path, base_dir, "workload.lengths.path"),
            (cfg.lengths.prompt_column, cfg.lengths.output_column))
        rows = prompt_rng.integers(0, len(prompts), size=n)
        prompt, output = prompts[rows], outputs[rows]
    else:
        assert cfg.prompt is not None and cfg.output is not None
        prompt = sample_lengths(cfg.prompt, n, prompt_rng, base_dir, "workload.prompt")
        output = sample_lengths(cfg.output, n, output_rng, base_dir, "workload.output")
    # a shared prefix (vLLM's --random-prefix-len): the same leading tokens for everyone, named
    # by one tuple of ids (cfg.hash_block_tokens tokens each) that every request shares
    shared = None
    if cfg.prefix_len:
        prompt = prompt + cfg.prefix_len
        shared = tuple(range(cfg.prefix_len // cfg.hash_block_tokens))
    # as columns: each RequestSpec is made when the engine reads it (memory: workload/spec.py)
    if not cfg.classes:
        return SpecColumns(arrival, prompt, output, shared)
    weights = np.array([c.weight for c in cfg.classes])
    drawn = class_rng.choice(len(cfg.classes), size=n, p=weights / weights.sum())
    return SpecColumns(arrival, prompt, output, shared, drawn,
                       [(c.priority, c.name) for c in cfg.classes])


def stage_arrivals(cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    """Arrivals of load stages run back to back: each stage sends at its rate for its
    duration, from the time the previous stage's duration ended (a harness that waits for a
    stage to drain starts the next one a little later: not modelled)."""
    assert cfg.arrival is not None
    parts, start = [], 0.0
    for st in cfg.stages:
        a = arrival_times(ArrivalConfig(cfg.arrival.process, st.rate, 1.0, None, st.duration_s),
                          rng)
        parts.append(a + start)
        start += st.duration_s
    return np.concatenate(parts) if parts else np.zeros(0)


def shared_prefix_specs(cfg: WorkloadConfig, arrival: np.ndarray) -> SpecColumns:
    """inference-perf's shared_prefix prompts: request i is user i mod (G·U)'s, its prompt the
    group's system prompt then the user's question. Each user's ``hash_ids`` (one entry per
    ``system_prompt_len`` tokens): the group's system prompt, then ids of the user's own."""
    sp = cfg.shared_prefix
    assert sp is not None
    n, users = len(arrival), sp.num_users
    prompt_len = sp.system_prompt_len + sp.question_len
    per_user = -(-prompt_len // sp.system_prompt_len)           # entries covering the prompt
    tables = [(u // sp.num_users_per_system_prompt,)
              + tuple(sp.num_unique_system_prompts + u * per_user + j
                      for j in range(per_user - 1))
              for u in range(users)]
    user = np.arange(n, dtype=np.int64) % users
    return SpecColumns(arrival, np.full(n, prompt_len), np.full(n, sp.output_len),
                       hash_tables=(user, tables))


def arrival_times(cfg: ArrivalConfig, rng: np.random.Generator) -> np.ndarray:
    """Non-decreasing arrival times in seconds; the first request arrives at t = 0.

    With ``duration_s`` the times are those of the process that fall in ``[0, duration_s)``.
    """
    if cfg.process == "burst" or cfg.rate == math.inf:   # rate: inf is vLLM's burst
        assert cfg.num_requests is not None
        return np.zeros(cfg.num_requests)
    assert cfg.rate is not None
    if cfg.process == "constant":
        # i / rate rather than a cumulative sum, so the spacing is exact and does not drift.
        n = cfg.num_requests or math.ceil(cfg.duration_s * cfg.rate) + 1
        t = np.arange(n) / cfg.rate
        return t if cfg.num_requests else t[t < cfg.duration_s]
    if cfg.num_requests is not None:
        return np.concatenate(([0.0], np.cumsum(_gaps(cfg, rng, cfg.num_requests - 1))))
    # Duration mode: draw gaps in chunks of about the expected count until past the end.
    chunk = int(cfg.duration_s * cfg.rate) + 16
    parts, last = [np.zeros(1)], 0.0
    while last < cfg.duration_s:
        parts.append(last + np.cumsum(_gaps(cfg, rng, chunk)))
        last = float(parts[-1][-1])
    t = np.concatenate(parts)
    return t[t < cfg.duration_s]


def _gaps(cfg: ArrivalConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    if cfg.process == "poisson":
        return rng.exponential(1.0 / cfg.rate, size=n)
    # gamma: mean shape * scale = 1 / rate, CV = 1 / sqrt(shape)
    return rng.gamma(cfg.burstiness, 1.0 / (cfg.rate * cfg.burstiness), size=n)


def sample_lengths(d: LengthDist, n: int, rng: np.random.Generator, base_dir: Path,
                   field: str) -> np.ndarray:
    """``n`` token counts from ``d``, rounded and clipped to ``[d.min, d.max]`` (int64).

    ``field`` is the config path of ``d``, used to name it if its lengths file is missing.
    """
    if d.dist == "fixed":
        x = np.full(n, float(d.value))
    elif d.dist == "uniform":
        x = rng.integers(d.low, d.high, size=n, endpoint=True)
    elif d.dist == "normal":
        x = rng.normal(d.mean, d.std, size=n)
    elif d.dist == "lognormal":
        # mean is E[X] in tokens: E[exp(N(mu, s^2))] = exp(mu + s^2/2), so mu = ln(mean) - s^2/2
        x = rng.lognormal(math.log(d.mean) - d.sigma ** 2 / 2, d.sigma, size=n)
    elif d.dist == "exponential":
        x = rng.exponential(d.mean, size=n)
    elif d.dist == "truncated_exponential":
        # inverse CDF of the exponential conditioned on X <= max: one uniform per draw, the
        # same distribution as redrawing every sample above max
        x = -d.mean * np.log1p(-rng.random(n) * -np.expm1(-d.max / d.mean))
    elif d.dist == "zipf":
        # Inverse CDF over the finite support 1..max. cdf[-1] == 1 exactly and u < 1, so the
        # index is at most max - 1 and the value at most max.
        weights = np.arange(1, d.max + 1, dtype=float) ** -d.a
        cdf = np.cumsum(weights)
        cdf /= cdf[-1]
        x = np.searchsorted(cdf, rng.random(n), side="right") + 1
    elif d.dist == "empirical":
        from simserve.workload.traces import read_length_columns, resolve_path
        (values,) = read_length_columns(resolve_path(d.path, base_dir, f"{field}.path"),
                                        (d.column,))
        x = values[rng.integers(0, len(values), size=n)]
    else:
        raise AssertionError(f"unhandled dist {d.dist!r}")
    # Without a max, 2**53 still bounds an overflowing heavy tail (inf) to a valid int64.
    upper = d.max if d.max is not None else 2 ** 53
    return np.clip(np.rint(x), d.min, upper).astype(np.int64)
