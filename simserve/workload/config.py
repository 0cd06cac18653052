"""The ``workload:`` section of a scenario: synthetic arrivals and lengths, or a trace replay.

Parsing and validation happen once, in :meth:`WorkloadConfig.from_fields`, so every error names
its field path (``workload.prompt.sigma``). The dataclasses are plain frozen records; build a
variant with ``dataclasses.replace`` or, to get it validated again, with
``WorkloadConfig.from_fields(Fields(modified_dict, "workload"))``.

Synthetic::

    workload:
      arrival: poisson          # poisson | gamma | constant | burst
      rate: 4.0                 # requests/s (not for burst)
      num_requests: 500         # or duration: 120 (seconds); burst needs num_requests
      prompt: {dist: lognormal, mean: 1000, sigma: 0.8, max: 8192}
      output: {dist: uniform, low: 16, high: 512}
      # or, instead of prompt/output, (prompt, output) pairs from one CSV row:
      # lengths: {path: lengths.csv, prompt_column: p, output_column: o}

Trace::

    workload:
      trace: traces/azure_conv.csv
      format: azure             # azure | mooncake | burstgpt | csv
      time_scale: 1.0           # or rate: 3.0 (mean rate after rescaling)
      start_s: 0                # window on the original trace clock
      end_s: 600
      num_requests: 1000        # cap, first N after windowing

Either kind may name request classes (priority: lower is served first; slo: limits that replace
the scenario's for that class). A synthetic workload draws each request's class by ``weight``
from its own stream (the root seed's fourth child); a trace names it in a ``class`` column (csv)
or field (mooncake), and may give a ``priority`` column/field, which wins over the class's::

      classes:
        - {name: interactive, priority: 0, weight: 3, slo: {ttft_ms: 200}}
        - {name: batch, priority: 1, weight: 1}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from simserve.errors import ConfigError
from simserve.fields import Fields
from simserve.limits import MAX_REQUESTS, MAX_SECONDS, MAX_TOKENS, MAX_ZIPF_SUPPORT
from simserve.workload.spec import SOURCE_BLOCK_SIZE

ARRIVALS = ("poisson", "gamma", "constant", "burst")
TRACE_FORMATS = ("azure", "mooncake", "burstgpt", "csv")

# Parameters each length distribution takes besides the common ``min``/``max`` clipping.
# For zipf ``max`` is also the top of its support, so it is required there.
DIST_PARAMS: dict[str, tuple[str, ...]] = {
    "fixed": ("value",),
    "uniform": ("low", "high"),
    "normal": ("mean", "std"),
    "lognormal": ("mean", "sigma"),
    "exponential": ("mean",),
    "truncated_exponential": ("mean",),
    "zipf": ("a",),
    "empirical": ("path", "column"),
}


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts; samples are rounded to int and clipped to [min, max].

    ``lognormal``'s ``mean`` is the mean of the distribution in tokens (not of its log):
    the underlying normal has ``mu = ln(mean) - sigma**2 / 2``, so ``E[X] = mean``.
    ``exponential`` has mean ``mean`` and is clipped to ``[min, max]`` (a *capped* exponential:
    the mass past ``max`` lands on ``max``, the Anyscale latency test's "capped exponential");
    ``truncated_exponential`` (``max`` required) keeps only draws ``<= max`` (rejection, as the
    Anyscale throughput test "select[s] only samples ... less than or equal to" its cap; drawn
    by inverse CDF, so the mean is below ``mean``).
    ``zipf`` draws ``k`` in ``1..max`` with probability proportional to ``k**-a``.
    ``empirical`` resamples (with replacement) the values of ``column`` in the CSV at ``path``.
    """

    dist: str
    value: int | None = None        # fixed
    low: int | None = None          # uniform, inclusive
    high: int | None = None         # uniform, inclusive
    mean: float | None = None       # normal, lognormal, exponential, truncated_exponential
    std: float | None = None        # normal
    sigma: float | None = None      # lognormal (of the underlying normal)
    a: float | None = None          # zipf exponent, > 1
    path: str | None = None         # empirical, relative to the scenario file's directory
    column: str | None = None       # empirical
    min: int = 1
    max: int | None = None

    @staticmethod
    def from_fields(f: Fields) -> LengthDist:
        """Parse one distribution mapping such as ``{dist: uniform, low: 16, high: 512}``."""
        dist = f.str("dist", choices=tuple(DIST_PARAMS))
        kw: dict[str, Any] = {}
        if dist == "fixed":
            kw["value"] = f.int("value", min=1, max=MAX_TOKENS)
        elif dist == "uniform":
            kw["low"] = f.int("low", min=1, max=MAX_TOKENS)
            kw["high"] = f.int("high", min=kw["low"], max=MAX_TOKENS)
        elif dist == "normal":
            kw["mean"] = f.float("mean", positive=True, max=MAX_TOKENS)
            kw["std"] = f.float("std", min=0, max=MAX_TOKENS)
        elif dist == "lognormal":
            kw["mean"] = f.float("mean", positive=True, max=MAX_TOKENS)
            # exp(N(mu, sigma)) with sigma past 20 spans e^±60 (10^26) around the median
            kw["sigma"] = f.float("sigma", min=0, max=20.0)
        elif dist in ("exponential", "truncated_exponential"):
            kw["mean"] = f.float("mean", positive=True, max=MAX_TOKENS)
        elif dist == "zipf":
            a = f.float("a")
            if a <= 1:
                raise ConfigError(f.where("a"), f"must be > 1, got {a:g}")
            kw["a"] = a
        else:  # empirical
            kw["path"] = f.str("path")
            kw["column"] = f.str("column")
        lo = f.int("min", 1, min=1, max=MAX_TOKENS)
        # zipf tabulates its support 1..max, so its max is bounded by memory, not by int32
        hi = f.int("max", None, min=lo, max=MAX_ZIPF_SUPPORT if dist == "zipf" else MAX_TOKENS)
        if dist == "zipf" and hi is None:
            raise f.missing("max", "is required for dist: zipf (top of its support)")
        if dist == "truncated_exponential" and hi is None:
            raise f.missing("max", "is required for dist: truncated_exponential (the cap "
                                   "above which draws are rejected)")
        f.done()
        return LengthDist(dist=dist, min=lo, max=hi, **kw)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dist": self.dist}
        for name in DIST_PARAMS[self.dist]:
            out[name] = getattr(self, name)
        out["min"] = self.min
        if self.max is not None:
            out["max"] = self.max
        return out


