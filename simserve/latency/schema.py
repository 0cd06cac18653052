"""The profile file: the versioned boundary between ``profiler`` (torch) and ``simserve``.

This module imports neither torch nor numpy, so the simulator can read a profile measured on an
H100 from a laptop. :data:`SCHEMA_VERSION` is bumped whenever a reader written for the old
version would misread a new file. :func:`load_profile` is the only way simserve should read
one: every problem comes back as one :class:`ProfileError` naming the file and the field. The
fields, and how a step time is composed from them: docs/profiler.md (the file).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict
from collections.abc import Callable

from simserve.cards import ModelCard
from simserve.errors import DataError
from simserve.safeyaml import decode_text

SCHEMA_VERSION = 1
KIND = "simserve-profile"
METHODS = ("in_step", "isolated")
ORDERS = ("rounds", "warm_rounds", "point_by_point")


class ProfileError(DataError):
    """A profile file that cannot be used: unreadable, not JSON, wrong shape, or too new."""


# --------------------------------------------------------------------------------------------
# The documented structure (TypedDicts: what a reader may rely on)


class _ProvenanceAdded(TypedDict, total=False):
    # added within version 1: how busy the machine was (load average before and after, on
    # Linux) and the --note given, if any
    note: str


class Provenance(_ProvenanceAdded):
    device: Literal["cpu", "cuda"]
    device_name: str               # CPU model from /proc/cpuinfo, or torch.cuda.get_device_name
    torch_version: str
    cuda_version: str | None
    dtype: Literal["bf16", "fp16", "fp32"]
    threads: int                   # torch.get_num_threads() while measuring
    date: str                      # UTC, ISO 8601
    command: str                   # the exact command line (no host name)
    grid: Literal["quick", "full"]


# The model section is declared once, by simserve.cards.ModelCard: its fields less
# max_position_embeddings and source (see MODEL_FIELDS), with dtype_bytes that of the dtype
# measured (provenance.dtype), not of the card.
ModelShapes = dict[str, Any]

# ModelCard fields a profile does not record: the context limit is the server's choice, not
# the kernels' shape, source is where the card was read from, and quantization and
# kv_cache_dtype are the engine's knobs (the profile's dtype is provenance.dtype)
_NOT_RECORDED = ("max_position_embeddings", "source", "quantization", "kv_cache_dtype")
# every profile has these (a dense Llama-style card's shapes); the card's other fields (MoE,
# MLA, OPT-style MLPs and norms, released weight dtypes) are written only where they differ
# from their defaults, so dense profiles read and write exactly as before
_REQUIRED = ("name", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
             "intermediate_size", "vocab_size", "dtype_bytes", "qkv_bias",
             "tie_word_embeddings")
MODEL_FIELDS: tuple[str, ...] = tuple(f for f in ModelCard.__dataclass_fields__
                                      if f in _REQUIRED)
OPTIONAL_MODEL_FIELDS: tuple[str, ...] = tuple(
    f for f in ModelCard.__dataclass_fields__ if f not in _REQUIRED and f not in _NOT_RECORDED)
# the fields that shape the kernels (name and the measured dtype are not compared to a card)
MODEL_KEYS: tuple[str, ...] = tuple(f for f in MODEL_FIELDS if f not in ("name", "dtype_bytes"))


def model_shapes(card: ModelCard, dtype_bytes: int) -> ModelShapes:
    """The profile's ``model`` section for ``card`` measured in a dtype of ``dtype_bytes``."""
    # dtype_bytes last, where the profiler has always written it (files compare byte for byte)
    out = {f: getattr(card, f) for f in MODEL_FIELDS if f != "dtype_bytes"}
    for f in OPTIONAL_MODEL_FIELDS:
        value = getattr(card, f)
        if value != ModelCard.__dataclass_fields__[f].default:
            out[f] = value
    out["dtype_bytes"] = dtype_bytes
    return out


