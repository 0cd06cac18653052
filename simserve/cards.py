"""Model cards (transformer shapes, no weights) and hardware specs, read from data files.

Both come from a scenario field that is either a shipped name, an inline mapping, or a shipped
name with overrides::

    model: Llama-3.1-8B                     # simserve/data/models/Llama-3.1-8B.yaml
    model: {card: Llama-3.1-8B, layers: 16} # shipped card, one field changed
    model: {name: toy, layers: 2, hidden: 256, heads: 4, kv_heads: 2, intermediate: 704,
            vocab: 1000, max_position_embeddings: 2048}

    hardware: H100-SXM
    hardware: {spec: H100-SXM, mem_bytes: 94.0e+9}

Every problem is a :class:`ConfigError` naming the field path (``model.kv_heads``), or a
:class:`DataError` naming the data file.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from simserve.errors import ConfigError, DataError
from simserve.fields import Fields, join
from simserve.limits import BANDWIDTH_RANGE, FLOPS_RANGE, MAX_COUNT, MAX_TOKENS, MEM_BYTES_RANGE

DATA_DIR = Path(__file__).parent / "data"
MLP_KINDS = ("gated", "plain")
NORM_KINDS = ("rms", "layer")


# --------------------------------------------------------------------------------------------
# Model cards


@dataclass(frozen=True, slots=True)
class ModelCard:
    """Shapes of a decoder-only transformer: Llama-style by default (RMSNorm, rotary, GQA
    attention, gated SiLU MLP); OPT/Falcon-style with ``mlp: plain`` (fc1 → activation → fc2),
    ``norm: layer`` (LayerNorm with a bias), ``linear_bias`` (every linear layer has a bias)
    and ``learned_positions`` (rows of a learned position table: OPT's 2048 + 2).

    Checks raise :class:`ConfigError` whose field is the YAML key (``kv_heads``);
    :func:`load_model` prefixes it with the scenario path.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype_bytes: int = 2
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    source: str = ""
    mlp: str = "gated"             # gated: gate, up (h -> I) and down; plain: fc1, fc2
    norm: str = "rms"              # rms: one weight vector; layer: weight and bias
    linear_bias: bool = False      # every linear layer (q, k, v, o, MLP) has a bias
    learned_positions: int = 0     # rows of a learned position table (0: rotary)

    def __post_init__(self) -> None:
        for key, value in (("layers", self.num_layers), ("hidden", self.hidden_size),
                           ("heads", self.num_heads), ("kv_heads", self.num_kv_heads),
                           ("head_dim", self.head_dim), ("intermediate", self.intermediate_size),
                           ("vocab", self.vocab_size), ("dtype_bytes", self.dtype_bytes),
                           ("max_position_embeddings", self.max_position_embeddings)):
            if value < 1:
                raise ConfigError(key, f"must be >= 1, got {value}")
        if self.mlp not in MLP_KINDS:
            raise ConfigError("mlp", f"unknown value {self.mlp!r}; expected one of: "
                                     f"{', '.join(MLP_KINDS)}")
        if self.norm not in NORM_KINDS:
            raise ConfigError("norm", f"unknown value {self.norm!r}; expected one of: "
                                      f"{', '.join(NORM_KINDS)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("kv_heads", f"heads ({self.num_heads}) must be a multiple of "
                                          f"kv_heads ({self.num_kv_heads})")

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token in every layer: 2 · layers · kv_heads · head_dim · dtype_bytes."""
        return 2 * self.num_layers * self.kv_dim * self.dtype_bytes

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of h × I in the MLP: 3 gated (gate, up, down), 2 plain (fc1, fc2)."""
        return 3 if self.mlp == "gated" else 2

    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layer" else 1)

    @property
    def layer_params(self) -> int:
        """One decoder layer: q/k/v/o projections (+ biases), the MLP (+ biases), two norms."""
        h, i = self.hidden_size, self.intermediate_size
        attn = h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        if self.qkv_bias or self.linear_bias:
            attn += self.q_dim + 2 * self.kv_dim
        mlp = self.mlp_matrices * h * i
        if self.linear_bias:
            attn += h                                         # o
            mlp += (self.mlp_matrices - 1) * i + h            # up(, gate) and down
        return attn + mlp + 2 * self.norm_params

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Embedding (+ learned positions) + layers + final norm + LM head (unless tied)."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.embedding_params + self.learned_positions * self.hidden_size
                + self.num_layers * self.layer_params + self.norm_params + lm_head)

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    def to_dict(self) -> dict[str, Any]:
        """The inline form accepted by :func:`load_model` (round-trips)."""
        return {"name": self.name, "layers": self.num_layers, "hidden": self.hidden_size,
                "heads": self.num_heads, "kv_heads": self.num_kv_heads,
                "head_dim": self.head_dim, "intermediate": self.intermediate_size,
                "vocab": self.vocab_size,
                "max_position_embeddings": self.max_position_embeddings,
                "dtype_bytes": self.dtype_bytes, "qkv_bias": self.qkv_bias,
                "tie_word_embeddings": self.tie_word_embeddings, "source": self.source,
                # the non-Llama architecture fields only where set (older outputs unchanged)
                **{k: v for k, v, default in (("mlp", self.mlp, "gated"),
                                              ("norm", self.norm, "rms"),
                                              ("linear_bias", self.linear_bias, False),
                                              ("learned_positions", self.learned_positions, 0))
                   if v != default}}