LENGTH_FORMATS = ("csv", "sharegpt")


@dataclass(frozen=True)
class JointLengths:
    """(prompt, output) pairs drawn together, keeping their correlation: from one CSV row
    (``format: csv``, drawn with replacement), or from a ShareGPT JSON file (``format:
    sharegpt``, sampled as ``vllm bench serve --dataset-name sharegpt`` does, token counts
    estimated: simserve/workload/datasets.py)."""

    path: str
    prompt_column: str | None = None        # csv
    output_column: str | None = None        # csv
    format: str = "csv"
    output_len: int | None = None           # sharegpt: every output this long (vLLM's
                                            # --sharegpt-output-len); None: the completion's
    chars_per_token: float = 4.0            # sharegpt: characters per estimated token

    @staticmethod
    def from_fields(f: Fields) -> JointLengths:
        fmt = f.str("format", "csv", choices=LENGTH_FORMATS)
        if fmt == "csv":
            out = JointLengths(f.str("path"), f.str("prompt_column"), f.str("output_column"))
        else:
            out = JointLengths(f.str("path"), format=fmt,
                               output_len=f.int("output_len", None, min=1, max=MAX_TOKENS),
                               chars_per_token=f.float("chars_per_token", 4.0, min=0.5,
                                                       max=100.0))
        f.done()
        return out

    def to_dict(self) -> dict[str, Any]:
        if self.format == "csv":
            return {"path": self.path, "prompt_column": self.prompt_column,
                    "output_column": self.output_column}
        out: dict[str, Any] = {"format": self.format, "path": self.path,
                               "chars_per_token": self.chars_per_token}
        if self.output_len is not None:
            out["output_len"] = self.output_len
        return out


