"""The ``cluster:`` section: replica groups, routing, disaggregated prefill/decode, KV transfer,
fault injection; and the per-replica figures of a run.

A cluster is one or more *groups* of identical replicas. Without ``groups`` it is
``replicas`` copies of the scenario's own configuration. A group may override the scenario's
``hardware``, ``engine``, ``scheduler`` and ``latency`` sections (a heterogeneous cluster) and
has a ``role``: ``mixed`` (prefill and decode on the same replica, the default), or ``prefill``
/ ``decode`` for a disaggregated cluster (Splitwise, Patel et al., ISCA'24; DistServe, Zhong et
al., OSDI'24), whose prefill replicas hand each request's KV cache to a decode replica over
the ``kv_transfer`` link. What each part models, and what the client sees: docs/cluster.md.

This package is SimPy-free; the engine (simserve/engine/) runs what it describes.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from simserve.errors import ConfigError
from simserve.cluster.faults import FaultConfig
from simserve.fields import Fields, join
from simserve.cluster.routing import ROUTERS
from simserve.limits import BANDWIDTH_RANGE, MAX_REPLICAS, MAX_SECONDS

ROLES = ("mixed", "prefill", "decode")
GROUP_SECTIONS = ("hardware", "engine", "scheduler", "latency")

# KV transfer links: (bytes/s per direction, seconds of fixed latency, what it is). Datasheet
# bandwidths; the latencies are order-of-magnitude assumptions (one RDMA/NVLink message).
LINKS = {
    "nvlink": (450e9, 5e-6, "NVLink 4 (H100 SXM), 450 GB/s per direction"),
    "infiniband": (50e9, 10e-6, "InfiniBand NDR, 400 Gb/s per GPU"),
    "pcie": (64e9, 10e-6, "PCIe 5.0 x16, 64 GB/s per direction"),
}
DEFAULT_LINK = "nvlink"


@dataclass(frozen=True)
class TransferConfig:
    """The link a KV cache crosses from a prefill to a decode replica: a preset, optionally with
    its bandwidth (B/s, per direction) or latency overridden, or explicit numbers."""

    link: str = DEFAULT_LINK
    bandwidth: float | None = None      # None: the preset's
    latency_us: float | None = None     # None: the preset's

    @classmethod
    def from_fields(cls, f: Fields) -> TransferConfig:
        cfg = cls(link=f.str("link", DEFAULT_LINK, choices=tuple(LINKS)),
                  bandwidth=f.float("bandwidth", None, min=BANDWIDTH_RANGE[0],
                                    max=BANDWIDTH_RANGE[1]),
                  latency_us=f.float("latency_us", None, min=0.0, max=MAX_SECONDS * 1e6))
        f.done()
        return cfg

    @property
    def bandwidth_bps(self) -> float:
        return self.bandwidth if self.bandwidth is not None else LINKS[self.link][0]

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6 if self.latency_us is not None else LINKS[self.link][1]

    def seconds(self, num_bytes: float) -> float:
        """Time to move ``num_bytes`` over one link: bytes / bandwidth + latency."""
        return num_bytes / self.bandwidth_bps + self.latency_s


@dataclass(frozen=True)
class GroupConfig:
    """``replicas`` identical replicas, with the scenario's sections overridden by
    ``overrides`` (as written, kept for the resolved scenario file); ``scenario`` is the
    resolved scenario those replicas run."""

    name: str
    replicas: int
    role: str = "mixed"
    overrides: Mapping[str, Any] = field(default_factory=dict)
    scenario: Any = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "replicas": self.replicas, "role": self.role,
                **copy.deepcopy(dict(self.overrides))}


@dataclass(frozen=True)
class ClusterConfig:
    replicas: int = 1                        # without groups: copies of the scenario's config
    router: str = "round_robin"
    groups: tuple[GroupConfig, ...] = ()
    kv_transfer: TransferConfig | None = None    # disaggregated clusters only
    faults: FaultConfig | None = None

    def __post_init__(self) -> None:
        if self.groups and self.replicas != sum(g.replicas for g in self.groups):
            raise ConfigError("cluster.replicas", "a cluster with groups has the replicas of "
                                                  "its groups; change cluster.groups[*].replicas")

    @property
    def disaggregated(self) -> bool:
        return any(g.role != "mixed" for g in self.groups)

    @classmethod
    def from_fields(cls, f: Fields, top: Mapping[str, Any] | None = None,
                    parse_group: Callable[[dict[str, Any], str], Any] | None = None
                    ) -> ClusterConfig:
        """Read a ``cluster:`` section. ``top`` is the whole scenario mapping and
        ``parse_group(raw, name)`` turns a merged mapping into a Scenario (groups need both)."""
        router = f.str("router", "round_robin", choices=ROUTERS)
        groups: tuple[GroupConfig, ...] = ()
        if f.has("groups"):
            if f.has("replicas"):
                raise ConfigError(f.where("replicas"), "give the replicas of each group "
                                                       "(cluster.groups[*].replicas) instead")
            f.any("replicas", None)
            groups = _parse_groups(f, top or {}, parse_group)
            replicas = sum(g.replicas for g in groups)
            if replicas > MAX_REPLICAS:
                raise ConfigError(f.where("groups"), f"{replicas} replicas in all, more than "
                                                     f"the {MAX_REPLICAS} a cluster can have")
        else:
            replicas = f.int("replicas", 1, min=1, max=MAX_REPLICAS)
        transfer = TransferConfig.from_fields(f.section("kv_transfer")) \
            if f.has("kv_transfer") else None
        faults = FaultConfig.from_fields(f.section("faults"), replicas) \
            if f.has("faults") else None
        f.done()
        roles = {g.role for g in groups}
        if roles - {"mixed"}:
            if roles != {"prefill", "decode"}:
                raise ConfigError(f.where("groups"), "a disaggregated cluster needs prefill and "
                                                     "decode groups and no mixed ones")
            transfer = transfer or TransferConfig()
        elif transfer is not None:
            raise ConfigError(f.where("kv_transfer"), "only a disaggregated cluster (groups "
                                                      "with role prefill and decode) moves KV")
        return cls(replicas, router, groups, transfer, faults)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"replicas": self.replicas, "router": self.router}
        if self.groups:
            del out["replicas"]
            out["groups"] = [g.to_dict() for g in self.groups]
        if self.kv_transfer is not None:
            out["kv_transfer"] = {k: v for k, v in dataclasses.asdict(self.kv_transfer).items()
                                  if v is not None}
        if self.faults is not None:
            out["faults"] = self.faults.to_dict()
        return out


def _parse_groups(f: Fields, top: Mapping[str, Any],
                  parse_group: Callable[[dict[str, Any], str], Any] | None
                  ) -> tuple[GroupConfig, ...]:
    raw = f.any("groups")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f.where("groups"), "expected a non-empty list of groups")
    out, names = [], set()
    for i, item in enumerate(raw):
        path = join(f.where("groups"), i)
        g = Fields(item, path)
        name = g.str("name", f"group{i}")
        if name in names:
            raise ConfigError(join(path, "name"), f"duplicate group name {name!r}")
        names.add(name)
        replicas = g.int("replicas", 1, min=1, max=MAX_REPLICAS)
        role = g.str("role", "mixed", choices=ROLES)
        overrides = {k: copy.deepcopy(g.any(k)) for k in GROUP_SECTIONS if g.has(k)}
        g.done()
        try:
            scenario = parse_group(_merge(top, overrides), name) if parse_group else None
        except ConfigError as e:
            raise ConfigError(join(path, e.field), e.message) from None
        out.append(GroupConfig(name, replicas, role, overrides, scenario))
    return tuple(out)


def _merge(top: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario mapping a group runs: the top-level one with the group's sections laid over
    it (engine knobs key by key; scheduler and latency key by key unless the group names
    another policy or latency model, which replaces the section; hardware replaced)."""
    raw = {k: copy.deepcopy(v) for k, v in top.items() if k not in ("cluster", "compare")}
    for key, value in overrides.items():
        base = raw.get(key)
        switch = {"scheduler": "policy", "latency": "model"}.get(key)
        if key == "hardware" or not isinstance(base, dict) or not isinstance(value, dict) or (
                switch and switch in value and value[switch] != base.get(switch)):
            raw[key] = copy.deepcopy(value)
        else:
            raw[key] = {**base, **copy.deepcopy(value)}
    return raw


def groups_of(s: Any) -> list[GroupConfig]:
    """The scenario's replica groups (one implicit group without ``cluster.groups``)."""
    if s.cluster.groups:
        return list(s.cluster.groups)
    return [GroupConfig("", s.cluster.replicas, "mixed", {}, s)]
