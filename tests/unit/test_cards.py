"""Model cards, hardware specs and KV capacity."""

from __future__ import annotations

import pytest

from simserve.cards import (HardwareSpec, list_hardware, list_models, load_hardware,
                            load_model)
from simserve.errors import ConfigError
from simserve.kv.capacity import activation_reserve_bytes, kv_block_bytes, kv_capacity_blocks

# name: (kv_bytes_per_token = 2 · layers · kv_heads · head_dim · 2, published size, tolerance)
CARDS = {
    "Llama-3.1-8B": (2 * 32 * 8 * 128 * 2, 8.03e9, 0.01),
    "Llama-3.1-70B": (2 * 80 * 8 * 128 * 2, 70.6e9, 0.01),
    "Qwen2.5-7B": (2 * 28 * 4 * 128 * 2, 7.6e9, 0.02),
    "Mistral-7B": (2 * 32 * 8 * 128 * 2, 7.25e9, 0.01),
    "Llama-2-7B": (2 * 32 * 32 * 128 * 2, 6.74e9, 0.01),
    "tiny-llama-45m": (2 * 4 * 8 * 64 * 2, 45.6e6, 0.005),
    # the seed papers' models (issue #17); published sizes as their names or cards give them
    "OPT-13B": (2 * 40 * 40 * 128 * 2, 13e9, 0.02),
    "OPT-66B": (2 * 64 * 72 * 128 * 2, 66e9, 0.01),
    "OPT-175B": (2 * 96 * 96 * 128 * 2, 175e9, 0.01),
    "Mistral-7B-v0.2": (2 * 32 * 8 * 128 * 2, 7.3e9, 0.01),
    "Yi-34B": (2 * 60 * 8 * 128 * 2, 34e9, 0.02),
    "Falcon-180B": (2 * 80 * 8 * 64 * 2, 180e9, 0.01),
}

TOY = {"name": "toy", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
       "intermediate": 128, "vocab": 1000, "max_position_embeddings": 2048}
TOY_HW = {"name": "toy-gpu", "kind": "gpu", "peak_flops": 1e12, "mem_bandwidth": 1e11,
          "mem_bytes": 10_000_000, "interconnect_bandwidth": 1e10, "host_link_bandwidth": 1e9}


# mixture-of-experts cards: tested against their vendors' numbers in tests/test_moe.py
MOE_CARDS = ("DeepSeek-V3", "Llama-4-Scout-17B-16E-FP8", "Mixtral-8x7B", "Qwen3-235B-A22B",
             "Qwen3-30B-A3B", "gpt-oss-120b")


def test_every_shipped_card_is_listed():
    assert sorted([*CARDS, *MOE_CARDS]) == sorted(list_models())


@pytest.mark.parametrize("name", sorted(CARDS))
def test_shipped_card_shapes(name):
    kv_bytes, params, tol = CARDS[name]
    card = load_model(name)
    assert card.name == name and card.source
    assert card.dtype_bytes == 2
    assert card.kv_bytes_per_token == kv_bytes
    assert card.num_params == pytest.approx(params, rel=tol)
    assert card.weight_bytes == 2 * card.num_params


def test_tiny_llama_params_exact():
    # embedding 32000·512 = 16,384,000, untied LM head the same;
    # per layer: q,k,v,o 4·512·512 = 1,048,576 + MLP 3·512·1408 = 2,162,688 + norms 1,024
    #            = 3,212,288; × 4 layers = 12,849,152; final norm 512
    assert load_model("tiny-llama-45m").num_params == 2 * 16_384_000 + 12_849_152 + 512


def test_qkv_bias_counted():
    qwen = load_model("Qwen2.5-7B")
    no_bias = load_model({"card": "Qwen2.5-7B", "qkv_bias": False})
    assert qwen.num_params - no_bias.num_params == 28 * (3584 + 2 * 4 * 128)


def test_name_is_case_insensitive():
    assert load_model("llama-3.1-8b") == load_model("Llama-3.1-8B")


def test_inline_shapes_with_defaults():
    card = load_model({"name": "x", "layers": 2, "hidden": 256, "heads": 4, "intermediate": 512,
                       "vocab": 100, "max_position_embeddings": 128})
    assert (card.head_dim, card.num_kv_heads, card.dtype_bytes) == (64, 4, 2)
    assert not card.qkv_bias and not card.tie_word_embeddings