@dataclass(frozen=True)
class ArrivalConfig:
    """When synthetic requests arrive. The first request arrives at t = 0.

    ``gamma`` inter-arrival times have shape ``burstiness`` and scale
    ``1 / (rate * burstiness)`` (as ``vllm bench serve --burstiness``): the mean stays
    ``1 / rate`` and the coefficient of variation is ``1 / sqrt(burstiness)``; 1.0 is Poisson.
    """

    process: str = "poisson"
    rate: float | None = None           # requests/s (inf: all at t = 0); None for burst
    burstiness: float = 1.0             # gamma only
    num_requests: int | None = None     # exactly one of num_requests and duration_s
    duration_s: float | None = None     # keep arrivals with t < duration_s


@dataclass(frozen=True)
class SharedPrefix:
    """inference-perf's ``shared_prefix`` data generator, with its names: ``G =
    num_unique_system_prompts`` groups of ``U = num_users_per_system_prompt`` users; a user's
    prompt is its group's system prompt (``system_prompt_len`` tokens, shared by the group)
    followed by its own question (``question_len``); every request asks for ``output_len``
    tokens. Request ``i`` is user ``i mod (G·U)``'s (groups in turn, a group's users in turn), so
    each prompt recurs every ``G·U`` requests and prefix caching serves it from cache."""

    num_unique_system_prompts: int
    num_users_per_system_prompt: int
    system_prompt_len: int
    question_len: int
    output_len: int

    @property
    def num_users(self) -> int:
        return self.num_unique_system_prompts * self.num_users_per_system_prompt

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _SHARED_PREFIX_KEYS}


_SHARED_PREFIX_KEYS = ("num_unique_system_prompts", "num_users_per_system_prompt",
                       "system_prompt_len", "question_len", "output_len")


@dataclass(frozen=True)
class Stage:
    """One load stage (inference-perf's ``load.stages``): ``rate`` requests/s for ``duration``
    seconds; stages run one after another."""

    rate: float
    duration_s: float


@dataclass(frozen=True)
class TraceConfig:
    """Replay of a recorded trace. Times are seconds; the window is on the original clock,
    measured from the trace's first request; the kept requests are shifted to start at 0 and
    then rescaled (``time_scale`` multiplies gaps; ``rate`` makes (n - 1) / last_arrival equal it).
    """

    path: str
    format: str
    time_scale: float = 1.0
    rate: float | None = None
    start_s: float | None = None
    end_s: float | None = None
    num_requests: int | None = None
    max_prompt_tokens: int | None = None
    max_output_tokens: int | None = None
    model: str | None = None            # burstgpt only: keep rows of this Model


# TraceConfig fields written by to_dict only when set.
_TRACE_OPTIONAL = ("start_s", "end_s", "num_requests", "max_prompt_tokens",
                   "max_output_tokens", "model")


_SLO_LIMITS = ("ttft_ms", "tpot_ms", "e2el_ms")


@dataclass(frozen=True)
class RequestClass:
    """A class of requests: its name, its priority (lower = served first, as vLLM's), its share
    of a synthetic workload (``weight``, relative) and SLO limits that replace the scenario's
    ``slo`` limits of the same names for its requests (the others still apply)."""

    name: str
    priority: int = 0
    weight: float = 1.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @staticmethod
    def from_fields(f: Fields, synthetic: bool) -> RequestClass:
        name = f.str("name")
        priority = f.int("priority", 0)
        if f.has("weight") and not synthetic:
            raise ConfigError(f.where("weight"), "only applies to synthetic workloads (a "
                                                 "trace names each request's class)")
        weight = f.float("weight", 1.0, positive=True, max=1e9)
        slo = f.section("slo")
        limits = {k: slo.float(k, None, positive=True) for k in _SLO_LIMITS}
        slo.done()
        f.done()
        return RequestClass(name, priority, weight, **limits)

    def to_dict(self, synthetic: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "priority": self.priority}
        if synthetic:
            out["weight"] = self.weight
        slo = {k: getattr(self, k) for k in _SLO_LIMITS if getattr(self, k) is not None}
        if slo:
            out["slo"] = slo
        return out


