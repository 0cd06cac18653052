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
from dataclasses import dataclass, field, replace
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


# Bytes per parameter of a weight dtype as a checkpoint stores it. Block-scale overheads are
# counted where the format fixes them: MXFP4 = 16 B of 4-bit values + 1 B e8m0 scale per 32
# (gpt-oss); INT4 (GPTQ/AWQ) = 4-bit values + an fp16 scale per group of 128 (zero points and
# other group sizes vary by checkpoint: an estimate); FP8 per-tensor/channel scales are
# negligible, FP8 128×128 block scales (DeepSeek-V3, fp8_per_block) add 4 B per 16,384.
WEIGHT_DTYPES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0,
                 "fp8_block": 1.0 + 4 / 16384, "mxfp4": 17 / 32, "int4": 0.5 + 2 / 128}
ATTENTION_KINDS = ("gqa", "mla")
# vLLM 0.32's `quantization` values simserve prices (config/quantization.py,
# model_executor/layers/quantization/__init__.py): online FP8 of a 16-bit checkpoint
# (W8A8), and checkpoints already quantized (fp8, mxfp4, GPTQ/AWQ INT4 weight-only)
ONLINE_FP8 = {"fp8_per_tensor": "fp8", "fp8_per_channel": "fp8", "fp8_per_block": "fp8_block"}
QUANTIZATIONS = (*ONLINE_FP8, "fp8", "mxfp4", "gptq", "awq")
# vLLM 0.32's `kv_cache_dtype` values (config/cache.py) and their bytes per element
KV_CACHE_DTYPES = {"auto": None, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1,
                   "fp8_e5m2": 1}


