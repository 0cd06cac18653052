"""The search space of ``simserve plan``: what may vary, and the candidate deployments in it.

A ``plan:`` section (in the scenario, or a plan file of its own) lists the values tried for each
knob; every combination is one :class:`Candidate`, the scenario with those fields set::

    plan:
      hardware: [H100-SXM, A100-80GB, L40S]   # default: the scenario's hardware
      tensor_parallel_size: [1, 2, 4, 8]        # default [1, 2, 4, 8]
      pipeline_parallel_size: [1, 2]            # default [1]
      expert_parallel: [false, true]            # default [false]; true needs a MoE model
      disaggregation: [colocated, "1:1", "1:2"] # colocated, or prefill:decode replica ratios
      max_num_batched_tokens: [2048, 8192]      # default: the scenario's
      max_num_seqs: [128, 256]                  # default: the scenario's
      prices: {H100-SXM: 2.99}                  # USD per GPU-hour; default data/prices.yaml
      max_replicas: 64                          # most replicas a deployment may have
      seeds: 1                                  # seeds per capacity probe
      tolerance: 0.1                            # capacity bisection's relative bracket
      runners_up: 4                             # deployments reported after the cheapest
      wave: 4                                   # candidates simulated between prunings
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from simserve.cards import DATA_DIR, load_hardware
from simserve.cluster.config import LINKS
from simserve.errors import ConfigError, DataError
from simserve.fields import Fields
from simserve.plan.values import as_list, plain

COLOCATED = "colocated"
DEFAULT_TP = (1, 2, 4, 8)
MAX_CANDIDATES = 100_000        # an enumeration past this is a typo, not a plan
MAX_RATIO = 64                  # largest prefill or decode share of a P:D ratio


@dataclass(frozen=True)
class Price:
    per_hour: float             # USD per GPU-hour
    source: str                 # where the number comes from (an assumption unless yours)


@functools.cache
def default_prices() -> dict[str, Price]:
    """The shipped price table (``data/prices.yaml``): labelled assumptions, each with a
    source and date."""
    path = DATA_DIR / "prices.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DataError(path, f"cannot read: {e}") from None
    return {name: Price(float(v["price_per_hour"]), str(v["source"]))
            for name, v in raw.items()}


GIVEN_PRICE = "given in the plan"     # a price's source when the plan gives it


@dataclass(frozen=True)
class PlanSpace:
    """What ``simserve plan`` varies (module docstring), as read from a ``plan:`` mapping."""

    hardware: tuple[Any, ...]               # names or inline hardware mappings
    tensor_parallel_size: tuple[int, ...] = DEFAULT_TP
    pipeline_parallel_size: tuple[int, ...] = (1,)
    expert_parallel: tuple[bool, ...] = (False,)
    disaggregation: tuple[str, ...] = (COLOCATED,)
    max_num_batched_tokens: tuple[int | None, ...] = (None,)   # None: the scenario's
    max_num_seqs: tuple[int | None, ...] = (None,)
    prices: Mapping[str, Price] = field(default_factory=dict)  # by hardware name
    kv_transfer: str = "nvlink"
    max_replicas: int = 64
    seeds: int = 1
    tolerance: float = 0.1
    runners_up: int = 4
    wave: int = 4

    @classmethod
    def from_mapping(cls, raw: Any, scenario_raw: Mapping[str, Any],
                     where: str = "plan") -> PlanSpace:
        """Read a ``plan:`` mapping; ``scenario_raw`` supplies the defaults (its hardware)."""
        if raw is None:
            raw = {}
        f = Fields(plain(raw), where)       # NumPy values as Python's (values.py)
        hardware = _list(f, "hardware", [scenario_raw.get("hardware")])
        tp = _ints(f, "tensor_parallel_size", list(DEFAULT_TP))
        pp = _ints(f, "pipeline_parallel_size", [1])
        ep = _list(f, "expert_parallel", [False])
        for i, v in enumerate(ep):
            if not isinstance(v, bool):
                raise ConfigError(f"{f.where('expert_parallel')}[{i}]",
                                  f"expected true or false, got {v!r}")
        modes = [_mode(f.where("disaggregation"), i, v)
                 for i, v in enumerate(_list(f, "disaggregation", [COLOCATED]))]
        mbt = _ints(f, "max_num_batched_tokens", [None])
        seqs = _ints(f, "max_num_seqs", [None])
        given = f.any("prices", {})
        if not isinstance(given, Mapping):
            raise ConfigError(f.where("prices"), "expected a mapping of HARDWARE: USD per "
                                                 "GPU-hour")
        prices = dict(default_prices())
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not 0 < value < 1e6:
                raise ConfigError(f"{f.where('prices')}.{name}",
                                  f"expected a price per GPU-hour > 0, got {value!r}")
            for known in [k for k in prices if k.lower() == str(name).lower()]:
                del prices[known]          # (a card's name in another case: one price)
            prices[str(name)] = Price(float(value), GIVEN_PRICE)
        space = cls(
            hardware=tuple(hardware), tensor_parallel_size=tuple(tp),
            pipeline_parallel_size=tuple(pp), expert_parallel=tuple(ep),
            disaggregation=tuple(modes), max_num_batched_tokens=tuple(mbt),
            max_num_seqs=tuple(seqs), prices=prices,
            kv_transfer=f.str("kv_transfer", "nvlink", choices=tuple(LINKS)),
            max_replicas=f.int("max_replicas", 64, min=1, max=4096),
            seeds=f.int("seeds", 1, min=1, max=100),
            tolerance=f.float("tolerance", 0.1, min=1e-3, max=0.99),
            runners_up=f.int("runners_up", 4, min=0, max=100),
            wave=f.int("wave", 4, min=1, max=10_000))
        f.done()
        if space.size > MAX_CANDIDATES:
            raise ConfigError(where, f"{space.size:,} combinations, more than the "
                                     f"{MAX_CANDIDATES:,} a plan enumerates; give fewer values")
        return space

    @property
    def size(self) -> int:
        n = 1
        for axis in (self.hardware, self.tensor_parallel_size, self.pipeline_parallel_size,
                     self.expert_parallel, self.disaggregation, self.max_num_batched_tokens,
                     self.max_num_seqs):
            n *= len(axis)
        return n

    def price(self, hardware_name: str, where: str) -> Price:
        """The price of one GPU-hour of ``hardware_name``; ConfigError naming ``where``
        (the plan's prices) if there is none."""
        match = {k.lower(): v for k, v in self.prices.items()}.get(hardware_name.lower())
        if match is None:
            raise ConfigError(f"{where}.prices.{hardware_name}",
                              f"no price per GPU-hour for {hardware_name} (the shipped table "
                              f"has {', '.join(default_prices())}); give one in the plan")
        return match

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": list(self.hardware),
            "tensor_parallel_size": list(self.tensor_parallel_size),
            "pipeline_parallel_size": list(self.pipeline_parallel_size),
            "expert_parallel": list(self.expert_parallel),
            "disaggregation": list(self.disaggregation),
            "max_num_batched_tokens": list(self.max_num_batched_tokens),
            "max_num_seqs": list(self.max_num_seqs),
            "prices": {k: {"price_per_hour": v.per_hour, "source": v.source}
                       for k, v in sorted(self.prices.items())},
            "kv_transfer": self.kv_transfer, "max_replicas": self.max_replicas,
            "seeds": self.seeds, "tolerance": self.tolerance,
            "runners_up": self.runners_up, "wave": self.wave,
        }