def model_card(shapes: Mapping[str, Any], max_position_embeddings: int) -> ModelCard:
    """The card a profile's ``model`` section was measured with (the context limit is not
    recorded, so the caller gives one)."""
    return ModelCard(**{f: shapes[f] for f in MODEL_FIELDS},
                     **{f: shapes[f] for f in OPTIONAL_MODEL_FIELDS if f in shapes},
                     max_position_embeddings=max_position_embeddings)


class _SettingsAdded(TypedDict, total=False):
    # added within version 1; absent means "isolated" (each part timed alone, over and over,
    # as the first version-1 files were); "in_step": each part timed inside whole steps
    method: Literal["in_step", "isolated"]
    # added within version 1; absent means "point_by_point" (each point's repeats back to
    # back); "rounds": every point of a family once per round, in random order;
    # "warm_rounds": the same, each point twice in a row, the second kept
    order: Literal["rounds", "warm_rounds", "point_by_point"]


class Settings(_SettingsAdded):
    block_size: int
    max_num_batched_tokens: int
    warmup: int
    repeats: int                   # the most repeats per point; slow points may stop at 3
    timer: Literal["perf_counter", "thread_time", "cuda_event", "cuda_graph_replay"]
    sampler: str                   # what lm_head.seconds and heldout sample with


class AttentionInfo(TypedDict):
    backend: Literal["reference", "flex", "triton", "flashinfer"]
    compiled: bool                 # torch.compile used for the timings
    compile_seconds: dict[str, float]  # first call per shape family, never inside any timing
    fallback: str | None           # why compile was abandoned for eager, if it was
    self_check_rel_err: float      # paged vs dense attention before measuring
    note: str


class LinearGrid(TypedDict):
    tokens: list[int]
    seconds: list[float]
    p10: list[float]
    p90: list[float]
    ops: dict[str, list[float]]    # medians of each op alone, same token grid


class TokenGrid(TypedDict):
    tokens: list[int]
    seconds: list[float]
    p10: list[float]
    p90: list[float]


class PrefillGrid(TypedDict):
    chunk: list[int]
    ctx: list[int]
    seconds: list[list[float]]     # [chunk][ctx]
    p10: list[list[float]]
    p90: list[list[float]]


class DecodeGrid(TypedDict):
    batch: list[int]
    ctx: list[int]
    seconds: list[list[float]]     # [batch][ctx]
    p10: list[list[float]]
    p90: list[list[float]]


class LmHeadGrid(TypedDict):
    seqs: list[int]
    seconds: list[float]
    p10: list[float]
    p90: list[float]
    top_p_seconds: list[float]


class Memory(TypedDict):
    weights_bytes: int
    kv_bytes_per_token: int        # K and V, all layers
    block_bytes: int               # kv_bytes_per_token * block_size
    activation_peak_bytes: int
    activation_peak_method: Literal["measured", "estimated"]
    total_bytes: int | None
    free_bytes: int | None
    gpu_memory_utilization: float
    num_gpu_blocks: int | None     # (total * util - weights - activation peak) // block_bytes
    note: str


class HeldoutStep(TypedDict):
    prefill: list[list[int]]       # [[chunk length, context before the chunk], ...]
    decode_ctx: list[int]          # context of each decode (the new token attends ctx + 1)
    num_sampled: int
    seconds: float
    p10: float
    p90: float


class Profile(TypedDict):
    schema_version: int
    kind: str
    provenance: Provenance
    model: ModelShapes
    settings: Settings
    attention: AttentionInfo
    linear: LinearGrid
    embedding: TokenGrid
    attn_prefill: PrefillGrid
    attn_decode: DecodeGrid
    lm_head: LmHeadGrid
    memory: Memory
    heldout: list[HeldoutStep]


# --------------------------------------------------------------------------------------------
# Validation: a tiny type language over the TypedDicts above, plus the grid-shape rules


class _Invalid(Exception):
    def __init__(self, where: str, message: str):
        # the top level has no field name: "expected an object" alone says enough
        super().__init__(f"{where}: {message}" if where else message)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Invalid(where, f"expected an integer, got {_kind(v)} {v!r}")
    return v