@dataclass(frozen=True, slots=True)
class ModelCard:
    """Shapes of a decoder-only transformer: Llama-style by default (RMSNorm, rotary, GQA
    attention, gated SiLU MLP); OPT/Falcon-style with ``mlp: plain`` (fc1 → activation → fc2),
    ``norm: layer`` (LayerNorm with a bias), ``linear_bias`` (every attention and dense-MLP
    linear has a bias) and ``learned_positions`` (rows of a learned position table: OPT's
    2048 + 2); or a mixture of experts (routed gated-SiLU experts, optional shared expert and
    dense layers first), with GQA or DeepSeek's MLA attention. ``mlp`` and ``linear_bias``
    describe the dense MLP; routed and shared experts are gated, with ``expert_bias``.

    The card describes the checkpoint as released (``weight_dtype``, ``expert_weight_dtype``);
    ``quantization`` and ``kv_cache_dtype`` are the engine's knobs (vLLM's names), attached by
    :func:`serving_card` and not part of :meth:`to_dict`. Byte counts read both.

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
    dtype_bytes: int = 2          # activations, KV cache at `auto`, and unquantized weights
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    source: str = ""
    mlp: str = "gated"             # gated: gate, up (h -> I) and down; plain: fc1, fc2
    norm: str = "rms"              # rms: one weight vector; layer: weight and bias
    linear_bias: bool = False      # every linear layer (q, k, v, o, MLP) has a bias
    learned_positions: int = 0     # rows of a learned position table (0: rotary)
    # mixture of experts (0 experts: a dense model)
    num_experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_expert_intermediate: int = 0   # total width of the shared expert(s); 0: none
    first_dense_layers: int = 0           # vLLM `first_k_dense_replace`: dense MLP layers first
    expert_bias: bool = False             # gpt-oss: biases on gate_up and down
    router_bias: bool = False
    # attention extras
    o_bias: bool = False                  # gpt-oss `attention_bias`: o_proj too (with qkv_bias)
    qk_norm: bool = False                 # Qwen3: RMSNorm on q and k per head
    attention_sinks: bool = False         # gpt-oss: one learned sink per head
    attention: str = "gqa"                # "gqa" | "mla"
    q_lora_rank: int = 0                  # MLA (0: q projected directly)
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # weights as released; None: dtype_bytes wide (an unquantized checkpoint)
    weight_dtype: str | None = None
    expert_weight_dtype: str | None = None   # None: as weight_dtype
    # engine knobs (vLLM names), attached by serving_card; never written by to_dict
    quantization: str | None = None
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for key, value in (("layers", self.num_layers), ("hidden", self.hidden_size),
                           ("heads", self.num_heads), ("kv_heads", self.num_kv_heads),
                           ("head_dim", self.head_dim), ("vocab", self.vocab_size),
                           ("dtype_bytes", self.dtype_bytes),
                           ("max_position_embeddings", self.max_position_embeddings)):
            if value < 1:
                raise ConfigError(key, f"must be >= 1, got {value}")
        # 0: no dense MLP (the profiler builds an MoE card's layers so, its experts timed
        # apart); a card read from YAML needs >= 1 (load_model)
        if self.intermediate_size < 0:
            raise ConfigError("intermediate", f"must be >= 0, got {self.intermediate_size}")
        if self.mlp not in MLP_KINDS:
            raise ConfigError("mlp", f"unknown value {self.mlp!r}; expected one of: "
                                     f"{', '.join(MLP_KINDS)}")
        if self.norm not in NORM_KINDS:
            raise ConfigError("norm", f"unknown value {self.norm!r}; expected one of: "
                                      f"{', '.join(NORM_KINDS)}")
        if self.mlp == "plain" and self.num_experts and not self.first_dense_layers:
            raise ConfigError("mlp", "every layer is MoE here (routed experts are gated); "
                                     "plain names a dense MLP (fc1, fc2)")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("kv_heads", f"heads ({self.num_heads}) must be a multiple of "
                                          f"kv_heads ({self.num_kv_heads})")
        self._check_moe()
        self._check_mla()
        if self.linear_bias and self.is_mla:
            raise ConfigError("linear_bias", "names q/k/v/o biases of GQA attention; MLA's "
                                             "projections have none here")
        for key, dtype in (("weight_dtype", self.weight_dtype),
                           ("expert_weight_dtype", self.expert_weight_dtype)):
            if dtype is not None and dtype not in WEIGHT_DTYPES:
                raise ConfigError(key, f"unknown dtype {dtype!r}; expected one of: "
                                       f"{', '.join(WEIGHT_DTYPES)}")
        if self.expert_weight_dtype is not None and not self.num_experts:
            raise ConfigError("expert_weight_dtype", "a dense card has no experts")

    def _check_moe(self) -> None:
        e, k = self.num_experts, self.experts_per_token
        if e < 0:
            raise ConfigError("experts", f"must be >= 0, got {e}")
        if not e:
            for key, value in (("experts_per_token", k),
                               ("expert_intermediate", self.expert_intermediate),
                               ("shared_expert_intermediate", self.shared_expert_intermediate),
                               ("first_dense_layers", self.first_dense_layers)):
                if value:
                    raise ConfigError(key, "needs experts >= 1 (a dense card has no experts)")
            return
        if not 1 <= k <= e:
            raise ConfigError("experts_per_token", f"top-k must be in [1, experts = {e}], "
                                                   f"got {k}")
        if self.expert_intermediate < 1:
            raise ConfigError("expert_intermediate", f"must be >= 1 with experts, got "
                                                     f"{self.expert_intermediate}")
        if self.shared_expert_intermediate < 0:
            raise ConfigError("shared_expert_intermediate", "must be >= 0")
        if not 0 <= self.first_dense_layers < self.num_layers:
            raise ConfigError("first_dense_layers", f"must be in [0, layers = "
                                                    f"{self.num_layers}), got "
                                                    f"{self.first_dense_layers}")

    def _check_mla(self) -> None:
        mla = (("q_lora_rank", self.q_lora_rank), ("kv_lora_rank", self.kv_lora_rank),
               ("qk_nope_head_dim", self.qk_nope_head_dim),
               ("qk_rope_head_dim", self.qk_rope_head_dim), ("v_head_dim", self.v_head_dim))
        if self.attention not in ATTENTION_KINDS:
            raise ConfigError("attention", f"unknown value {self.attention!r}; expected one "
                                           f"of: {', '.join(ATTENTION_KINDS)}")
        if self.attention == "gqa":
            for key, value in mla:
                if value:
                    raise ConfigError(key, "is an MLA field; set attention: mla")
            return
        for key, value in mla[1:]:
            if value < 1:
                raise ConfigError(key, f"must be >= 1 with attention: mla, got {value}")
        if self.num_kv_heads != 1:
            # vLLM stores MLA's latent as one KV "head" replicated on every TP rank
            raise ConfigError("kv_heads", "must be 1 with attention: mla (one latent per "
                                          "token, replicated across TP ranks)")
        if self.head_dim != self.qk_nope_head_dim + self.qk_rope_head_dim:
            raise ConfigError("head_dim", f"must be qk_nope_head_dim + qk_rope_head_dim = "
                                          f"{self.qk_nope_head_dim + self.qk_rope_head_dim} "
                                          "with attention: mla")

    # ---------------------------------------------------------------- shapes

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.attention == "mla"

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def kv_latent_dim(self) -> int:
        """MLA: the cached width per token and layer (latent + rotary key), one "head"."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    # ---------------------------------------------------------------- bytes

    @property
    def kv_bytes(self) -> int:
        """Bytes per element of the KV cache: ``kv_cache_dtype``, or the model dtype."""
        b = KV_CACHE_DTYPES[self.kv_cache_dtype]
        return self.dtype_bytes if b is None else b

    def kv_bytes_per_token_per_rank(self, tp: int = 1) -> int:
        """KV of one token in every layer on one TP rank. GQA: K and V of the rank's KV heads
        (replicated when there are fewer KV heads than ranks); MLA: the latent row, which vLLM
        keeps whole on every rank (``max_tp_shards=1``)."""
        if self.is_mla:
            return self.num_layers * self.kv_latent_dim * self.kv_bytes
        heads = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * heads * self.head_dim * self.kv_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """KV of one token, all layers, one rank's view at TP 1: GQA 2 · layers · kv_heads ·
        head_dim · kv_bytes; MLA layers · (kv_lora_rank + qk_rope_head_dim) · kv_bytes."""
        return self.kv_bytes_per_token_per_rank(1)

    @property
    def linear_dtype(self) -> str | None:
        """Weight dtype of attention, dense-MLP and shared-expert linears as served."""
        return self._served_dtype(self.weight_dtype)

    @property
    def expert_dtype(self) -> str | None:
        """Weight dtype of the routed experts as served."""
        released = self.expert_weight_dtype or self.weight_dtype
        return self._served_dtype(released)

    def _served_dtype(self, released: str | None) -> str | None:
        q = self.quantization
        if q in ONLINE_FP8:
            return ONLINE_FP8[q]
        if q in ("gptq", "awq"):
            return "int4"
        return released

    @property
    def linear_bytes(self) -> float:
        return WEIGHT_DTYPES[self.linear_dtype] if self.linear_dtype else self.dtype_bytes

    @property
    def expert_bytes(self) -> float:
        return WEIGHT_DTYPES[self.expert_dtype] if self.expert_dtype else self.dtype_bytes

    @property
    def fp8_compute(self) -> bool:
        """W8A8: the linears run on FP8 tensor cores (online FP8 or an FP8 checkpoint).
        Weight-only formats (MXFP4, INT4) compute at 16 bits."""
        return (self.linear_dtype or "").startswith("fp8")

    # ---------------------------------------------------------------- parameters

    @property
    def attention_params(self) -> int:
        """Linear weights of one attention block (q, k, v, o or MLA's projections)."""
        h, H = self.hidden_size, self.num_heads
        if self.is_mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * H * qk if self.q_lora_rank
                 else h * H * qk)
            kv = (h * (self.kv_lora_rank + self.qk_rope_head_dim)
                  + self.kv_lora_rank * H * (self.qk_nope_head_dim + self.v_head_dim))
            return q + kv + H * self.v_head_dim * h
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    @property
    def attention_small_params(self) -> int:
        """Biases, norms and sinks of one attention block (kept at 16 bits)."""
        n = 0
        if self.qkv_bias or self.linear_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.o_bias or self.linear_bias:
            n += self.hidden_size
        if self.qk_norm:
            n += 2 * self.head_dim
        if self.attention_sinks:
            n += self.num_heads
        if self.is_mla:                    # RMSNorms on the q and kv latents
            n += self.q_lora_rank + self.kv_lora_rank
        return n

    @property
    def expert_params(self) -> int:
        """One routed expert: gate, up and down (+ biases)."""
        h, i = self.hidden_size, self.expert_intermediate
        return 3 * h * i + ((2 * i + h) if self.expert_bias else 0)

    @property
    def router_params(self) -> int:
        return self.hidden_size * self.num_experts + (self.num_experts if self.router_bias else 0)

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of h × I in the MLP: 3 gated (gate, up, down), 2 plain (fc1, fc2)."""
        return 3 if self.mlp == "gated" else 2

    @property
    def norm_params(self) -> int:
        return self.hidden_size * (2 if self.norm == "layer" else 1)

    @property
    def layer_params(self) -> int:
        """One dense decoder layer: attention (+ biases, norms, sinks), the MLP (gated or
        plain, + biases), two norms (RMS or LayerNorm)."""
        h, i = self.hidden_size, self.intermediate_size
        mlp = self.mlp_matrices * h * i
        if self.linear_bias:
            mlp += (self.mlp_matrices - 1) * i + h            # up(, gate) and down
        return self.attention_params + self.attention_small_params + mlp + 2 * self.norm_params

    @property
    def moe_layer_params(self) -> int:
        """One MoE layer: attention, router, every routed expert, the shared expert, norms."""
        h = self.hidden_size
        return (self.attention_params + self.attention_small_params + self.router_params
                + self.num_experts * self.expert_params
                + 3 * h * self.shared_expert_intermediate + 2 * self.norm_params)

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Embedding (+ learned positions) + layers + final norm + LM head (unless tied)."""
        lm_head = 0 if self.tie_word_embeddings else self.embedding_params
        return (self.embedding_params + self.learned_positions * self.hidden_size
                + self.dense_layers * self.layer_params + self.moe_layers * self.moe_layer_params
                + self.norm_params + lm_head)

    @property
    def active_params(self) -> int:
        """Parameters one token uses: as :attr:`num_params` with ``experts_per_token`` of the
        routed experts (the input embedding counted, as one row is read)."""
        idle = self.num_experts - self.experts_per_token
        return self.num_params - self.moe_layers * idle * self.expert_params

    @property
    def routed_expert_params(self) -> int:
        """Every routed expert of every MoE layer."""
        return self.moe_layers * self.num_experts * self.expert_params

    @property
    def weight_bytes(self) -> int:
        """Weights as served: attention, dense-MLP and shared-expert linears at
        :attr:`linear_bytes`, routed experts at :attr:`expert_bytes`, the rest (embedding, LM
        head, router, norms, biases) at ``dtype_bytes``."""
        h = self.hidden_size
        linear = (self.num_layers * self.attention_params
                  + self.dense_layers * self.mlp_matrices * h * self.intermediate_size
                  + self.moe_layers * 3 * h * self.shared_expert_intermediate)
        experts = self.routed_expert_params
        rest = self.num_params - linear - experts
        return int(round(linear * self.linear_bytes + experts * self.expert_bytes
                         + rest * self.dtype_bytes))

    def weight_bytes_per_rank(self, tp: int = 1, ep: int = 1) -> float:
        """Weights on one rank: routed experts split over ``ep`` ranks (whole experts; with
        ep 1 they are TP-sharded instead), everything else over ``tp`` (embedding and LM head
        vocab-parallel, norms replicated: a rounding-level difference ignored here)."""
        experts = self.routed_expert_params * self.expert_bytes
        split = ep if ep > 1 else tp
        return (self.weight_bytes - experts) / tp + experts / split

    def to_dict(self) -> dict[str, Any]:
        """The inline form accepted by :func:`load_model` (round-trips). Keys beyond a dense
        Llama card's are written only when set, and the engine's knobs never."""
        out = {"name": self.name, "layers": self.num_layers, "hidden": self.hidden_size,
               "heads": self.num_heads, "kv_heads": self.num_kv_heads,
               "head_dim": self.head_dim, "intermediate": self.intermediate_size,
               "vocab": self.vocab_size,
               "max_position_embeddings": self.max_position_embeddings,
               "dtype_bytes": self.dtype_bytes, "qkv_bias": self.qkv_bias,
               "tie_word_embeddings": self.tie_word_embeddings, "source": self.source}
        for key, attr, default in _OPTIONAL_KEYS:
            value = getattr(self, attr)
            if value != default:
                out[key] = value
        return out