def _list(f: Fields, name: str, default: list) -> list:
    value = f.any(name, None)
    if value is None:
        return default
    values = as_list(value)
    value = [value] if values is None else values       # a lone value: a list of one
    if not value:
        raise ConfigError(f.where(name), "the search space is empty: give at least one value")
    if len({repr(v) for v in value}) != len(value):
        raise ConfigError(f.where(name), f"values repeat: {value}")
    return value


def _ints(f: Fields, name: str, default: list) -> list:
    values = _list(f, name, default)
    for i, v in enumerate(values):
        if v is None and default == [None]:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 31:
            raise ConfigError(f"{f.where(name)}[{i}]", f"expected a positive integer, got {v!r}")
    return values


def _mode(where: str, i: int, v: Any) -> str:
    """``colocated`` or ``P:D`` (prefill and decode replicas of one copy)."""
    if v == COLOCATED:
        return v
    parts = str(v).split(":")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        p, d = (int(x) for x in parts)
        if 1 <= p <= MAX_RATIO and 1 <= d <= MAX_RATIO:
            return f"{p}:{d}"
    raise ConfigError(f"{where}[{i}]", f"expected colocated or a prefill:decode ratio such as "
                                       f"\"1:2\" (each 1..{MAX_RATIO}), got {v!r}")


