"""Speculative decoding (issue #18): vLLM's knobs and synthetic acceptance model, the verify
step's price, the drafter's cost."""

from __future__ import annotations

import statistics

import pytest

from simserve.cards import load_hardware, load_model, serving_card
from simserve.errors import ConfigError
from simserve.fields import Fields
from simserve.latency.roofline import RooflineModel
from simserve.latency.spec import SpeculativeLatency, drafter_card
from simserve.sched.plan import StepPlan
from simserve.sched.spec import Acceptance, SpeculativeConfig

WHERE = "engine.speculative_config"


def spec(**kw) -> SpeculativeConfig:
    return SpeculativeConfig.from_fields(Fields(kw, WHERE))


@pytest.mark.parametrize("kw, field", [
    ({"num_speculative_tokens": -1}, "num_speculative_tokens"),      # k < 0
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),       # vLLM: gt=0
    ({"synthetic_acceptance_rates": [0.9, 1.2]}, "synthetic_acceptance_rates[1]"),
    ({"synthetic_acceptance_rates": [-0.1, 0.0]}, "synthetic_acceptance_rates[0]"),
    ({"synthetic_acceptance_rates": [0.5, 0.6]}, "synthetic_acceptance_rates"),  # increasing
    ({"synthetic_acceptance_rates": [0.5]}, "synthetic_acceptance_rates"),       # length != k
    ({"synthetic_acceptance_rates": None, "synthetic_acceptance_length": 3.5},
     "synthetic_acceptance_length"),                                  # > k + 1
    ({"synthetic_acceptance_rates": None, "synthetic_acceptance_length": 0.5},
     "synthetic_acceptance_length"),
    ({"method": "medusa"}, "method"),
    ({"method": "draft_model"}, "model"),
    ({"prompt_lookup_min": 3}, "prompt_lookup_min"),                  # an ngram knob
])
def test_bad_speculative_config_is_named(kw, field):
    raw = {"method": "eagle3", "num_speculative_tokens": 2,
           "synthetic_acceptance_rates": [0.8, 0.6], **kw}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        spec(**raw)
    assert e.value.field == f"{WHERE}.{field}"


def test_both_or_neither_acceptance_knob_is_refused():
    with pytest.raises(ConfigError, match="exactly one"):
        spec(method="eagle", num_speculative_tokens=2)
    with pytest.raises(ConfigError, match="exactly one"):
        spec(method="eagle", num_speculative_tokens=2, synthetic_acceptance_rates=[1, 1],
             synthetic_acceptance_length=2.0)


def test_acceptance_length_resolves_like_vllm():
    # vLLM's minimum-variance schedule: L = 2.5, k = 3 → [1.0, 0.5, 0.0]
    c = spec(method="mtp", num_speculative_tokens=3, synthetic_acceptance_length=2.5)
    assert c.acceptance_rates == (1.0, 0.5, 0.0)
    assert c.mean_acceptance_length == 2.5
    assert c.conditional == (1.0, 0.5, 0.0)
    assert c.lookahead == 3
    ngram = spec(method="ngram", num_speculative_tokens=4, synthetic_acceptance_length=5.0,
                 prompt_lookup_min=2, prompt_lookup_max=5)
    assert ngram.lookahead == 0 and ngram.acceptance_rates == (1.0,) * 4


def test_acceptance_draws_match_the_rates():
    # i.i.d. α = 0.8, k = 3: unconditional rates α, α², α³; E[tokens/step] = (1−α⁴)/(1−α)
    c = spec(method="eagle", num_speculative_tokens=3,
             synthetic_acceptance_rates=[0.8, 0.64, 0.512])
    acc = Acceptance(c, seed=11)
    draws = [acc.accepted(r, p, 3) for r in range(300) for p in range(100)]
    assert statistics.mean(draws) + 1 == pytest.approx((1 - 0.8 ** 4) / 0.2, abs=0.03)
    # per position, P(first i+1 accepted) ≈ p_i
    for i, p in enumerate(c.acceptance_rates):
        assert sum(d > i for d in draws) / len(draws) == pytest.approx(p, abs=0.015)
    # a pure function of (seed, request, position): same draw again, another seed differs
    assert [acc.accepted(r, 7, 3) for r in range(50)] == \
        [Acceptance(c, 11).accepted(r, 7, 3) for r in range(50)]
    assert [acc.accepted(r, 7, 3) for r in range(50)] != \
        [Acceptance(c, 12).accepted(r, 7, 3) for r in range(50)]
    # fewer drafts scheduled (budget clipped): never more accepted than scheduled
    assert all(acc.accepted(r, 0, 1) <= 1 for r in range(100))
    assert all(acc.accepted(r, 0, 0) == 0 for r in range(10))