# the optional string keys whose values are a fixed set (checked again in __post_init__)
_KEY_CHOICES = {"mlp": MLP_KINDS, "norm": NORM_KINDS}
# YAML key, ModelCard attribute, default: the keys to_dict writes only when set
_OPTIONAL_KEYS = (
    ("mlp", "mlp", "gated"), ("norm", "norm", "rms"), ("linear_bias", "linear_bias", False),
    ("learned_positions", "learned_positions", 0),
    ("experts", "num_experts", 0), ("experts_per_token", "experts_per_token", 0),
    ("expert_intermediate", "expert_intermediate", 0),
    ("shared_expert_intermediate", "shared_expert_intermediate", 0),
    ("first_dense_layers", "first_dense_layers", 0), ("expert_bias", "expert_bias", False),
    ("router_bias", "router_bias", False), ("o_bias", "o_bias", False),
    ("qk_norm", "qk_norm", False), ("attention_sinks", "attention_sinks", False),
    ("attention", "attention", "gqa"), ("q_lora_rank", "q_lora_rank", 0),
    ("kv_lora_rank", "kv_lora_rank", 0), ("qk_nope_head_dim", "qk_nope_head_dim", 0),
    ("qk_rope_head_dim", "qk_rope_head_dim", 0), ("v_head_dim", "v_head_dim", 0),
    ("weight_dtype", "weight_dtype", None), ("expert_weight_dtype", "expert_weight_dtype", None),
)


