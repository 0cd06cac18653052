"""Mixture-of-experts cards, quantization and expert parallelism (issue #18): vendor numbers
reproduced from the cards, each roofline cost term computed by hand, bad input named."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings

from simserve.cards import load_hardware, load_model, serving_card
from simserve.config import parse_scenario
from simserve.errors import ConfigError
from simserve.kv.capacity import kv_block_bytes, kv_capacity_blocks
from simserve.latency.roofline import RooflineModel
from simserve.sched.plan import StepPlan

GIB = 2**30

# name: (total, active) as the vendor states them, and how our count is read to match
#   Qwen3 cards: "30.5B in total and 3.3B activated", "Non-Embedding: 29.9B" (likewise 235B /
#   22B / 234B); Mixtral paper: 47B / 13B; gpt-oss: 117B / 5.1B (active without the input
#   embedding lookup); DeepSeek-V3 README: 671B total, 37B activated.
def test_qwen3_30b_vendor_counts():
    c = load_model("Qwen3-30B-A3B")
    assert round(c.num_params / 1e9, 1) == 30.5
    assert round((c.num_params - 2 * c.embedding_params) / 1e9, 1) == 29.9
    assert int(c.active_params / 1e8) / 10 == 3.3     # 3.353B, stated as 3.3B
    # experts: 48 layers × 128 × 3 · 2048 · 768 = 28.99B (the digest's count)
    assert c.routed_expert_params == 48 * 128 * 3 * 2048 * 768


def test_qwen3_235b_vendor_counts():
    c = load_model("Qwen3-235B-A22B")
    assert round(c.num_params / 1e9) == 235
    assert round((c.num_params - 2 * c.embedding_params) / 1e9) == 234
    assert round(c.active_params / 1e9) == 22


def test_mixtral_vendor_counts():
    c = load_model("Mixtral-8x7B")
    assert round(c.num_params / 1e9) == 47 and round(c.active_params / 1e9) == 13


def test_gpt_oss_vendor_counts_and_mxfp4_bytes():
    c = load_model("gpt-oss-120b")
    assert round(c.num_params / 1e9, 1) == 116.8                 # model card: 116.8B
    assert round((c.active_params - c.embedding_params) / 1e9, 1) == 5.1
    # MXFP4 experts (17 B per 32 params) + the rest bf16: the model card's 60.8 GiB checkpoint
    assert c.weight_bytes / GIB == pytest.approx(60.8, rel=0.005)


def test_deepseek_v3_vendor_counts_and_fp8_bytes():
    c = load_model("DeepSeek-V3")
    assert round(c.num_params / 1e9) == 671
    assert int(c.active_params / 1e9) == 37
    assert c.moe_layers == 58 and c.dense_layers == 3
    # FP8 with 128×128 block scales: about 1 byte per parameter of the linears
    assert 0.99 < c.weight_bytes / c.num_params < 1.01


@pytest.mark.parametrize("name, per_token", [
    # GQA: 2 · layers · kv_heads · head_dim · 2 B; MLA: layers · (512 + 64) · 2 B
    ("Mixtral-8x7B", 2 * 32 * 8 * 128 * 2), ("Qwen3-30B-A3B", 2 * 48 * 4 * 128 * 2),
    ("Qwen3-235B-A22B", 2 * 94 * 4 * 128 * 2), ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2),
    ("DeepSeek-V3", 61 * 576 * 2)])
def test_kv_bytes_per_token_and_fp8_kv(name, per_token):
    card = load_model(name)
    assert card.kv_bytes_per_token == per_token
    assert serving_card(card, None, "fp8").kv_bytes_per_token == per_token // 2


def test_mla_latent_is_not_split_by_tp():
    c = load_model("DeepSeek-V3")
    assert c.kv_bytes_per_token_per_rank(8) == c.kv_bytes_per_token == 70272
    assert kv_block_bytes(c, 16, 8) == 16 * 70272


# ---------------------------------------------------------------- bad input

TOY_MOE = {"name": "toy-moe", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
           "head_dim": 16, "intermediate": 128, "vocab": 1000, "max_position_embeddings": 2048,
           "experts": 4, "experts_per_token": 2, "expert_intermediate": 32}
TOY_HW = {"name": "toy-gpu", "kind": "gpu", "peak_flops": 1e12, "mem_bandwidth": 1e11,
          "mem_bytes": 10_000_000, "interconnect_bandwidth": 1e10, "host_link_bandwidth": 1e9,
          "peak_flops_fp8": 2e12}


@pytest.mark.parametrize("change, field", [
    ({"experts_per_token": 5}, "model.experts_per_token"),          # top-k > experts
    ({"experts_per_token": 0}, "model.experts_per_token"),
    ({"experts": -1}, "model.experts"),
    ({"expert_intermediate": 0}, "model.expert_intermediate"),
    ({"first_dense_layers": 2}, "model.first_dense_layers"),
    ({"attention": "mha"}, "model.attention"),
    ({"kv_lora_rank": 8}, "model.kv_lora_rank"),                   # MLA field on a GQA card
    ({"expert_weight_dtype": "fp6"}, "model.expert_weight_dtype"),
])
def test_bad_moe_card_field_is_named(change, field):
    with pytest.raises(ConfigError) as e:
        load_model({**TOY_MOE, **change})
    assert e.value.field == field


def _scenario(**engine):
    return {"name": "moe", "model": "Qwen3-30B-A3B", "hardware": "H100-SXM",
            "engine": {"max_num_batched_tokens": 2048, **engine},
            "workload": {"num_requests": 4, "rate": 1, "prompt": {"dist": "fixed", "value": 32},
                         "output": {"dist": "fixed", "value": 4}}}


@pytest.mark.parametrize("engine, field, words", [
    ({"quantization": "fp8"}, "engine.quantization", "fp8_per_tensor"),
    ({"quantization": "int3"}, "engine.quantization", "unknown value"),
    ({"kv_cache_dtype": "fp4"}, "engine.kv_cache_dtype", "unknown value"),
    ({"expert_balancedness": 1.5}, "engine.expert_balancedness", "<= 1"),
    ({"expert_balancedness": 0}, "engine.expert_balancedness", "> 0"),
])
def test_bad_engine_knob_is_named(engine, field, words):
    with pytest.raises(ConfigError) as e:
        parse_scenario(_scenario(**engine))
    assert e.value.field == field and words in e.value.message


def test_ep_not_dividing_experts_says_stricter_than_vllm():
    raw = _scenario(tensor_parallel_size=2, enable_expert_parallel=True)
    raw["model"] = {"card": "Qwen3-30B-A3B", "experts": 127}
    with pytest.raises(ConfigError) as e:
        parse_scenario(raw)
    assert e.value.field == "engine.enable_expert_parallel"
    assert "127 experts" in e.value.message and "stricter than vLLM" in e.value.message


def test_expert_parallel_on_a_dense_model_is_refused():
    raw = _scenario(tensor_parallel_size=2, enable_expert_parallel=True)
    raw["model"] = "Llama-3.1-8B"
    with pytest.raises(ConfigError, match="dense model"):
        parse_scenario(raw)


def test_online_fp8_of_a_quantized_checkpoint_is_refused():
    with pytest.raises(ConfigError, match="already quantized"):
        serving_card(load_model("DeepSeek-V3"), "fp8_per_block")
    assert serving_card(load_model("DeepSeek-V3"), "fp8").fp8_compute


# ---------------------------------------------------------------- roofline terms by hand


def _roof(card=None, **kw):
    card = card or load_model(TOY_MOE)
    return RooflineModel(card, load_hardware(TOY_HW), flops_efficiency=1.0,
                         bandwidth_efficiency=1.0, **kw)


def test_expert_term_decode_reads_only_the_experts_hit():
    # one token, top-2 of 4 experts: it touches 2 experts (4 · (1 − (1 − 2/4)^1) = 2)
    #   weights 2 experts × 3 · 64 · 32 params × 2 B = 24,576 B;  activations 2 routed rows
    #   × (64 + 64 + 64 + 64) elements × 2 B = 1,024 B  → 25,600 B / 1e11 B/s = 2.56e-7 s
    #   FLOPs 2 rows × 2 · 3 · 64 · 32 = 24,576 / 1e12 = 2.46e-8 s: bandwidth bound
    t = _roof().moe_terms(1)
    assert t["experts"] == pytest.approx(2.56e-7, rel=1e-12)
    # router: 64 × 4 weights × 2 B = 512 B, + (64 + 4) × 2 B = 136 B per token → 6.48e-9 s
    assert t["router"] == pytest.approx(648 / 1e11, rel=1e-12)
    assert t["all2all"] == 0 and t["shared"] == 0


def test_expert_term_large_step_is_compute_bound():
    # 1000 tokens: every expert touched (4 · (1 − 0.5^1000) = 4); 2000 routed rows
    #   FLOPs 2000 × 12,288 = 2.4576e7 / 1e12 = 2.4576e-5 s
    #   bytes 4 × 12,288 × 2 + 2000 × 512 = 1,122,304 B → 1.12e-5 s
    assert _roof().moe_terms(1000)["experts"] == pytest.approx(2.4576e-5, rel=1e-12)


def test_touched_experts_match_balls_in_bins():
    # the digest's table, Qwen3 (E = 128, k = 8): 4 tokens → 29.1 experts, 16 → 82.4
    roof = RooflineModel(load_model("Qwen3-30B-A3B"), load_hardware("H100-SXM"))
    per_expert = roof._moe["exp_weight_s"]
    for n, hit in ((4, 29.1), (16, 82.4), (128, 128.0)):
        flop, a_s = roof._moe["exp_flop_s"], roof._moe["exp_act_s"]
        weight_part = roof.moe_terms(n)["experts"] - n * 8 * a_s
        assert max(n * 8 * flop, 0) < weight_part + n * 8 * a_s
        assert weight_part / per_expert == pytest.approx(hit, abs=0.05)


def test_fp8_weights_halve_the_weight_term_and_fp8_gemms_the_flop_term():
    bf16, fp8 = _roof(), _roof(serving_card(load_model(TOY_MOE), "fp8_per_tensor"))
    # decode, weight bound: weights 24,576 → 12,288 B, activations stay 1,024 B (bf16)
    assert fp8.moe_terms(1)["experts"] == pytest.approx((12_288 + 1_024) / 1e11, rel=1e-12)
    # large step, compute bound: the FP8 peak is 2e12
    assert fp8.moe_terms(1000)["experts"] == pytest.approx(
        bf16.moe_terms(1000)["experts"] / 2, rel=1e-12)


def test_tp_ep_splits_whole_experts_and_skew_loads_the_busiest_rank():
    card = load_model(TOY_MOE)
    ep = _roof(card, tensor_parallel_size=2, enable_expert_parallel=True)
    # 1000 tokens, 2000 routed rows over 2 ranks: 1000 on each, whole experts (2 per rank):
    #   FLOPs 1000 × 12,288 / 1e12 = 1.2288e-5 s
    assert ep.moe_terms(1000)["experts"] == pytest.approx(1.2288e-5, rel=1e-12)
    skew = _roof(card, tensor_parallel_size=2, enable_expert_parallel=True,
                 expert_balancedness=0.5)
    # balancedness 0.5: the busiest rank gets twice the mean, 2000 rows (capped at 1000 × 2)
    assert skew.moe_terms(1000)["experts"] == pytest.approx(2.4576e-5, rel=1e-12)
    assert ep.moe_terms(1000)["all2all"] == 0        # TP + EP: all-reduce, no all-to-all


def test_dp_ep_all_to_all_on_the_link():
    card = load_model(TOY_MOE)
    ag = _roof(card, data_parallel_size=2, enable_expert_parallel=True)
    # allgather_reducescatter: 2 · (2−1)/2 · (10 tokens × 2 ranks) · 64 · 2 B = 2,560 B
    #   / 1e10 B/s + 2 × 10 µs
    assert ag.moe_terms(10)["all2all"] == pytest.approx(2560 / 1e10 + 20e-6, rel=1e-12)
    ll = _roof(card, data_parallel_size=2, enable_expert_parallel=True,
               all2all_backend="deepep_low_latency")
    # DeepEP: 10 tokens × 2 copies × ((64 + 64/128·4) FP8 dispatch + 64 · 2 bf16 combine)
    assert ll.moe_terms(10)["all2all"] == pytest.approx(20 * (66 + 128) / 1e10 + 20e-6)


def test_mla_absorbed_decode_flops():
    # per attended token per layer: 2 · H · (512 + 64) + 2 · H · 512 = 278,528 FLOPs at H=128
    roof = RooflineModel(load_model("DeepSeek-V3"), load_hardware("H100-SXM"),
                         flops_efficiency=1.0, tensor_parallel_size=8,
                         enable_expert_parallel=True)
    assert roof._dec_flop_s * 989e12 / 61 == pytest.approx(278_528 / 8, rel=1e-12)
    # the latent row is read whole on every rank: 576 × 2 B per layer
    assert roof._kv_tok_s * 3.35e12 * 0.8 / 61 == pytest.approx(1152, rel=1e-12)


def test_moe_step_prices_and_breakdown_sum():
    roof = RooflineModel(serving_card(load_model("Qwen3-30B-A3B"), "fp8_per_block", "fp8"),
                         load_hardware("H100-SXM"), tensor_parallel_size=2,
                         enable_expert_parallel=True)
    plan = StepPlan((1, 2), (100, 1), (100,), (0,), (500,), 2)
    assert sum(roof.breakdown(plan).values()) == pytest.approx(roof.step_time(plan), rel=1e-12)
    assert "MoE TP 2 EP 2" in roof.label
    # more decoding sequences touch more experts: a step of 64 costs more than 8× a step of 1
    one = StepPlan((1,), (1,), (), (), (500,), 1)
    many = StepPlan(tuple(range(64)), (1,) * 64, (), (), (500,) * 64, 64)
    assert roof.breakdown(many)["linear"] > 8 * roof.breakdown(one)["linear"]


# ---------------------------------------------------------------- capacity


def test_fp8_kv_doubles_blocks_for_the_same_free_bytes():
    card = load_model(TOY_MOE)
    hw = load_hardware(TOY_HW)
    kw = dict(block_size=16, gpu_memory_utilization=0.5, max_num_batched_tokens=32,
              max_num_seqs=8)
    # block: 16 · 2 · 2 layers · 2 kv heads · 16 · 2 B = 4,096 B; fp8: 2,048 B
    assert kv_block_bytes(card, 16) == 4096
    fp8 = serving_card(card, None, "fp8")
    assert kv_block_bytes(fp8, 16) == 2048
    # weights: emb + head 128,000 + norm 64 + 2 × (attention 12,288 + router 256 + 4 experts
    #   × 6,144 + norms 128) = 202,560 params → 405,120 B. Reserve (MoE): 2·32·64·2 = 8,192 +
    #   max(3 · 32 · 2 · 32 · 2 = 12,288, logits 48,000) = 56,192.
    assert card.weight_bytes == 405_120
    free = 10_000_000 * 0.5 - 405_120 - 56_192     # 4,538,688 B: 1,108.1 and 2,216.2 blocks
    assert kv_capacity_blocks(card, hw, **kw) == int(free // 4096) == 1108
    assert kv_capacity_blocks(fp8, hw, **kw) == int(free // 2048) == 2216


def test_expert_parallel_frees_memory_per_rank():
    card = load_model("Qwen3-30B-A3B")
    # TP 2 shards every expert in half; EP 2 gives each rank half the experts whole: the same
    # bytes per rank (whole model / 2), so the KV room matches
    assert card.weight_bytes_per_rank(2, 2) == pytest.approx(card.weight_bytes_per_rank(2, 1))
    # ...which holds too if EP were ignored; at TP 1, EP 2 leaves each rank half the routed
    # experts (bf16) and everything else whole
    experts = card.routed_expert_params * 2
    assert card.weight_bytes_per_rank(1, 2) == card.weight_bytes - experts / 2
    assert card.weight_bytes_per_rank(1, 1) == card.weight_bytes
    fp8 = serving_card(card, "fp8_per_block")
    # FP8 (+ 4 B per 128×128 block) for the linears and experts; the embedding, LM head, final
    # norm and per layer the router (2048 × 128), two norms and the q/k norms stay 2 bytes
    rest = 2 * 151936 * 2048 + 2048 + 48 * (2048 * 128 + 2 * 2048 + 2 * 128)
    assert fp8.weight_bytes == round((card.num_params - rest) * (1 + 4 / 16384) + rest * 2)


def test_done_scenario_block_counts():
    raw = _scenario(tensor_parallel_size=2, enable_expert_parallel=True,
                    quantization="fp8_per_block", kv_cache_dtype="fp8")
    s = parse_scenario(raw)
    bf16 = parse_scenario(_scenario(tensor_parallel_size=2, enable_expert_parallel=True))
    def num_kv_blocks(sc):
        return sc.replica.num_gpu_blocks
    # FP8 weights free ~14 GB per rank and FP8 KV halves a block: far more than 2× the blocks
    assert num_kv_blocks(s) > 2 * num_kv_blocks(bf16)
    assert s.to_dict()["engine"]["kv_cache_dtype"] == "fp8"
    again = parse_scenario(copy.deepcopy(s.to_dict()))
    assert again.model == s.model and num_kv_blocks(again) == num_kv_blocks(s)


# ---------------------------------------------------------------- fast-forward == stepping

from tests.property.test_properties import _by_replica, run_checked, scenarios  # noqa: E402


def _moe_roofline():
    return RooflineModel(serving_card(load_model("Qwen3-30B-A3B"), "fp8_per_block", "fp8"),
                         load_hardware("H100-SXM"), tensor_parallel_size=2,
                         enable_expert_parallel=True, expert_balancedness=0.8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_fast_forward_equals_stepping_on_the_moe_roofline(case):
    fast, _, _ = run_checked(*case, fast_forward=True, latency=_moe_roofline())
    slow, _, _ = run_checked(*case, fast_forward=False, latency=_moe_roofline())
    assert _by_replica(fast) == _by_replica(slow)
    for a, b in zip(fast.requests, slow.requests, strict=True):
        assert a.finish_s == b.finish_s and a.token_times == b.token_times


def test_dp_ep_runs_as_ranks_with_their_own_kv():
    from simserve.engine.build import build_latency, build_replicas
    raw = _scenario(data_parallel_size=2, enable_expert_parallel=True)
    s = parse_scenario(raw)
    reps = build_replicas(s)
    assert len(reps) == 2 and reps[0].scheduler.blocks is not reps[1].scheduler.blocks
    lat = build_latency(s)
    assert "DP 2 EP 2" in lat.label and lat.moe_terms(8)["all2all"] > 0
    # per rank: attention, embedding, head whole (TP 1), half the experts
    card = s.model
    experts = card.routed_expert_params * 2
    assert card.weight_bytes_per_rank(1, 2) == card.weight_bytes - experts / 2
    tp_ep = parse_scenario(_scenario(tensor_parallel_size=2, enable_expert_parallel=True))
    assert s.replica.num_gpu_blocks < tp_ep.replica.num_gpu_blocks   # KV heads not split


@pytest.mark.parametrize("engine, words", [
    ({"data_parallel_size": 2}, "enable_expert_parallel"),
    ({"data_parallel_size": 2, "enable_expert_parallel": True,
      "all2all_backend": "pplx_magic"}, "unknown value"),
])
def test_bad_dp_knobs(engine, words):
    with pytest.raises(ConfigError, match=words) as e:
        parse_scenario(_scenario(**engine))
    assert e.value.field.startswith("engine.")


def test_int4_and_mxfp4_are_weight_only():
    card = load_model("Qwen3-30B-A3B")
    awq = serving_card(card, "awq")
    # INT4 with an fp16 scale per group of 128: 0.5 + 2/128 bytes per parameter, 16-bit GEMMs
    assert awq.expert_bytes == awq.linear_bytes == 0.515625 and not awq.fp8_compute
    oss = serving_card(load_model("gpt-oss-120b"), "mxfp4")
    assert oss.expert_bytes == 17 / 32 and oss.linear_bytes == 2 and not oss.fp8_compute
    with pytest.raises(ConfigError, match="no MXFP4"):
        serving_card(card, "mxfp4")
    # without FP8 tensor cores (A100) FP8 GEMMs run at the 16-bit peak (vLLM: W8A16 Marlin)
    a100 = load_hardware("A100-80GB")
    assert a100.peak_flops_fp8 is None and a100.fp8_flops == a100.peak_flops


def test_llama4_scout_card_reproduces_the_vendors_active_parameters():
    # Meta's card: "17B active parameters", 16 experts; every layer MoE (top-1 routed expert
    # plus the shared expert); its text weights are 107.8 B (the 109 B total counts the vision
    # encoder, not in the card). KV of one token: 2 · 48 layers · 8 KV heads · 128 · 2 B.
    card = load_model("Llama-4-Scout-17B-16E-FP8")
    assert card.moe_layers == 48 and card.num_experts == 16 and card.experts_per_token == 1
    assert card.active_params == pytest.approx(17e9, rel=0.02)
    assert card.num_params == pytest.approx(107.77e9, rel=0.001)
    assert card.kv_bytes_per_token == 2 * 48 * 8 * 128 * 2
    assert card.fp8_compute      # the FP8-dynamic checkpoint's W8A8 GEMMs