def test_certain_and_impossible_acceptance():
    yes = Acceptance(spec(method="eagle", num_speculative_tokens=2,
                          synthetic_acceptance_rates=[1, 1]), 0)
    no = Acceptance(spec(method="eagle", num_speculative_tokens=2,
                         synthetic_acceptance_rates=[0, 0]), 0)
    assert {yes.accepted(r, 3, 2) for r in range(100)} == {2}
    assert {no.accepted(r, 3, 2) for r in range(100)} == {0}


# ---------------------------------------------------------------- pricing

TOY = {"name": "toy", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16,
       "intermediate": 128, "vocab": 1000, "max_position_embeddings": 2048}
TOY_HW = {"name": "toy-gpu", "kind": "gpu", "peak_flops": 1e12, "mem_bandwidth": 1e11,
          "mem_bytes": 10_000_000, "interconnect_bandwidth": 1e10, "host_link_bandwidth": 1e9}


def _roof():
    return RooflineModel(load_model(TOY), load_hardware(TOY_HW), flops_efficiency=1.0,
                         bandwidth_efficiency=1.0, step_overhead_s=0.0)


def test_verify_is_a_q_token_chunk_on_the_decode_path():
    roof = _roof()
    # one sequence, context 100, verifying 3 drafts: q = 4 tokens
    verify = StepPlan((1,), (4,), (), (), (100,), 1, decode_q=(4,))
    chunk = StepPlan((1,), (4,), (4,), (100,), (), 1)
    v, c = roof.breakdown(verify), roof.breakdown(chunk)
    # linear ops and attention are those of a 4-token chunk after 100 cached tokens:
    #   pairs 4 · (100 + 5/2) = 410, K/V of 104 tokens read once
    assert v["linear"] == c["linear"] and v["attention_decode"] == c["attention_prefill"]
    # the LM head scores all 4 positions: 4 rows, as 4 decodes would
    four = StepPlan((1, 2, 3, 4), (1,) * 4, (), (), (100,) * 4, 4)
    assert v["lm_head"] == roof.breakdown(four)["lm_head"]
    assert verify.num_batched_tokens == 4


def test_verify_of_one_token_prices_as_a_decode():
    roof = _roof()
    plain = StepPlan((1, 2), (1, 1), (), (), (50, 70), 2)
    assert roof.step_time(plain._replace(decode_q=(1, 1))) == pytest.approx(
        roof.step_time(plain), rel=1e-12)


def test_drafter_cost_eagle_by_hand():
    target = load_model(TOY)
    cfg = spec(method="eagle", num_speculative_tokens=3, synthetic_acceptance_length=2.0)
    head = drafter_card(target, cfg)
    assert head.num_layers == 1 and not head.is_moe
    lat = SpeculativeLatency(_roof(), cfg, target, load_hardware(TOY_HW),
                             flops_efficiency=1.0, bandwidth_efficiency=1.0)
    plan = StepPlan((1, 2), (4, 4), (), (), (100, 20), 2, decode_q=(4, 4))
    d = RooflineModel(head, load_hardware(TOY_HW), flops_efficiency=1.0,
                      bandwidth_efficiency=1.0, step_overhead_s=0.0)
    # one drafter pass over the step's 8 tokens, then k − 1 = 2 passes of one token per
    # request at contexts 104 and 24
    one = StepPlan((0, 1), (1, 1), (), (), (104, 24), 2)
    want = d.step_time(plan) + 2 * d.step_time(one)
    assert lat.draft_s(plan) == pytest.approx(want, rel=1e-12)
    assert lat.step_time(plan) == pytest.approx(_roof().step_time(plan) + want, rel=1e-12)
    assert lat.breakdown(plan)["draft"] == lat.draft_s(plan)


def test_ngram_costs_nothing_and_mtp_is_a_target_layer():
    target = serving_card(load_model("DeepSeek-V3"), None)
    mtp = drafter_card(target, spec(method="mtp", num_speculative_tokens=1,
                                    synthetic_acceptance_rates=[0.85]))
    assert mtp.num_layers == 1 and mtp.is_moe and mtp.is_mla
    ngram = spec(method="ngram", num_speculative_tokens=2, synthetic_acceptance_length=2.0)
    lat = SpeculativeLatency(_roof(), ngram, load_model(TOY), load_hardware(TOY_HW))
    plan = StepPlan((1,), (3,), (), (), (10,), 1, decode_q=(3,))
    assert lat.draft_s(plan) == 0.0 and lat.step_time(plan) == _roof().step_time(plan)
