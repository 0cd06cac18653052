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


def test_the_steps_fixed_device_time_is_paid_once_not_per_drafter_pass():
    from dataclasses import replace

    from simserve.latency.efficiency import load_curves
    target, hw = load_model("Llama-3.1-8B"), load_hardware("H100-SXM")
    cfg = spec(method="eagle3", num_speculative_tokens=3, synthetic_acceptance_length=2.0)
    curves = load_curves("h100-vllm")
    assert curves.device_step_s > 0
    plan = StepPlan((1, 2), (4, 4), (), (), (1000, 800), 2, decode_q=(4, 4))

    def draft(c):
        base = RooflineModel(target, hw, curves=c)
        return SpeculativeLatency(base, cfg, target, hw, curves=c)

    with_step, without = draft(curves), draft(replace(curves, device_step_s=0.0))
    assert with_step.draft_s(plan) == without.draft_s(plan) > 0
    # ... while the target's own step pays it, once
    assert with_step.step_time(plan) - without.step_time(plan) == pytest.approx(
        curves.device_step_s, rel=1e-9)


def test_ngram_costs_nothing_and_mtp_is_a_target_layer():
    target = serving_card(load_model("DeepSeek-V3"), None)
    mtp = drafter_card(target, spec(method="mtp", num_speculative_tokens=1,
                                    synthetic_acceptance_rates=[0.85]))
    assert mtp.num_layers == 1 and mtp.is_moe and mtp.is_mla
    ngram = spec(method="ngram", num_speculative_tokens=2, synthetic_acceptance_length=2.0)
    lat = SpeculativeLatency(_roof(), ngram, load_model(TOY), load_hardware(TOY_HW))
    plan = StepPlan((1,), (3,), (), (), (10,), 1, decode_q=(3,))
    assert lat.draft_s(plan) == 0.0 and lat.step_time(plan) == _roof().step_time(plan)


# ---------------------------------------------------------------- the scheduler core


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from simserve.engine import Replica, round_robin, simulate  # noqa: E402
from simserve.kv.blocks import BlockManager  # noqa: E402
from simserve.sched import POLICIES, SchedulerLimits  # noqa: E402
from simserve.workload.spec import RequestSpec  # noqa: E402
from tests.helpers import make_request, step, tokens  # noqa: E402


def spec_scheduler(policy="vllm_v1", *, k=2, rates=(1.0, 1.0), method="eagle", budget=100,
                   num_blocks=100, block_size=4, max_model_len=0):
    cfg = spec(method=method, num_speculative_tokens=k, synthetic_acceptance_rates=list(rates))
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget,
                             enable_chunked_prefill=True, max_model_len=max_model_len,
                             speculative_config=cfg)
    return POLICIES[policy](limits, BlockManager(num_blocks, block_size, 0))


def test_verify_steps_by_hand():
    s = spec_scheduler(k=2, rates=(1.0, 1.0))
    req = make_request(1, prompt=10, output=5)
    s.add(req)
    p1 = step(s)
    # prefill of 10 tokens samples the first output token; KV slots for 10 + 2 lookahead = 12
    # tokens: 3 blocks of 4
    assert tokens(p1) == {1: 10} and p1.decode_q == () and s.blocks.held(1) == 3
    assert (req.num_generated, s.sampled_tokens) == (1, [1])
    p2 = step(s)
    # a verify: its last token + 2 drafts = 3 tokens at context 10; both accepted (rate 1):
    # 3 tokens out, KV keeps 10 + 1 + 2 = 13; slots 10 + 3 + 2 = 15 → 4 blocks
    assert tokens(p2) == {1: 3} and p2.decode_ctx == (10,) and p2.decode_q == (3,)
    assert p2.num_batched_tokens == 3 and p2.num_sampled == 1 and p2.prefill_lens == ()
    assert (req.num_generated, req.num_computed_tokens, s.sampled_tokens) == (4, 13, [3])
    assert s.blocks.held(1) == 4
    p3 = step(s)
    # one output token left: 3 scheduled, 3 accepted, trimmed to 1 (the stop check)
    assert p3.decode_q == (3,) and req.num_generated == 5 and s.sampled_tokens == [1]
    assert req.status.value == "finished" and s.blocks.num_used == 0
    assert (req.num_drafts, req.num_draft_tokens, req.num_accepted_tokens) == (2, 4, 4)
    assert req.accepted_per_position == [2, 2]