def test_tied_embeddings_drop_lm_head():
    tied = load_model({**TOY, "tie_word_embeddings": True})
    assert load_model(TOY).num_params - tied.num_params == 1000 * 64


def test_overrides_change_only_what_they_name():
    base = load_model("Llama-3.1-8B")
    card = load_model({"card": "Llama-3.1-8B", "layers": 16})
    assert card.num_layers == 16 and card.hidden_size == base.hidden_size
    assert card.kv_bytes_per_token == base.kv_bytes_per_token // 2
    assert "overridden: layers=16" in card.source


@pytest.mark.parametrize("name", sorted(CARDS) + sorted(MOE_CARDS))
def test_to_dict_round_trips(name):
    card = load_model(name)
    assert load_model(card.to_dict()) == card


def test_card_instance_passes_through():
    card = load_model("Mistral-7B")
    assert load_model(card) is card


def test_unknown_name_lists_available():
    with pytest.raises(ConfigError) as e:
        load_model("llama-9")
    assert e.value.field == "model"
    assert "Llama-3.1-8B" in e.value.message and "tiny-llama-45m" in e.value.message


def test_unknown_card_in_overrides():
    with pytest.raises(ConfigError) as e:
        load_model({"card": "nope", "layers": 2}, path="replicas[0].model")
    assert e.value.field == "replicas[0].model.card"


