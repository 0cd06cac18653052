"""Hand-stepped tests for each place where vLLM 0.32's own scheduler showed simserve's vLLM v1
schedule wrong (benchmarks/vllm_oracle.py found them; docs/policies.md lists them)."""

from __future__ import annotations

from simserve.config import parse_scenario
from simserve.kv.blocks import BlockManager
from simserve.engine.build import build_replicas
from simserve.sched import POLICIES, Request, SchedulerLimits, Status
from simserve.workload.spec import RequestSpec
from tests.helpers import make_request, step, tokens


def v1(num_blocks=100, budget=100, chunked=True, threshold=0, gate=True, block_size=4,
       policy="vllm_v1"):
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget,
                             enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold,
                             reserve_full_sequence=gate)
    return POLICIES[policy](limits, BlockManager(num_blocks, block_size))


def test_admission_needs_blocks_for_the_whole_prompt_not_its_first_chunk():
    # 6 blocks of 4; budget 8. A (prompt 8, 20 outputs) runs; B's prompt is 20 (5 blocks).
    # step 1: A's 8 tokens (2 blocks, 4 free); B's first chunk would be 0 tokens: budget spent
    for gate, admitted in ((True, False), (False, True)):
        s = v1(num_blocks=6, budget=8, gate=gate)
        a, b = make_request(0, 8, 20), make_request(1, 20, 1)
        s.add(a), s.add(b)
        assert tokens(step(s)) == {0: 8}
        # step 2: A decodes (9 tokens: a 3rd block, 3 free); B's chunk would be 7 tokens
        # (2 blocks: they fit) but its whole prompt needs 5 blocks > 3 free: with the gate
        # (vLLM's scheduler_reserve_full_isl) B waits
        p = step(s)
        assert (1 in tokens(p)) is admitted
        assert tokens(p)[0] == 1
        if admitted:
            assert tokens(p) == {0: 1, 1: 7}


def test_a_preempted_request_is_readmitted_only_when_its_prompt_and_output_fit():
    # B (prompt 4) generated 2 tokens before a preemption: readmitting it needs blocks for all
    # 6 tokens (2 blocks of 4), not just the 1 block its first chunk of 4 needs
    s = v1(num_blocks=3, budget=4)
    b = make_request(1, 4, 5)
    s.add(b)
    b.num_generated = 2                 # as if it had decoded twice before a preemption
    s.blocks.allocate(99, 8)            # another request holds 2 of the 3 blocks
    assert s.schedule().is_empty and b.status is Status.WAITING
    s.blocks.free(99)
    assert tokens(s.schedule()) == {1: 4} and b.status is Status.RUNNING


def test_the_threshold_caps_chunks_without_chunked_prefill_too():
    # vLLM applies long_prefill_token_threshold before its no-chunking check: A (prompt 10)
    # is admitted with 4 tokens, and continues with 4, then 2, while B decodes beside it
    s = v1(chunked=False, threshold=4)
    a, b = make_request(0, 10, 1), make_request(1, 3, 3)
    s.add(a), s.add(b)
    assert tokens(step(s)) == {0: 4, 1: 3}
    assert tokens(step(s)) == {0: 4, 1: 1}
    assert tokens(step(s)) == {0: 2, 1: 1} and a.status is Status.FINISHED


def test_the_threshold_is_lifted_when_nobody_else_could_run():
    # one request alone: "nobody to starve", its whole prompt at once; with two, 4 each
    s = v1(threshold=4)
    s.add(make_request(0, 10, 2))
    assert tokens(step(s)) == {0: 10}
    s = v1(threshold=4)
    s.add(make_request(0, 10, 2)), s.add(make_request(1, 10, 2))
    assert tokens(step(s)) == {0: 4, 1: 4}


def test_the_null_block_is_held_back_for_vllm_v1_but_not_for_other_policies():
    raw = {"model": "tiny-llama-45m", "hardware": "H100-SXM",
           "engine": {"num_gpu_blocks": 64, "max_model_len": 512},
           "scheduler": {"policy": "vllm_v1"},
           "workload": {"arrival": "burst", "num_requests": 1,
                        "prompt": {"dist": "fixed", "value": 10},
                        "output": {"dist": "fixed", "value": 3}}}
    for policy, usable in (("vllm_v1", 63), ("priority", 63), ("vllm_v0", 64), ("tgi", 64)):
        s = parse_scenario({**raw, "scheduler": {"policy": policy}})
        assert build_replicas(s)[0].blocks.num_blocks == usable, policy


def test_priority_victims_tie_by_arrival_order():
    # three requests of equal priority arriving at one instant; KV fills; a real server saw
    # them come in one after another, so the victim is the latest, C, not the first in
    # running order (vLLM's max() given equal times): A, the oldest, runs on
    s = v1(num_blocks=6, budget=100, policy="priority")
    reqs = [Request(RequestSpec(i, 0.0, 8, 8, priority=0)) for i in range(3)]
    for r in reqs:
        s.add(r)
    assert tokens(step(s)) == {0: 8, 1: 8, 2: 8}        # 6 blocks, all used
    p = step(s)                                          # decodes need a 3rd block each
    assert p.num_preempted >= 1 and reqs[2].num_preemptions == 1
    assert reqs[0].num_preemptions == 0


def test_priority_requests_arriving_together_do_not_preempt_each_other_forever():
    # equal priorities and arrival times, prompts chunked 5 tokens a step, KV for one and a
    # half of them: with ties kept in running order, the request that had got furthest was
    # the victim each time, then the next one, round and round (a run that never ended)
    s = v1(num_blocks=13, budget=41, threshold=5, gate=False, block_size=16,
           policy="priority")
    reqs = [Request(RequestSpec(i, 0.0, 120, 10, priority=0)) for i in range(3)]
    for r in reqs:
        s.add(r)
    for _ in range(400):
        if all(r.status is Status.FINISHED for r in reqs):
            break
        step(s)
    assert all(r.status is Status.FINISHED for r in reqs)
    assert reqs[0].num_preemptions == 0 and reqs[2].num_preemptions >= 1


def test_one_block_is_too_few_where_vllm_keeps_one_back():
    import pytest
    from simserve.errors import ConfigError
    raw = {"model": "tiny-llama-45m", "hardware": "H100-SXM",
           "engine": {"num_gpu_blocks": 1, "max_model_len": 16, "block_size": 16},
           "scheduler": {"policy": "vllm_v1"},
           "workload": {"arrival": "burst", "num_requests": 1,
                        "prompt": {"dist": "fixed", "value": 4},
                        "output": {"dist": "fixed", "value": 3}}}
    with pytest.raises(ConfigError, match=r"engine\.num_gpu_blocks: must be >= 2 with policy "
                                          r"'vllm_v1'"):
        parse_scenario(raw)
    parse_scenario({**raw, "scheduler": {"policy": "vllm_v0"}})   # no null block there