@dataclass(frozen=True)
class Candidate:
    """One deployment: a replica's hardware, parallelism and knobs, colocated or as a copy of
    ``prefill`` + ``decode`` replicas; the scenario's fields it sets are :meth:`fields`."""

    index: int
    hardware: str                 # the card's name
    hardware_spec: Any            # as given in the plan (a name or an inline mapping)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    expert_parallel: bool
    mode: str                     # "colocated" or "P:D"
    max_num_batched_tokens: int | None
    max_num_seqs: int | None
    price_per_hour: float

    @property
    def prefill_decode(self) -> tuple[int, int]:
        if self.mode == COLOCATED:
            return 0, 0
        p, d = self.mode.split(":")
        return int(p), int(d)

    @property
    def unit_replicas(self) -> int:
        """Replicas in one copy of the deployment (its P + D, or 1 colocated)."""
        p, d = self.prefill_decode
        return p + d if self.mode != COLOCATED else 1

    @property
    def gpus_per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def label(self) -> str:
        parts = [self.hardware, f"TP{self.tensor_parallel_size}"]
        if self.pipeline_parallel_size > 1:
            parts.append(f"PP{self.pipeline_parallel_size}")
        if self.expert_parallel:
            parts.append("EP")
        parts.append(self.mode if self.mode == COLOCATED else f"{self.mode.replace(':', 'P:')}D")
        return " ".join(parts)

    def fields(self, scenario_raw: Mapping[str, Any], kv_transfer: str) -> dict[str, Any]:
        """The scenario mapping of this deployment: one replica (or one copy of P + D)."""
        raw = copy.deepcopy(dict(scenario_raw))
        raw["hardware"] = copy.deepcopy(self.hardware_spec)
        engine = dict(raw.get("engine") or {})
        engine["tensor_parallel_size"] = self.tensor_parallel_size
        engine["pipeline_parallel_size"] = self.pipeline_parallel_size
        engine["enable_expert_parallel"] = self.expert_parallel
        if self.max_num_batched_tokens is not None:
            engine["max_num_batched_tokens"] = self.max_num_batched_tokens
        if self.max_num_seqs is not None:
            engine["max_num_seqs"] = self.max_num_seqs
        raw["engine"] = engine
        cluster = {k: v for k, v in dict(raw.get("cluster") or {}).items()
                   if k not in ("replicas", "groups", "kv_transfer")}
        if self.mode == COLOCATED:
            cluster["replicas"] = 1
        else:
            p, d = self.prefill_decode
            cluster["groups"] = [{"name": "prefill", "role": "prefill", "replicas": p},
                                 {"name": "decode", "role": "decode", "replicas": d}]
            cluster["kv_transfer"] = {"link": kv_transfer}
        raw["cluster"] = cluster
        return raw

    def to_dict(self) -> dict[str, Any]:
        p, d = self.prefill_decode
        return {"candidate": self.index, "deployment": self.label, "hardware": self.hardware,
                "tensor_parallel_size": self.tensor_parallel_size,
                "pipeline_parallel_size": self.pipeline_parallel_size,
                "expert_parallel": self.expert_parallel, "mode": self.mode,
                "prefill_replicas": p, "decode_replicas": d,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_num_seqs": self.max_num_seqs, "gpus_per_replica": self.gpus_per_replica,
                "gpus_per_copy": self.gpus_per_replica * self.unit_replicas,
                "price_per_gpu_hour": self.price_per_hour}


def hardware_name(spec: Any, where: str) -> str:
    """A hardware entry's name (a shipped card's, or an inline mapping's ``name``)."""
    return load_hardware(spec, where).name


def candidates(space: PlanSpace, where: str = "plan") -> list[Candidate]:
    """Every combination of the space, in a fixed order (hardware slowest). Prices are looked
    up first, so a card without one fails before anything is built."""
    names = [hardware_name(h, f"{where}.hardware[{i}]") for i, h in enumerate(space.hardware)]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.hardware", f"cards repeat: {names}")
    prices = {n: space.price(n, where).per_hour for n in names}
    out = []
    combos = itertools.product(zip(names, space.hardware), space.tensor_parallel_size,
                               space.pipeline_parallel_size, space.expert_parallel,
                               space.disaggregation, space.max_num_batched_tokens,
                               space.max_num_seqs)
    for i, ((name, spec), tp, pp, ep, mode, mbt, seqs) in enumerate(combos):
        out.append(Candidate(i, name, spec, tp, pp, ep, mode, mbt, seqs, prices[name]))
    return out