def _parse_classes(f: Fields, synthetic: bool) -> tuple[RequestClass, ...]:
    raw = f.any("classes", None)
    if raw is None:
        return ()
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f.where("classes"), "expected a non-empty list of "
                                              "{name, priority, weight, slo} mappings")
    classes = tuple(RequestClass.from_fields(Fields(item, f"{f.where('classes')}[{i}]"),
                                             synthetic) for i, item in enumerate(raw))
    names = [c.name for c in classes]
    if len(set(names)) != len(names):
        raise ConfigError(f.where("classes"), f"class names must be unique, got {names}")
    return classes


@dataclass(frozen=True)
class WorkloadConfig:
    """Either a synthetic workload (``arrival`` plus ``prompt``/``output`` or ``lengths``)
    or a trace replay (``trace``); optionally request ``classes`` (priorities, per-class SLOs).
    """

    arrival: ArrivalConfig | None = None
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    lengths: JointLengths | None = None
    trace: TraceConfig | None = None
    classes: tuple[RequestClass, ...] = ()
    # synthetic: every prompt starts with the same prefix_len tokens, then its drawn length
    # (vllm bench serve --random-prefix-len); prefix caching sees them as shared
    prefix_len: int = 0
    # at most this many requests in flight; one due while all are taken is sent when one ends
    # (vllm bench serve --max-concurrency; simserve/clients.py)
    max_concurrency: int | None = None
    # inference-perf's shared_prefix prompts (instead of prompt/output) and its load stages
    # (instead of one rate; arrival is then constant or poisson within each stage)
    shared_prefix: SharedPrefix | None = None
    stages: tuple[Stage, ...] = ()

    @property
    def type(self) -> str:
        return "trace" if self.trace is not None else "synthetic"

    @property
    def hash_block_tokens(self) -> int:
        """Prompt tokens per ``hash_ids`` entry of this workload's requests: 512 for Mooncake
        traces; for a shared synthetic prefix, a block size that divides it (so the prefix
        ends on a block boundary and every engine block inside it is shared exactly); for
        ``shared_prefix`` prompts the system prompt's length (entry 0 names the group's system
        prompt, the later ones the user's question, so an engine block that straddles the two
        belongs to the user alone, as its content does)."""
        if self.shared_prefix is not None:
            return self.shared_prefix.system_prompt_len
        return math.gcd(self.prefix_len, SOURCE_BLOCK_SIZE) if self.prefix_len \
            else SOURCE_BLOCK_SIZE

    @staticmethod
    def from_fields(f: Fields) -> WorkloadConfig:
        """Parse and validate ``f`` (``Fields(raw, "workload")``); raises ConfigError."""
        kind = f.str("type", "trace" if f.has("trace") else "synthetic",
                     choices=("synthetic", "trace"))
        cfg = _parse_trace(f) if kind == "trace" else _parse_synthetic(f)
        classes = _parse_classes(f, synthetic=kind == "synthetic")
        limit = f.int("max_concurrency", None, min=1, max=MAX_REQUESTS)
        f.done()
        if limit is not None:
            cfg = replace(cfg, max_concurrency=limit)
        return replace(cfg, classes=classes) if classes else cfg

    def to_dict(self) -> dict[str, Any]:
        """A plain, YAML-serialisable mapping that :meth:`from_fields` parses back to ``self``."""
        out = self._source_dict()
        if self.max_concurrency is not None:
            out["max_concurrency"] = self.max_concurrency
        if self.classes:
            out["classes"] = [c.to_dict(self.trace is None) for c in self.classes]
        return out

    def _source_dict(self) -> dict[str, Any]:
        if self.trace is not None:
            t = self.trace
            out: dict[str, Any] = {"type": "trace", "trace": t.path, "format": t.format}
            if t.rate is not None:
                out["rate"] = t.rate
            else:
                out["time_scale"] = t.time_scale
            for name in _TRACE_OPTIONAL:
                if getattr(t, name) is not None:
                    out[name] = getattr(t, name)
            return out
        a = self.arrival
        assert a is not None, "a synthetic workload needs an arrival config"
        out = {"type": "synthetic", "arrival": a.process}
        if a.rate is not None:
            out["rate"] = a.rate
        if a.process == "gamma":
            out["burstiness"] = a.burstiness
        if self.stages:
            out["stages"] = [{"rate": st.rate, "duration": st.duration_s} for st in self.stages]
        elif a.num_requests is not None:
            out["num_requests"] = a.num_requests
        if a.duration_s is not None and not self.stages:
            out["duration"] = a.duration_s
        if self.shared_prefix is not None:
            out["shared_prefix"] = self.shared_prefix.to_dict()
            return out
        if self.prefix_len:
            out["prefix_len"] = self.prefix_len
        if self.lengths is not None:
            out["lengths"] = self.lengths.to_dict()
        else:
            assert self.prompt is not None and self.output is not None
            out["prompt"] = self.prompt.to_dict()
            out["output"] = self.output.to_dict()
        return out