def _nonneg_int(v: Any, where: str) -> int:
    if _int(v, where) < 0:
        raise _Invalid(where, f"must be >= 0, got {v}")
    return v


def _pos_int(v: Any, where: str) -> int:
    if _int(v, where) < 1:
        raise _Invalid(where, f"must be >= 1, got {v}")
    return v


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _Invalid(where, f"expected a finite number, got {_kind(v)} {v!r}")
    return v


def _seconds(v: Any, where: str) -> float:
    if _num(v, where) < 0:
        raise _Invalid(where, f"a time cannot be negative, got {v}")
    return v


def _nonneg(v: Any, where: str) -> float:
    if _num(v, where) < 0:
        raise _Invalid(where, f"must be >= 0, got {v}")
    return v


def _fraction(v: Any, where: str) -> float:
    if not 0 < _num(v, where) <= 1:
        raise _Invalid(where, f"must be a fraction in (0, 1], got {v}")
    return v


def _str(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise _Invalid(where, f"expected a string, got {_kind(v)} {v!r}")
    return v


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise _Invalid(where, f"expected true or false, got {_kind(v)} {v!r}")
    return v


def _optional(check: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    return lambda v, where: None if v is None else check(v, where)


def _choice(*options: str) -> Callable[[Any, str], str]:
    def check(v: Any, where: str) -> str:
        if _str(v, where) not in options:
            raise _Invalid(where, f"expected one of {', '.join(options)}, got {v!r}")
        return v
    return check


def _list(item: Callable[[Any, str], Any], length: int | None = None,
          nonempty: bool = False) -> Callable[[Any, str], list]:
    def check(v: Any, where: str) -> list:
        if not isinstance(v, list):
            raise _Invalid(where, f"expected a list, got {_kind(v)}")
        if length is not None and len(v) != length:
            raise _Invalid(where, f"expected {length} values, got {len(v)}")
        if nonempty and not v:
            raise _Invalid(where, "must not be empty")
        for i, x in enumerate(v):
            item(x, f"{where}[{i}]")
        return v
    return check


def _mapping(v: Any, where: str) -> Mapping:
    if not isinstance(v, Mapping):
        raise _Invalid(where, f"expected an object, got {_kind(v)}")
    return v


def _record(fields: dict[str, Callable[[Any, str], Any]],
            optional: dict[str, Callable[[Any, str], Any]] | None = None
            ) -> Callable[[Any, str], Mapping]:
    """Every key of ``fields`` must be present (null only where the check allows it); a key of
    ``optional`` is checked when present (added after version 1's first files: a reader applies
    its default when absent). Extra keys are ignored so that an older reader can read additive
    changes."""
    def check(v: Any, where: str) -> Mapping:
        _mapping(v, where)
        for key, field_check in fields.items():
            at = f"{where}.{key}" if where else key
            if key not in v:
                raise _Invalid(at, "missing")
            field_check(v[key], at)
        for key, field_check in (optional or {}).items():
            if key in v:
                field_check(v[key], f"{where}.{key}" if where else key)
        return v
    return check


def _ascending(v: list, where: str) -> None:
    for i in range(1, len(v)):
        if v[i] <= v[i - 1]:
            raise _Invalid(f"{where}[{i}]", f"grid must be strictly ascending, got {v[i - 1]} "
                                            f"then {v[i]}")


def _grid_1d(axis: str, extra: tuple[str, ...] = (),
             axis_item: Callable[[Any, str], int] = _pos_int) -> Callable[[Any, str], Mapping]:
    def check(v: Any, where: str) -> Mapping:
        _record({axis: _list(axis_item, nonempty=True)})(v, where)
        _ascending(v[axis], f"{where}.{axis}")
        n = len(v[axis])
        _record({k: _list(_seconds, n) for k in ("seconds", "p10", "p90", *extra)})(v, where)
        return v
    return check


def _grid_2d(row: str, col: str, row_item: Callable = _pos_int,
             col_item: Callable = _nonneg_int) -> Callable[[Any, str], Mapping]:
    def check(v: Any, where: str) -> Mapping:
        _record({row: _list(row_item, nonempty=True), col: _list(col_item, nonempty=True)})(
            v, where)
        _ascending(v[row], f"{where}.{row}")
        _ascending(v[col], f"{where}.{col}")
        table = _list(_list(_seconds, len(v[col])), len(v[row]))
        _record({"seconds": table, "p10": table, "p90": table})(v, where)
        return v
    return check


def _linear(v: Any, where: str) -> Mapping:
    _grid_1d("tokens")(v, where)
    ops = _mapping(v.get("ops"), f"{where}.ops") if "ops" in v else None
    if ops is None:
        raise _Invalid(f"{where}.ops", "missing")
    for name, series in ops.items():
        _list(_seconds, len(v["tokens"]))(series, f"{where}.ops.{name}")
    return v


def _str_to_seconds(v: Any, where: str) -> Mapping:
    for k, x in _mapping(v, where).items():
        _seconds(x, f"{where}.{k}")
    return v


def _pair(v: Any, where: str) -> list:
    _list(_nonneg_int, 2)(v, where)
    if v[0] < 1:
        raise _Invalid(f"{where}[0]", f"chunk length must be >= 1, got {v[0]}")
    return v


_PROVENANCE = _record({
    "device": _choice("cpu", "cuda"), "device_name": _str, "torch_version": _str,
    "cuda_version": _optional(_str), "dtype": _choice("bf16", "fp16", "fp32"),
    "threads": _pos_int, "date": _str, "command": _str, "grid": _choice("quick", "full"),
}, optional={"note": _str, "execution": _str})
# checks follow ModelCard's field types (annotations are strings under __future__.annotations)
_FIELD_CHECKS: dict[str, Callable[[Any, str], Any]] = {"str": _str, "int": _pos_int,
                                                      "bool": _bool}


def _optional_check(name: str) -> Callable[[Any, str], Any]:
    """The check of an optional card field, by its default's type."""
    default = ModelCard.__dataclass_fields__[name].default
    if isinstance(default, bool):
        return _bool
    if isinstance(default, int):
        return _nonneg_int
    return _optional(_str)


_MODEL = _record({f: _FIELD_CHECKS[str(ModelCard.__dataclass_fields__[f].type)]
                  for f in MODEL_FIELDS},
                 optional={f: _optional_check(f) for f in OPTIONAL_MODEL_FIELDS})
_SETTINGS = _record({
    "block_size": _pos_int, "max_num_batched_tokens": _pos_int, "warmup": _nonneg_int,
    "repeats": _pos_int, "timer": _choice("perf_counter", "thread_time", "cuda_event",
                                  "cuda_graph_replay"),
    "sampler": _str,
}, optional={"method": _choice(*METHODS), "order": _choice(*ORDERS)})
_ATTENTION = _record({
    "backend": _choice("reference", "flex", "triton", "flashinfer"), "compiled": _bool,
    "compile_seconds": _str_to_seconds, "fallback": _optional(_str),
    "self_check_rel_err": _nonneg, "note": _str,
})
_MEMORY = _record({
    "weights_bytes": _pos_int, "kv_bytes_per_token": _pos_int, "block_bytes": _pos_int,
    "activation_peak_bytes": _nonneg_int,
    "activation_peak_method": _choice("measured", "estimated"),
    "total_bytes": _optional(_nonneg_int), "free_bytes": _optional(_nonneg_int),
    "gpu_memory_utilization": _fraction, "num_gpu_blocks": _optional(_nonneg_int), "note": _str,
})
_HELDOUT = _list(_record({
    "prefill": _list(_pair), "decode_ctx": _list(_nonneg_int), "num_sampled": _nonneg_int,
    "seconds": _seconds, "p10": _seconds, "p90": _seconds,
}))
_LM_HEAD = _grid_1d("seqs", extra=("top_p_seconds",))


def _moe(v: Any, where: str) -> Mapping:
    """An MoE card's profile (#18): one MoE block per layer vs tokens, with the distinct
    experts each point's routing touched; the ``linear`` series then excludes the MLP."""
    _grid_1d("tokens")(v, where)
    _record({"experts_hit": _list(_nonneg_int, len(v["tokens"])), "note": _str})(v, where)
    return v

_SECTIONS: dict[str, Callable[[Any, str], Any]] = {
    "kind": _choice(KIND),
    "provenance": _PROVENANCE,
    "model": _MODEL,
    "settings": _SETTINGS,
    "attention": _ATTENTION,
    "linear": _linear,
    "embedding": _grid_1d("tokens"),
    "attn_prefill": _grid_2d("chunk", "ctx"),
    "attn_decode": _grid_2d("batch", "ctx"),
    "lm_head": _LM_HEAD,
    "memory": _MEMORY,
    "heldout": _HELDOUT,
}
# sections added within version 1: checked when present
_OPTIONAL_SECTIONS: dict[str, Callable[[Any, str], Any]] = {"moe": _moe}


def validate(obj: Any, path: str | Path = "<profile>") -> Profile:
    """Check ``obj`` against the schema; return it typed, or raise one :class:`ProfileError`.

    The version is checked first: a file from a newer profiler may have a different layout, and
    "upgrade simserve" is a more useful message than the first field that no longer matches.
    """
    try:
        _mapping(obj, "")
        if "schema_version" not in obj:
            raise _Invalid("schema_version", "missing (is this a simserve profile?)")
        version = _int(obj["schema_version"], "schema_version")
        if version > SCHEMA_VERSION:
            raise _Invalid("schema_version", f"{version} is newer than the newest this simserve "
                                             f"reads ({SCHEMA_VERSION}); upgrade simserve")
        if version < 1:
            raise _Invalid("schema_version", f"must be >= 1, got {version}")
        _record(_SECTIONS, _OPTIONAL_SECTIONS)(obj, "")
    except _Invalid as e:
        raise ProfileError(str(path), str(e)) from None
    return obj  # type: ignore[return-value]


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ProfileError(str(path), f"cannot read: {e.strerror or e}") from None
    try:
        obj = json.loads(decode_text(data, path))
    except DataError as e:            # not UTF-8 text
        raise ProfileError(str(path), e.message, e.line) from None
    except json.JSONDecodeError as e:
        raise ProfileError(str(path), f"not JSON (line {e.lineno}, column {e.colno}: {e.msg})"
                           ) from None
    except RecursionError:
        raise ProfileError(str(path), "not a profile: JSON nested too deeply") from None
    return validate(obj, path)


def dump(profile: Mapping[str, Any], path: str | Path) -> None:
    """Validate, then write ``profile`` as JSON (the file is never written invalid)."""
    validate(profile, path)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(profile, indent=1) + "\n")


# the mixture-of-experts shape: a dense profile cannot price an MoE card, nor the reverse
MOE_KEYS = ("num_experts", "experts_per_token", "expert_intermediate",
            "shared_expert_intermediate")


def model_mismatch(profile: Mapping[str, Any], model: Any) -> list[str]:
    """Shape fields where ``model`` (a ModelCard or a mapping with the same names) differs from
    the shapes the profile was measured with, as ``"field: profile X, model Y"``; empty if none.
    """
    def get(key: str) -> Any:
        return model.get(key) if isinstance(model, Mapping) else getattr(model, key, None)

    shapes = profile["model"]
    diffs = [f"{k}: profile {shapes[k]}, model {get(k)}" for k in MODEL_KEYS
             if get(k) is not None and shapes[k] != get(k)]
    # an MoE card needs a profile of its MoE block (and a dense card one without); so do the
    # other optional shapes (an OPT-style MLP, MLA attention...): absent means the default
    for k in OPTIONAL_MODEL_FIELDS:
        default = ModelCard.__dataclass_fields__[k].default
        have = shapes.get(k, default)
        want = get(k)
        want = default if want is None else want
        if have != want:
            diffs.append(f"{k}: profile {have}, model {want}")
    return diffs
