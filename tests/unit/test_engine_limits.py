"""The engine limits vLLM itself refuses at start-up (vllm/config/scheduler.py,
``SchedulerConfig._verify_args``) are refused for the policies that model vLLM's scheduler."""

from __future__ import annotations

import pytest
import yaml

from simserve.cli import main
from simserve.config import parse_scenario
from simserve.errors import ConfigError


def scenario(policy: str, **engine: object) -> dict:
    return {"model": "Llama-2-7B", "hardware": "A100-80GB",
            "engine": {"max_num_seqs": 256, "max_model_len": 256, **engine},
            "scheduler": {"policy": policy},
            "workload": {"num_requests": 10, "rate": 1,
                         "prompt": {"dist": "fixed", "value": 64},
                         "output": {"dist": "fixed", "value": 8}}}


@pytest.mark.parametrize("policy", ["vllm_v1", "vllm_v0", "priority"])
def test_a_budget_below_the_sequence_cap_is_refused_for_vllm(policy):
    with pytest.raises(ConfigError, match=r"engine\.max_num_batched_tokens: 128 is smaller "
                                          r"than engine\.max_num_seqs 256; vLLM refuses"):
        parse_scenario(scenario(policy, max_num_batched_tokens=128))
    # at the cap it is what vLLM accepts
    assert parse_scenario(scenario(policy, max_num_batched_tokens=256)).max_num_batched_tokens \
        == 256


def test_other_engines_keep_their_own_rules():
    # Sarathi-Serve's small chunks beside a large batch are its point: not vLLM's check
    s = parse_scenario(scenario("sarathi", max_num_batched_tokens=128))
    assert (s.max_num_batched_tokens, s.engine.max_num_seqs) == (128, 256)


def test_without_chunking_the_budget_must_hold_a_whole_prompt():
    with pytest.raises(ConfigError, match=r"engine\.max_num_batched_tokens: 2048 is smaller "
                                          r"than max_model_len 4096; without chunked prefill"):
        parse_scenario(scenario("vllm_v0", max_num_batched_tokens=2048, max_model_len=4096,
                                enable_chunked_prefill=False))


def test_validate_names_the_field_and_exits_2(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario("vllm_v1", max_num_batched_tokens=64)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "engine.max_num_batched_tokens: 64 is smaller than engine.max_num_seqs 256" in err
    assert "Traceback" not in err


def test_a_sequence_cap_above_the_default_budget_names_the_field_that_was_set():
    # no max_num_batched_tokens given: vLLM's default (8192 with chunked prefill) is below the
    # cap the user raised; the error named engine.max_num_batched_tokens, a field not written
    with pytest.raises(ConfigError, match=r"^engine\.max_num_seqs: 9000 is more than the "
                                          r"token budget 8192 \(vLLM's default"):
        parse_scenario(scenario("vllm_v1", max_num_seqs=9000))
    # given explicitly, the budget is the field named
    with pytest.raises(ConfigError, match=r"^engine\.max_num_batched_tokens: 8192 is smaller"):
        parse_scenario(scenario("vllm_v1", max_num_seqs=9000, max_num_batched_tokens=8192))