def _parse_stages(f: Fields) -> tuple[Stage, ...]:
    raw = f.any("stages")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f.where("stages"), "expected a non-empty list of {rate, duration}")
    stages = []
    for i, item in enumerate(raw):
        g = Fields(item, f"{f.where('stages')}[{i}]")
        rate = g.float("rate", positive=True, max=1e9)
        duration = g.float("duration", positive=True, max=MAX_SECONDS)
        g.done()
        stages.append(Stage(rate, duration))
    total = sum(st.duration_s for st in stages)
    if total > MAX_SECONDS:
        raise ConfigError(f.where("stages"), f"the stages last {total:.3g} s, more than the "
                                             f"{MAX_SECONDS:g} s a run can represent")
    count = sum(st.rate * st.duration_s for st in stages)
    if count > MAX_REQUESTS:
        raise ConfigError(f.where("stages"), f"the stages send about {count:.3g} requests, "
                                             f"more than the {MAX_REQUESTS:,} a run can hold")
    return tuple(stages)


def _parse_shared_prefix(f: Fields) -> SharedPrefix:
    g = f.section("shared_prefix")
    g.only(_SHARED_PREFIX_KEYS)
    sp = SharedPrefix(*(g.int(k, min=1, max=MAX_TOKENS if k.endswith("_len") else 1_000_000)
                        for k in _SHARED_PREFIX_KEYS))
    g.done()
    return sp


def _parse_synthetic(f: Fields) -> WorkloadConfig:
    if f.has("stages"):
        process = f.str("arrival", "constant", choices=("constant", "poisson"))
        for key in ("rate", "num_requests", "duration", "burstiness"):
            if f.has(key):
                raise ConfigError(f.where(key), "give either stages or rate/num_requests/"
                                                "duration, not both")
        stages = _parse_stages(f)
        arrival = ArrivalConfig(process, None, 1.0, None,
                                sum(st.duration_s for st in stages))
        if not f.has("shared_prefix"):
            raise ConfigError(f.where("stages"), "stages apply to shared_prefix workloads; "
                                                 "give shared_prefix")
        for name in ("prompt", "output", "lengths", "prefix_len"):
            if f.has(name):
                raise ConfigError(f.where(name), "shared_prefix sets the lengths; remove it")
        return WorkloadConfig(arrival=arrival, shared_prefix=_parse_shared_prefix(f),
                              stages=stages)
    process = f.str("arrival", "poisson", choices=ARRIVALS)
    if process == "burst":
        if f.any("rate", None) is not None:
            raise ConfigError(f.where("rate"), "does not apply to arrival: burst "
                              "(all requests arrive at t = 0)")
        rate = None
    elif _is_inf(f.any("rate", None)):
        # vllm bench serve --request-rate inf: every request is sent at once (t = 0)
        rate = math.inf
        if f.has("duration"):
            raise ConfigError(f.where("rate"), "inf sends every request at once; give "
                                               "num_requests, not duration")
    else:
        rate = f.float("rate", positive=True)
    if f.has("burstiness") and process != "gamma":
        raise ConfigError(f.where("burstiness"), f"only applies to arrival: gamma, "
                          f"not {process}")
    # gamma gaps of shape below 1e-3 are almost all 0 with a rare astronomically long one
    burstiness = f.float("burstiness", 1.0, min=1e-3, max=1e6)
    if f.has("num_requests") and f.has("duration"):
        raise ConfigError(f.where("duration"), "give either num_requests or duration, not both")
    num_requests = f.int("num_requests", None, min=1, max=MAX_REQUESTS)
    duration = f.float("duration", None, positive=True, max=MAX_SECONDS)
    if num_requests is None and (duration is None or process == "burst"):
        need = "is required for arrival: burst" if duration is not None else \
            "is required (or give duration in seconds)"
        raise f.missing("num_requests", need)
    if rate is not None:
        _check_span(f, rate, num_requests, duration)
    arrival = ArrivalConfig(process, rate, burstiness, num_requests, duration)
    prefix_len = f.int("prefix_len", 0, min=0, max=MAX_TOKENS)
    if f.has("shared_prefix"):
        for name in ("prompt", "output", "lengths", "prefix_len"):
            if f.has(name):
                raise ConfigError(f.where(name), "shared_prefix sets the lengths; remove it")
        return WorkloadConfig(arrival=arrival, shared_prefix=_parse_shared_prefix(f))

    if f.has("lengths"):
        for name in ("prompt", "output"):
            if f.any(name, None) is not None:
                raise ConfigError(f.where(name), "give either lengths (joint pairs) or "
                                  "prompt and output, not both")
        return WorkloadConfig(arrival=arrival, prefix_len=prefix_len,
                              lengths=JointLengths.from_fields(f.section("lengths")))
    return WorkloadConfig(arrival=arrival, prefix_len=prefix_len,
                          prompt=LengthDist.from_fields(f.section("prompt")),
                          output=LengthDist.from_fields(f.section("output")))