def _parse_model(raw: Any, path: str) -> ModelCard:
    f = Fields(raw, path)
    hidden = f.int("hidden", min=1, max=MAX_COUNT)
    heads = f.int("heads", min=1, max=MAX_COUNT)
    head_dim = f.int("head_dim", default=None, min=1, max=MAX_COUNT)
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(f.where("head_dim"),
                              f"hidden ({hidden}) is not a multiple of heads ({heads}); "
                              "give head_dim explicitly")
        head_dim = hidden // heads
    kw = dict(name=f.str("name"), num_layers=f.int("layers", min=1, max=MAX_COUNT),
              hidden_size=hidden, num_heads=heads,
              num_kv_heads=f.int("kv_heads", default=heads, min=1, max=MAX_COUNT),
              head_dim=head_dim, intermediate_size=f.int("intermediate", min=1, max=MAX_COUNT),
              vocab_size=f.int("vocab", min=1, max=MAX_COUNT),
              max_position_embeddings=f.int("max_position_embeddings", min=1, max=MAX_TOKENS),
              dtype_bytes=f.int("dtype_bytes", default=2, min=1, max=8),
              qkv_bias=f.bool("qkv_bias", default=False),
              tie_word_embeddings=f.bool("tie_word_embeddings", default=False),
              source=f.str("source", default=""),
              mlp=f.str("mlp", default="gated", choices=MLP_KINDS),
              norm=f.str("norm", default="rms", choices=NORM_KINDS),
              linear_bias=f.bool("linear_bias", default=False),
              learned_positions=f.int("learned_positions", default=0, min=0, max=MAX_TOKENS))
    f.done()
    try:
        return ModelCard(**kw)
    except ConfigError as e:
        raise ConfigError(join(path, e.field), e.message) from None


def list_models() -> list[str]:
    """Names of the shipped model cards."""
    return sorted(_catalog("models"))


def load_model(spec: Any, path: str = "model") -> ModelCard:
    """A model card from a shipped name, an inline mapping, or ``{card: NAME, **overrides}``."""
    if isinstance(spec, ModelCard):
        return spec
    return _parse_model(_resolve(spec, path, "models", "card"), path)


# --------------------------------------------------------------------------------------------
# Hardware specs