def test_rejected_drafts_roll_back_and_budget_clips_drafts():
    s = spec_scheduler(k=3, rates=(0.0, 0.0, 0.0), budget=6)
    a, b = make_request(1, prompt=2, output=9), make_request(2, prompt=2, output=9)
    s.add(a)
    s.add(b)
    step(s)                                       # both prefills (2 + 2 tokens)
    p = step(s)
    # budget 6: the first verifies 1 + 3 drafts (4 tokens), the second gets what is left, 2
    assert p.decode_q == (4, 2) and p.num_batched_tokens == 6
    # nothing accepted: each outputs 1 token, KV keeps computed + 1
    assert (a.num_generated, a.num_computed_tokens) == (2, 3)
    assert (b.num_generated, b.num_computed_tokens) == (2, 3)
    assert (a.num_draft_tokens, b.num_draft_tokens, a.num_accepted_tokens) == (3, 1, 0)


def test_ngram_reserves_no_lookahead():
    s = spec_scheduler(k=3, rates=(1, 1, 1), method="ngram")
    s.add(make_request(1, prompt=10, output=3))
    step(s)
    assert s.blocks.held(1) == 3                  # 10 tokens, no lookahead: 3 blocks of 4


def test_only_policies_on_the_shared_verbs_speculate():
    from simserve.config import parse_scenario
    raw = {"model": "tiny-llama-45m", "hardware": "H100-SXM",
           "engine": {"num_gpu_blocks": 64, "max_model_len": 512, "speculative_config": {
               "method": "ngram", "num_speculative_tokens": 2,
               "synthetic_acceptance_length": 2.0}},
           "scheduler": {"policy": "orca"},
           "workload": {"num_requests": 2, "rate": 1, "prompt": {"dist": "fixed", "value": 8},
                        "output": {"dist": "fixed", "value": 4}}}
    with pytest.raises(ConfigError, match="does not model speculative decoding") as e:
        parse_scenario(raw)
    assert e.value.field == "engine.speculative_config"
    raw["scheduler"]["policy"] = "sarathi"
    s = parse_scenario(raw)
    assert s.replica.limits.speculative_config.k == 2
    again = parse_scenario({**raw, "engine": s.to_dict()["engine"]})
    assert again.engine.speculative_config == s.engine.speculative_config


class Toy:
    label = "toy"

    def step_time(self, plan) -> float:
        return 1e-3 + 2e-5 * plan.num_batched_tokens + 1e-7 * sum(plan.decode_ctx)


