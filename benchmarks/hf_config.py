"""A Hugging Face ``config.json`` written from a simserve model card, so that vLLM can serve the
card's shapes with random weights and no tokenizer::

    python benchmarks/hf_config.py Llama-3.1-8B /tmp/models/Llama-3.1-8B
    vllm serve /tmp/models/Llama-3.1-8B --load-format dummy --skip-tokenizer-init ...

A card holds shapes only (``simserve/data/models/*.yaml``); the config carries exactly those and
the fixed choices below, none of which changes a tensor's shape or a kernel's work:

* architecture: ``Qwen2ForCausalLM`` when the card has q/k/v biases (Qwen2 is Llama's decoder
  with biases on q, k and v only; Llama's ``attention_bias`` would also bias o_proj), else
  ``LlamaForCausalLM`` (Llama 2/3, Mistral-7B without sliding window: the same decoder);
* RMSNorm epsilon 1e-5 and plain rotary embeddings (``rope_theta`` 10,000, no scaling): the
  real models' values (Llama-3.1: theta 500,000 with "llama3" scaling) only change the
  cos/sin table's numbers, not the kernels that read it;
* ``torch_dtype`` from ``dtype_bytes`` (2: bfloat16, 4: float32);
* token ids 1 (bos), 2 (eos), 0 (pad): the replay client sends token ids >= 4 with
  ``ignore_eos``, so they never matter.

``card_from_hf_config`` reads the shapes back (the round trip the tests hold).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from simserve.cards import ModelCard, load_model  # noqa: E402

DTYPES = {2: "bfloat16", 4: "float32"}


def hf_config(card: ModelCard) -> dict:
    """The ``config.json`` mapping for ``card`` (see the module docstring)."""
    if card.dtype_bytes not in DTYPES:
        raise ValueError(f"{card.name}: dtype_bytes {card.dtype_bytes} has no HF dtype "
                         f"(expected one of {sorted(DTYPES)})")
    qwen2 = card.qkv_bias
    cfg = {
        "architectures": ["Qwen2ForCausalLM" if qwen2 else "LlamaForCausalLM"],
        "model_type": "qwen2" if qwen2 else "llama",
        "hidden_size": card.hidden_size,
        "intermediate_size": card.intermediate_size,
        "num_hidden_layers": card.num_layers,
        "num_attention_heads": card.num_heads,
        "num_key_value_heads": card.num_kv_heads,
        "head_dim": card.head_dim,
        "vocab_size": card.vocab_size,
        "max_position_embeddings": card.max_position_embeddings,
        "tie_word_embeddings": card.tie_word_embeddings,
        "torch_dtype": DTYPES[card.dtype_bytes],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "use_cache": True,
        "simserve_card": card.name,
    }
    if qwen2:
        cfg.update({"use_sliding_window": False, "sliding_window": None,
                    "max_window_layers": card.num_layers})
    else:
        cfg.update({"attention_bias": False, "mlp_bias": False})
    return cfg


def card_from_hf_config(cfg: dict, name: str | None = None) -> ModelCard:
    """The shapes of a Llama/Qwen2-style HF config as a model card (inverse of
    :func:`hf_config`)."""
    heads = cfg["num_attention_heads"]
    dtype = {v: k for k, v in DTYPES.items()}.get(cfg.get("torch_dtype", "bfloat16"), 2)
    arch = cfg.get("architectures", ["LlamaForCausalLM"])[0]
    return ModelCard(
        name=name or cfg.get("simserve_card") or arch,
        num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
        num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
        max_position_embeddings=cfg["max_position_embeddings"], dtype_bytes=dtype,
        qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)))


def write_model_dir(card: ModelCard | str, out: str | Path) -> Path:
    """Write ``out/config.json`` for ``card`` (a card or a shipped card's name); return ``out``.
    No weights and no tokenizer: serve with ``--load-format dummy --skip-tokenizer-init``."""
    card = load_model(card) if not isinstance(card, ModelCard) else card
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(hf_config(card), indent=1) + "\n")
    return out


SHAPES = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
          "intermediate_size", "vocab_size", "max_position_embeddings", "dtype_bytes",
          "qkv_bias", "tie_word_embeddings")


def main(argv: list[str] | None = None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("card", help="a shipped model card (simserve/data/models)")
    ap.add_argument("out", help="directory to write config.json into")
    args = ap.parse_args(argv)
    from simserve.errors import SimserveError
    try:
        path = write_model_dir(args.card, args.out)
    except (SimserveError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path / "config.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