def serving_card(card: ModelCard, quantization: str | None, kv_cache_dtype: str = "auto",
                 path: str = "engine") -> ModelCard:
    """The card as an engine serves it: vLLM's ``quantization`` and ``kv_cache_dtype`` knobs
    attached (the byte counts read them). Refuses what vLLM 0.32 refuses or cannot load:

    * ``fp8`` names an FP8 *checkpoint*; a 16-bit card needs an online scheme (vLLM's message:
      "no longer supports online quantization. Please use --quantization fp8_per_tensor");
    * online FP8 of a checkpoint already quantized; ``mxfp4`` on a card without MXFP4 weights.
    """
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(join(path, "quantization"),
                          f"unknown value {quantization!r}; expected one of: "
                          f"{', '.join(QUANTIZATIONS)}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ConfigError(join(path, "kv_cache_dtype"),
                          f"unknown value {kv_cache_dtype!r}; expected one of: "
                          f"{', '.join(KV_CACHE_DTYPES)}")
    released = {card.weight_dtype, card.expert_weight_dtype} - {None, "bf16", "fp16", "fp32"}
    where = join(path, "quantization")
    if quantization == "fp8" and not any(d.startswith("fp8") for d in released):
        raise ConfigError(where, f"{card.name} is not an FP8 checkpoint; the `fp8` method no "
                                 "longer supports online quantization in vLLM 0.32 — use "
                                 "fp8_per_tensor, fp8_per_channel or fp8_per_block")
    if quantization in ONLINE_FP8 and released:
        raise ConfigError(where, f"{card.name} is already quantized ({', '.join(sorted(released))}"
                                 "); online FP8 needs a 16-bit checkpoint")
    if quantization == "mxfp4" and "mxfp4" not in released:
        raise ConfigError(where, f"{card.name} has no MXFP4 weights (mxfp4 names gpt-oss-style "
                                 "checkpoints here)")
    if quantization in ("gptq", "awq") and released:
        raise ConfigError(where, f"{card.name} is already quantized; {quantization} names an "
                                 "INT4 checkpoint of a 16-bit model")
    if (quantization, kv_cache_dtype) == (card.quantization, card.kv_cache_dtype):
        return card
    return replace(card, quantization=quantization, kv_cache_dtype=kv_cache_dtype)


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
              source=f.str("source", default=""))
    for key, attr, default in _OPTIONAL_KEYS:
        if isinstance(default, bool):
            kw[attr] = f.bool(key, default=default)
        elif isinstance(default, int):
            kw[attr] = f.int(key, default=default, min=0 if key != "experts" else None,
                             max=MAX_TOKENS if key == "learned_positions" else MAX_COUNT)
        else:
            kw[attr] = f.str(key, default=default, choices=_KEY_CHOICES.get(key))
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
    # dense FP8 tensor-core FLOP/s; None: no FP8 tensor cores (vLLM then runs FP8 weights
    # weight-only, W8A16 Marlin, so GEMMs compute at peak_flops)
    peak_flops_fp8: float | None = None
    # B/s per direction per device between nodes (RDMA NIC), and devices per node: expert
    # all-to-all that spans nodes runs at the scale-out rate
    scaleout_bandwidth: float | None = None
    devices_per_node: int = 8
    # seconds of one message's hop on the scale-out link (NCCL's network hop latency): a
    # tensor-parallel all-reduce whose ranks span nodes pays it on each of its inter-node ring
    # steps, a pipeline stage's send across nodes once; None: the NVLink-class fixed latency
    # of the roofline only (latency/roofline.py, latency/pipeline.py)
    scaleout_latency: float | None = None
    efficiency: str = ""           # the roofline's efficiency curve set (latency/efficiency.py)
    # the shipped card it was made from ({spec: NAME, ...} or NAME; "" for a whole inline
    # mapping): what a measured profile's device is matched against (latency/profile.py)
    base: str = field(default="", compare=False)

    @property
    def fp8_flops(self) -> float:
        """FLOP/s of an FP8 (W8A8) GEMM: the FP8 peak, or the 16-bit one without FP8 cores."""
        return self.peak_flops_fp8 or self.peak_flops

    def to_dict(self) -> dict[str, Any]:
        """The inline form accepted by :func:`load_hardware` (round-trips)."""
        out = {"name": self.name, "kind": self.kind, "peak_flops": self.peak_flops,
               "mem_bandwidth": self.mem_bandwidth, "mem_bytes": self.mem_bytes,
               "interconnect_bandwidth": self.interconnect_bandwidth,
               "host_link_bandwidth": self.host_link_bandwidth, "source": self.source}
        if self.peak_flops_fp8 is not None:
            out["peak_flops_fp8"] = self.peak_flops_fp8
        if self.scaleout_bandwidth is not None:
            out["scaleout_bandwidth"] = self.scaleout_bandwidth
        if self.devices_per_node != 8:
            out["devices_per_node"] = self.devices_per_node
        if self.scaleout_latency is not None:
            out["scaleout_latency"] = self.scaleout_latency
        if self.efficiency:
            out["efficiency"] = self.efficiency
        return out


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
        peak_flops_fp8=f.float("peak_flops_fp8", None, min=flops[0], max=flops[1]),
        scaleout_bandwidth=f.float("scaleout_bandwidth", None, min=bw[0], max=bw[1]),
        devices_per_node=f.int("devices_per_node", 8, min=1, max=MAX_COUNT),
        scaleout_latency=f.float("scaleout_latency", None, min=0.0, max=1.0),
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
    hw = _parse_hardware(_resolve(spec, path, "hardware", "spec"), path)
    base = spec if isinstance(spec, str) else spec.get("spec") if isinstance(spec, Mapping) \
        else None
    return replace(hw, base=base) if isinstance(base, str) else hw


def _numbers_from_strings(raw: Any) -> Any:
    # YAML 1.1 reads 80e9 (no dot, no exponent sign) as a string; accept it as the number it is.
    if not isinstance(raw, Mapping):
        return raw
    out = dict(raw)
    for key, value in raw.items():
        if isinstance(value, str) and key not in ("name", "kind", "source",
                                                   "devices_per_node", "efficiency"):
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
