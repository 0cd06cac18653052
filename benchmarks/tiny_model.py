"""Write the reference CPU server's tiny model (docs/fidelity.md, "The reference CPU server") as
a Hugging Face model folder without weights: ``config.json`` (``LlamaForCausalLM`` with the
shapes of simserve's ``tiny-llama-45m`` card) and a word-level tokenizer in which the word
``w<i>`` is token id ``i`` (ids 0-3: ``<unk>``, ``<s>``, ``</s>``, ``<pad>``), so a prompt of
N tokens is N words. vLLM serves it with random weights of its own (``--load-format dummy``):
every request's length is fixed (``ignore_eos``), so what the weights hold changes no step's
work.

    python benchmarks/tiny_model.py /tmp/tiny-llama

Plain JSON, written here: no torch, transformers or tokenizers needed to make it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from simserve.cards import load_model  # noqa: E402

SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
CARD = "tiny-llama-45m"


def config(card) -> dict:
    """The model's ``config.json``: the card's shapes, Llama's usual constants."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": card.hidden_size, "intermediate_size": card.intermediate_size,
        "num_hidden_layers": card.num_layers, "num_attention_heads": card.num_heads,
        "num_key_value_heads": card.num_kv_heads, "head_dim": card.head_dim,
        "vocab_size": card.vocab_size, "max_position_embeddings": card.max_position_embeddings,
        "tie_word_embeddings": card.tie_word_embeddings, "attention_bias": card.qkv_bias,
        "mlp_bias": False, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "initializer_range": 0.02, "torch_dtype": "bfloat16",
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
    }


def tokenizer(vocab_size: int) -> dict:
    """A ``tokenizers`` WordLevel tokenizer: split on whitespace, ``w<i>`` -> ``i``, decoded
    words joined by spaces."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update((f"w{i}", i) for i in range(len(SPECIALS), vocab_size))
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, tok in enumerate(SPECIALS)]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": None,
            "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}


def write(out: Path) -> Path:
    card = load_model(CARD)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "config.json": config(card),
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3},
        "tokenizer.json": tokenizer(card.vocab_size),
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>",
            "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
            "model_max_length": card.max_position_embeddings,
            "clean_up_tokenization_spaces": False},
        "special_tokens_map.json": {"unk_token": "<unk>", "bos_token": "<s>",
                                    "eos_token": "</s>", "pad_token": "<pad>"},
    }
    for name, body in files.items():
        (out / name).write_text(json.dumps(body, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the model folder to write (e.g. /tmp/tiny-llama)")
    print(f"wrote {write(ap.parse_args(argv).out)}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