@pytest.mark.parametrize("change, field", [
    ({"layers": "many"}, "model.layers"),
    ({"layers": 0}, "model.layers"),
    ({"kv_heads": 3}, "model.kv_heads"),
    ({"heads": 3, "head_dim": None}, "model.head_dim"),
    ({"qkv_bias": "yes"}, "model.qkv_bias"),
    ({"colour": "red"}, "model.colour"),
])
def test_bad_field_is_named(change, field):
    raw = {k: v for k, v in {**TOY, **change}.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        load_model(raw)
    assert e.value.field == field


def test_missing_field_is_named():
    raw = dict(TOY)
    del raw["vocab"]
    with pytest.raises(ConfigError, match=r"^model\.vocab: is required"):
        load_model(raw)


def test_not_a_name_or_mapping():
    with pytest.raises(ConfigError, match="^model:"):
        load_model(7)


# ---------------------------------------------------------------- hardware


def test_shipped_hardware():
    assert list_hardware() == ["A100-40GB", "A100-80GB", "A100-80GB-PCIe", "H100-SXM", "H200",
                               "L40S", "cpu-epyc-2core"]
    h100 = load_hardware("h100-sxm")
    assert (h100.kind, h100.peak_flops, h100.mem_bandwidth) == ("gpu", 989e12, 3.35e12)
    assert (h100.mem_bytes, h100.interconnect_bandwidth) == (80 * 10**9, 450e9)
    assert load_hardware("cpu-epyc-2core").kind == "cpu"
    for name in list_hardware():
        spec = load_hardware(name)
        # a datasheet, third-party spec tables quoting one (A100-80GB-PCIe), or a measurement
        assert any(k in spec.source for k in ("datasheet", "spec table", "measured by"))
        assert load_hardware(spec.to_dict()) == spec


def test_hardware_inline_accepts_exponent_strings():
    # YAML 1.1 reads 80e9 as a string
    spec = load_hardware({**TOY_HW, "mem_bytes": "80e9", "peak_flops": "1e15"})
    assert isinstance(spec, HardwareSpec) and spec.mem_bytes == 80 * 10**9
    assert spec.peak_flops == 1e15


def test_hardware_override():
    spec = load_hardware({"spec": "H100-SXM", "mem_bytes": 94e9})
    assert spec.mem_bytes == 94 * 10**9 and spec.mem_bandwidth == 3.35e12


@pytest.mark.parametrize("change, field", [
    ({"kind": "tpu"}, "hardware.kind"),
    ({"peak_flops": 0}, "hardware.peak_flops"),
    ({"mem_bandwidth": "fast"}, "hardware.mem_bandwidth"),
    ({"nvlink": 1}, "hardware.nvlink"),
    ({"scaleout_latency": -1e-6}, "hardware.scaleout_latency"),
    ({"scaleout_latency": 2.0}, "hardware.scaleout_latency"),
])
def test_bad_hardware_field_is_named(change, field):
    with pytest.raises(ConfigError) as e:
        load_hardware({**TOY_HW, **change})
    assert e.value.field == field


def test_unknown_hardware_lists_available():
    with pytest.raises(ConfigError, match=r"^hardware: unknown name 'B200'.*H100-SXM"):
        load_hardware("B200")


# ---------------------------------------------------------------- KV capacity


def test_capacity_hand_computed():
    model, hw = load_model(TOY), load_hardware(TOY_HW)
    # block: 16 tokens · 2 (K,V) · 2 layers · 2 kv heads · 16 head_dim · 2 B = 4,096 B
    assert kv_block_bytes(model, 16) == 4096
    # params: embedding 64,000 + LM head 64,000 + final norm 64
    #   + 2 layers × (q,k,v,o 64·(64+32+32) + 64·64 = 12,288; MLP 3·64·128 = 24,576; norms 128)
    #   = 202,048 → 404,096 B
    assert model.weight_bytes == 404_096
    # reserve, T = 32 tokens, 8 sampled rows: residual 2·32·64·2 = 8,192
    #   + max(MLP 3·32·128·2 = 24,576, logits 8·1000·(2+4) = 48,000)
    assert activation_reserve_bytes(model, max_num_batched_tokens=32, max_num_seqs=8) == 56_192
    # (10,000,000 · 0.5 − 404,096 − 56,192) / 4,096 = 1,108.3
    blocks = kv_capacity_blocks(model, hw, block_size=16, gpu_memory_utilization=0.5,
                                max_num_batched_tokens=32, max_num_seqs=8)
    assert blocks == 1108


def test_tensor_parallel_more_than_doubles_blocks_per_rank():
    model, hw = load_model(TOY), load_hardware(TOY_HW)
    kw = dict(block_size=16, gpu_memory_utilization=0.5, max_num_batched_tokens=32,
              max_num_seqs=8)
    # each rank holds half the KV heads (block 2,048 B) and half the weights
    assert kv_block_bytes(model, 16, 2) == 2048
    one = kv_capacity_blocks(model, hw, **kw)
    two = kv_capacity_blocks(model, hw, tensor_parallel_size=2, **kw)
    assert two >= 2 * one
    # (5,000,000 − 202,048 − (8,192 + max(12,288, 48,000))) / 2,048 = 2,315.3
    assert two == 2315


def test_kv_heads_replicated_when_fewer_than_ranks():
    model = load_model("Llama-3.1-70B")  # 8 KV heads
    # TP 8: one KV head per rank; TP 16: still one (replicated), not half of one:
    # 16 tokens x K and V x 80 layers x 1 head x 128 x 2 bytes = 655,360
    assert kv_block_bytes(model, 16, 16) == kv_block_bytes(model, 16, 8) == 655_360


def test_llama_8b_on_h100():
    blocks = kv_capacity_blocks(load_model("Llama-3.1-8B"), load_hardware("H100-SXM"),
                                block_size=16, gpu_memory_utilization=0.9,
                                max_num_batched_tokens=8192)
    # 72 GB − 16.06 GB weights − under 1 GB reserve, in 2 MiB blocks: about 26k blocks
    assert 25_000 < blocks < 27_000


def test_weights_too_big():
    with pytest.raises(ConfigError) as e:
        kv_capacity_blocks(load_model("Llama-3.1-70B"), load_hardware("H100-SXM"), block_size=16,
                           gpu_memory_utilization=0.9, max_num_batched_tokens=8192)
    # more than the whole device: no utilisation could help, so the error is the model's
    assert e.value.field == "model"
    assert "141.1 GB per device" in e.value.message and "80.0 GB of H100-SXM" in e.value.message
    assert kv_capacity_blocks(load_model("Llama-3.1-70B"), load_hardware("H100-SXM"),
                              block_size=16, gpu_memory_utilization=0.9,
                              tensor_parallel_size=4, max_num_batched_tokens=8192) > 0


def test_bad_tensor_parallel_size():
    with pytest.raises(ConfigError, match="^engine.tensor_parallel_size:"):
        kv_block_bytes(load_model("Llama-3.1-8B"), 16, 3)


def test_card_is_frozen():
    import dataclasses
    card = load_model("Llama-3.1-8B")
    with pytest.raises(dataclasses.FrozenInstanceError, match="num_layers"):
        card.num_layers = 1  # type: ignore[misc]
    assert card.num_layers == 32 and load_model("Llama-3.1-8B").num_layers == 32