@st.composite
def spec_cases(draw):
    policy = draw(st.sampled_from(["vllm_v1", "sarathi"]))
    block_size = draw(st.sampled_from([1, 4, 16]))
    max_model_len = draw(st.integers(32, 256))
    budget = draw(st.integers(8, 300))
    num_blocks = draw(st.integers(-(-max_model_len // block_size) + 4,
                                  4 * -(-max_model_len // block_size) + 8))
    k = draw(st.integers(1, 4))
    rates = sorted(draw(st.lists(st.floats(0, 1), min_size=k, max_size=k)), reverse=True)
    method = draw(st.sampled_from(["eagle", "ngram", "mtp"]))
    cfg = spec(method=method, num_speculative_tokens=k, synthetic_acceptance_rates=rates)
    limits = SchedulerLimits(max_num_seqs=draw(st.integers(1, 12)),
                             max_num_batched_tokens=budget, enable_chunked_prefill=True,
                             max_model_len=max_model_len, speculative_config=cfg)
    n = draw(st.integers(1, 25))
    specs, t = [], 0.0
    for i in range(n):
        t += draw(st.floats(0, 0.02))
        specs.append(RequestSpec(i, t, draw(st.integers(1, 120)), draw(st.integers(1, 60))))
    return policy, limits, block_size, num_blocks, max_model_len, specs


def run_spec(policy, limits, block_size, num_blocks, max_model_len, specs, fast_forward):
    sched = POLICIES[policy](limits, BlockManager(num_blocks, block_size, 0), None, 5)
    sched.record_tokens = True
    plans = []
    original = sched.schedule
    k = limits.speculative_config.k

    def checked():
        plan = original()
        plans.append(plan)
        assert plan.num_batched_tokens <= limits.max_num_batched_tokens
        assert plan.num_seqs <= limits.max_num_seqs
        assert 0 <= sched.blocks.num_used <= sched.blocks.num_blocks
        assert all(1 <= q <= 1 + k for q in plan.decode_q)
        assert len(plan.decode_q) == len(plan.decode_ctx)
        for rid, n in zip(plan.request_ids, plan.num_new_tokens):
            req = next(q for q in sched.running if q.id == rid)
            # blocks for what it computes this step (drafts included)
            assert sched.blocks.held(rid) * block_size >= min(req.num_computed_tokens + n,
                                                              max_model_len)
        return plan

    sched.schedule = checked
    rep = Replica(0, sched, Toy(), max_model_len)
    rec = simulate(specs, [rep], round_robin(), fast_forward=fast_forward)
    return rec, plans


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_cases())
def test_speculation_conserves_tokens_and_fast_forward_equals_stepping(case):
    fast, plans = run_spec(*case, fast_forward=True)
    slow, slow_plans = run_spec(*case, fast_forward=False)
    # the per-plan checks in run_spec ran (they pass vacuously if schedule is gone around)
    served = [r for r in slow.requests if r.status.value == "finished"]
    assert (len(slow_plans) > 0) == bool(served) and (len(plans) > 0) == bool(served)
    assert [(r.id, r.status, r.finish_s, r.token_times) for r in fast.requests] == \
        [(r.id, r.status, r.finish_s, r.token_times) for r in slow.requests]
    assert sorted(r.id for r in fast.requests) == sorted(s.request_id for s in case[5])
    for r in fast.requests:
        if r.status.value == "finished":
            # every output token exactly once, in time order, the first at TTFT
            assert r.num_generated == r.num_output_tokens == len(r.token_times)
            assert r.token_times == sorted(r.token_times)
            assert r.token_times[0] == r.first_token_s and r.token_times[-1] == r.finish_s
            assert r.num_accepted_tokens <= r.num_draft_tokens <= r.num_drafts * case[1] \
                .speculative_config.k
        else:
            assert r.status.value == "rejected"


def test_ttft_tpot_itl_as_vllm_bench_serve_measures_them():
    # one request, prompt 8, output 7, EAGLE k = 2 with every draft accepted, steps of 10 ms:
    #   step 1 (prefill) ends at 10 ms: token 1 (TTFT 10 ms)
    #   step 2 verifies 1 + 2 → 3 tokens at 20 ms; step 3 → 3 tokens at 30 ms (7 in all)
    # TPOT = (E2EL − TTFT) / (7 − 1) = 20 / 6 ms; ITL: one gap per streamed chunk, 2 × 10 ms
    from simserve.config import parse_scenario
    from simserve.runner import run
    raw = {"model": "tiny-llama-45m", "hardware": "H100-SXM", "seed": 1,
           "engine": {"num_gpu_blocks": 64, "max_model_len": 512, "speculative_config": {
               "method": "eagle", "num_speculative_tokens": 2,
               "synthetic_acceptance_rates": [1.0, 1.0]}},
           "latency": {"model": "constant", "step_ms": 10},
           "workload": {"num_requests": 1, "rate": 1, "prompt": {"dist": "fixed", "value": 8},
                        "output": {"dist": "fixed", "value": 7}}}
    result = run(parse_scenario(raw), record_tokens=True)
    r = result.requests.iloc[0]
    draft = result.summary["spec_decode"]
    assert r["ttft_s"] * 1e3 == pytest.approx(10 + _draft_ms(raw))
    assert result.summary["mean_itl_ms"] == pytest.approx(result.summary["median_itl_ms"])
    steps = [t * 1e3 for t in result.token_times[0]]
    assert len(steps) == 7 and len(set(steps)) == 3          # three chunks: 1, 3, 3 tokens
    gaps = sorted(set(steps))
    assert result.summary["mean_itl_ms"] == pytest.approx((gaps[2] - gaps[0]) / 2)
    assert r["tpot_s"] * 1e3 == pytest.approx((gaps[2] - gaps[0]) / 6)
    assert draft["acceptance_length"] == 3.0 and draft["acceptance_rate"] == 1.0
    assert draft["num_drafts"] == 2 and draft["per_position_acceptance_rate"] == [1.0, 1.0]


def _draft_ms(raw) -> float:
    # the EAGLE head's cost on the prefill step (roofline of one layer): constant latency + it
    from simserve.config import parse_scenario
    from simserve.engine.build import build_latency
    s = parse_scenario(raw)
    lat = build_latency(s)
    plan = StepPlan((0,), (8,), (8,), (0,), (), 1)
    return lat.draft_s(plan) * 1e3


def test_drafter_weights_and_kv_in_the_capacity():
    from simserve.config import load_scenario
    from simserve.latency.spec import drafter_weight_bytes
    s = load_scenario("scenarios/moe_qwen3_ep_fp8.yaml")
    head = drafter_card(s.model, s.engine.speculative_config)
    # one dense layer of Qwen3-30B-A3B's shapes: attention 18,874,368 + q/k norms 256 + MLP
    # 3 · 2048 · 6144 = 37,748,736 + norms 4,096 = 56,627,456 (+ final norm 2,048), 16-bit,
    # half per rank; the embedding and LM head are the target's
    assert drafter_weight_bytes(head, s.engine.speculative_config, 2) == 56_629_504 * 2 / 2
    # a block holds the target's KV (16 · 24,576 B per rank, FP8) and the head's (16 · 512)
    assert s.replica.kv_block_bytes == 16 * 24_576 + 16 * 512
    without = load_scenario("scenarios/moe_qwen3_ep_fp8.yaml",
                            ["engine.speculative_config=null"])
    assert without.replica.kv_block_bytes == 16 * 24_576
    assert s.replica.num_gpu_blocks < without.replica.num_gpu_blocks


def test_draft_model_card_is_resolved_and_round_trips():
    from simserve.config import parse_scenario
    raw = {"model": "Llama-3.1-8B", "hardware": "H100-SXM",
           "engine": {"max_model_len": 4096, "speculative_config": {
               "method": "draft_model", "num_speculative_tokens": 4,
               "synthetic_acceptance_length": 3.0, "model": "tiny-llama-45m"}},
           "workload": {"num_requests": 2, "rate": 1, "prompt": {"dist": "fixed", "value": 8},
                        "output": {"dist": "fixed", "value": 4}}}
    s = parse_scenario(raw)
    assert s.engine.speculative_config.model.name == "tiny-llama-45m"
    hash(s.engine.speculative_config)
    again = parse_scenario({**raw, "engine": s.to_dict()["engine"]})
    assert again.engine.speculative_config == s.engine.speculative_config
    # the draft model keeps its own embedding and LM head: all its weights count
    bad = {**raw, "engine": {**raw["engine"], "speculative_config": {
        **raw["engine"]["speculative_config"], "model": "nope"}}}
    with pytest.raises(ConfigError) as e:
        parse_scenario(bad)
    assert e.value.field == "engine.speculative_config.model"


def test_profile_prices_a_verify_as_a_chunk_and_scores_every_position():
    from simserve.latency.profile import ProfileLatency
    from tests.unit.test_profile_latency import synthetic_profile
    m = ProfileLatency(synthetic_profile())
    verify = StepPlan((1, 2), (4, 1), (), (), (100, 60), 2, decode_q=(4, 1))
    as_chunk = StepPlan((1, 2), (4, 1), (4,), (100,), (60,), 2)
    v, c = m.breakdown(verify), m.breakdown(as_chunk)
    assert v["attn_prefill"] == c["attn_prefill"] and v["attn_decode"] == c["attn_decode"]
    assert v["linear"] == c["linear"]
    five = StepPlan((1,), (5,), (5,), (0,), (), 5)   # 4 + 1 scored rows
    assert v["lm_head"] == m.breakdown(five)["lm_head"]


def test_measured_acceptance_distribution_becomes_rates():
    # P(a = 0..3) = 0.2, 0.3, 0.1, 0.4 → p_i = P(a > i) = 0.8, 0.5, 0.4; mean length 2.7
    c = spec(method="eagle3", num_speculative_tokens=3,
             acceptance_distribution=[0.2, 0.3, 0.1, 0.4])
    assert c.acceptance_rates == pytest.approx((0.8, 0.5, 0.4))
    assert c.mean_acceptance_length == pytest.approx(2.7)
    acc = Acceptance(c, 2)
    draws = [acc.accepted(r, p, 3) for r in range(200) for p in range(100)]
    for j, want in enumerate((0.2, 0.3, 0.1, 0.4)):
        assert draws.count(j) / len(draws) == pytest.approx(want, abs=0.012)
    assert spec(**c.to_dict()) == c
    for bad, field in (([0.5, 0.6], "acceptance_distribution"),             # length != k + 1
                       ([0.5, 0.2, 0.2, 0.2], "acceptance_distribution"),   # sums to 1.1
                       ([1.2, -0.2, 0, 0], "acceptance_distribution[0]")):
        with pytest.raises(ConfigError) as e:
            spec(method="eagle3", num_speculative_tokens=3, acceptance_distribution=bad)
        assert e.value.field == f"{WHERE}.{field}"