HARDWARE_KINDS = ("gpu", "cpu")


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One device. Rates are per device and per direction; FLOP/s are dense bf16 (GPU datasheets)
    or measured float32 matmul (CPU)."""

    name: str
    kind: str                      # "gpu" | "cpu"
    peak_flops: float              # FLOP/s
    mem_bandwidth: float           # B/s, device memory (HBM / DRAM)
    mem_bytes: int                 # device memory size
    interconnect_bandwidth: float  # B/s per direction between devices (TP all-reduce)
    host_link_bandwidth: float     # B/s per direction to host memory (KV swap)
    source: str = ""
    efficiency: str = ""           # the roofline's efficiency curve set (latency/efficiency.py)

    def to_dict(self) -> dict[str, Any]:
        """The inline form accepted by :func:`load_hardware` (round-trips)."""
        return {"name": self.name, "kind": self.kind, "peak_flops": self.peak_flops,
                "mem_bandwidth": self.mem_bandwidth, "mem_bytes": self.mem_bytes,
                "interconnect_bandwidth": self.interconnect_bandwidth,
                "host_link_bandwidth": self.host_link_bandwidth, "source": self.source,
                **({"efficiency": self.efficiency} if self.efficiency else {})}


def _parse_hardware(raw: Any, path: str) -> HardwareSpec:
    f = Fields(_numbers_from_strings(raw), path)
    # plausibility bounds (simserve/limits.py): past them a step's price is inf or 0
    flops, bw, mem = FLOPS_RANGE, BANDWIDTH_RANGE, MEM_BYTES_RANGE
    spec = HardwareSpec(
        name=f.str("name"), kind=f.str("kind", choices=HARDWARE_KINDS),
        peak_flops=f.float("peak_flops", min=flops[0], max=flops[1]),
        mem_bandwidth=f.float("mem_bandwidth", min=bw[0], max=bw[1]),
        mem_bytes=int(f.float("mem_bytes", min=mem[0], max=mem[1])),
        interconnect_bandwidth=f.float("interconnect_bandwidth", min=bw[0], max=bw[1]),
        host_link_bandwidth=f.float("host_link_bandwidth", min=bw[0], max=bw[1]),
        source=f.str("source", default=""),
        efficiency=f.str("efficiency", default="", choices=("", *efficiency_curve_sets())))
    f.done()
    return spec


def efficiency_curve_sets() -> list[str]:
    """Names of the shipped roofline efficiency curve sets (``data/efficiency/*.json``)."""
    return sorted(p.stem for p in (DATA_DIR / "efficiency").glob("*.json"))


def list_hardware() -> list[str]:
    """Names of the shipped hardware specs."""
    return sorted(_catalog("hardware"))


def load_hardware(spec: Any, path: str = "hardware") -> HardwareSpec:
    """A hardware spec from a shipped name, an inline mapping, or ``{spec: NAME, **overrides}``."""
    if isinstance(spec, HardwareSpec):
        return spec
    return _parse_hardware(_resolve(spec, path, "hardware", "spec"), path)


def _numbers_from_strings(raw: Any) -> Any:
    # YAML 1.1 reads 80e9 (no dot, no exponent sign) as a string; accept it as the number it is.
    if not isinstance(raw, Mapping):
        return raw
    out = dict(raw)
    for key, value in raw.items():
        if isinstance(value, str) and key not in ("name", "kind", "source", "efficiency"):
            try:
                out[key] = float(value)
            except ValueError:
                pass
    return out


# --------------------------------------------------------------------------------------------
# Shared: shipped data files, name lookup, overrides


@functools.cache
def _catalog(folder: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted((DATA_DIR / folder).glob("*.yaml"))}


@functools.cache
def _read(file: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise DataError(file, f"cannot read: {e}") from None
    if not isinstance(raw, dict):
        raise DataError(file, "expected a mapping")
    return raw


def _shipped(name: Any, where: str, folder: str) -> dict[str, Any]:
    """The raw mapping of a shipped data file, found by case-insensitive file stem."""
    catalog = _catalog(folder)
    if not isinstance(name, str):
        raise ConfigError(where, f"expected a name, got {name!r}")
    match = {k.lower(): p for k, p in catalog.items()}.get(name.lower())
    if match is None:
        raise ConfigError(where, f"unknown name {name!r}; available: {', '.join(catalog)}")
    raw = _read(match)
    # a shipped file must parse on its own; blame the file, not the scenario
    try:
        (_parse_model if folder == "models" else _parse_hardware)(raw, "")
    except ConfigError as e:
        raise DataError(match, str(e)) from None
    return dict(raw)


def _resolve(spec: Any, path: str, folder: str, ref_key: str) -> Any:
    """Turn a name / inline mapping / {ref_key: NAME, overrides} into one raw mapping."""
    if isinstance(spec, str):
        return _shipped(spec, path, folder)
    if isinstance(spec, Mapping) and ref_key in spec:
        overrides = {k: v for k, v in spec.items() if k != ref_key}
        raw = _shipped(spec[ref_key], join(path, ref_key), folder)
        if overrides and "source" not in overrides:
            changed = ", ".join(f"{k}={v}" for k, v in overrides.items())
            raw["source"] = f"{raw.get('source', '')} (overridden: {changed})".strip()
        return {**raw, **overrides}
    if isinstance(spec, Mapping):
        return spec
    raise ConfigError(path, f"expected a name or a mapping, got {spec!r}")