def _is_inf(value: Any) -> bool:
    """``rate: inf`` as vLLM spells it (``--request-rate inf``), or YAML's ``.inf``."""
    if isinstance(value, str):
        return value.strip().lower() in ("inf", "infinity", "+inf")
    return isinstance(value, float) and value == math.inf


def _check_span(f: Fields, rate: float, num_requests: int | None,
                duration: float | None) -> None:
    """What the rate implies must fit a run: the requests of a duration, the time of a count."""
    if duration is not None and rate * duration > MAX_REQUESTS:
        raise ConfigError(f.where("rate"), f"{rate:g} req/s for {duration:g} s is about "
                                           f"{rate * duration:.3g} requests, more than the "
                                           f"{MAX_REQUESTS:,} a run can hold")
    if num_requests is not None and (num_requests - 1) / rate > MAX_SECONDS:
        raise ConfigError(f.where("rate"), f"{num_requests} requests at {rate:g} req/s span "
                                           f"about {(num_requests - 1) / rate:.3g} s, more than "
                                           f"the {MAX_SECONDS:g} s a run can represent")


def _parse_trace(f: Fields) -> WorkloadConfig:
    path = f.str("trace")
    fmt = f.str("format", choices=TRACE_FORMATS)
    if f.has("time_scale") and f.has("rate"):
        raise ConfigError(f.where("rate"), "give either time_scale or rate, not both")
    time_scale = f.float("time_scale", 1.0, positive=True)
    rate = f.float("rate", None, positive=True)
    start = f.float("start_s", None, min=0)
    end = f.float("end_s", None, positive=True)
    if start is not None and end is not None and end <= start:
        raise ConfigError(f.where("end_s"), f"must be > start_s ({start:g}), got {end:g}")
    if f.has("model") and fmt != "burstgpt":
        raise ConfigError(f.where("model"), f"only applies to format: burstgpt, not {fmt}")
    return WorkloadConfig(trace=TraceConfig(
        path=path, format=fmt, time_scale=time_scale, rate=rate, start_s=start, end_s=end,
        num_requests=f.int("num_requests", None, min=1, max=MAX_REQUESTS),
        max_prompt_tokens=f.int("max_prompt_tokens", None, min=1, max=MAX_TOKENS),
        max_output_tokens=f.int("max_output_tokens", None, min=1, max=MAX_TOKENS),
        model=f.str("model", None)))
