"""inference-perf's shared_prefix workload with load stages: parsing, the requests it makes, and
the prefix-cache hits they get (counted by hand)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import simserve
from simserve.config import parse_scenario
from simserve.errors import ConfigError
from simserve.fields import Fields
from simserve.workload import WorkloadConfig, build_workload

SP = {"num_unique_system_prompts": 3, "num_users_per_system_prompt": 2,
      "system_prompt_len": 100, "question_len": 60, "output_len": 5}


def workload(**extra) -> WorkloadConfig:
    raw = {"arrival": "constant", "shared_prefix": dict(SP),
           "stages": [{"rate": 2, "duration": 5}, {"rate": 4, "duration": 5}], **extra}
    return WorkloadConfig.from_fields(Fields(raw, "workload"))


def test_stages_send_at_their_rates_one_after_another():
    specs = build_workload(workload(), seed=0, base_dir=Path("."))
    arrivals = np.array([s.arrival_s for s in specs])
    # constant arrivals: 2/s for 5 s (t = 0, 0.5, ..., 4.5), then 4/s from t = 5 (5, 5.25, ...)
    assert len(specs) == 10 + 20
    assert np.allclose(arrivals[:10], np.arange(10) * 0.5)
    assert np.allclose(arrivals[10:], 5 + np.arange(20) * 0.25)
    assert {s.num_prompt_tokens for s in specs} == {160}
    assert {s.num_output_tokens for s in specs} == {5}


def test_users_recur_and_groups_share_only_the_system_prompt():
    specs = build_workload(workload(), seed=0, base_dir=Path("."))
    users = 3 * 2
    for i, s in enumerate(specs):
        # request i is user i mod 6's: the same tuple (content) every 6 requests
        assert s.hash_ids == specs[i % users].hash_ids
    tables = [specs[u].hash_ids for u in range(users)]
    assert len(set(tables)) == users                       # every user's prompt differs
    # one id per system_prompt_len tokens: ceil(160 / 100) = 2; the first names the group
    assert all(len(t) == 2 for t in tables)
    assert [t[0] for t in tables] == [0, 0, 1, 1, 2, 2]
    assert len({t[1] for t in tables}) == users            # the question: the user's own
    assert build_workload(workload(), 0, Path(".")).hash_ids is None   # per request, not shared


def test_poisson_stages_keep_their_mean_rate():
    specs = build_workload(workload(arrival="poisson"), seed=3, base_dir=Path("."))
    arrivals = np.array([s.arrival_s for s in specs])
    assert np.all(np.diff(arrivals) >= 0) and arrivals[-1] < 10
    # (1 + arrivals before 5 s) is about 10, those after about 20 (Poisson, seeded)
    assert 4 <= np.sum(arrivals < 5) <= 18 and 10 <= np.sum(arrivals >= 5) <= 32


def test_round_trip_through_to_dict():
    w = workload()
    assert WorkloadConfig.from_fields(Fields(w.to_dict(), "workload")) == w
    single = WorkloadConfig.from_fields(Fields(
        {"arrival": "poisson", "rate": 3, "num_requests": 7, "shared_prefix": dict(SP)},
        "workload"))
    assert WorkloadConfig.from_fields(Fields(single.to_dict(), "workload")) == single
    assert len(build_workload(single, 0, Path("."))) == 7


@pytest.mark.parametrize("raw, field", [
    ({"arrival": "constant", "stages": [{"rate": 1, "duration": 1}],
      "prompt": {"dist": "fixed", "value": 3}, "output": {"dist": "fixed", "value": 3}},
     "workload.stages"),
    ({"stages": [{"rate": 1, "duration": 1}], "rate": 2, "shared_prefix": SP}, "workload.rate"),
    ({"stages": [], "shared_prefix": SP}, "workload.stages"),
    ({"stages": [{"rate": 0, "duration": 1}], "shared_prefix": SP}, "workload.stages[0].rate"),
    ({"stages": [{"rate": 1, "duration": 1, "ratee": 2}], "shared_prefix": SP},
     "workload.stages[0].ratee"),
    ({"stages": [{"rate": 1, "duration": 1}], "arrival": "gamma", "shared_prefix": SP},
     "workload.arrival"),
    ({"stages": [{"rate": 1e6, "duration": 1e6}], "shared_prefix": SP}, "workload.stages"),
    ({"stages": [{"rate": 1, "duration": 1}], "shared_prefix": {**SP, "question_len": 0}},
     "workload.shared_prefix.question_len"),
    ({"stages": [{"rate": 1, "duration": 1}], "shared_prefix": {**SP, "users": 2}},
     "workload.shared_prefix.users"),
    ({"rate": 1, "num_requests": 3, "shared_prefix": SP,
      "prompt": {"dist": "fixed", "value": 3}}, "workload.prompt"),
])
def test_bad_shared_prefix_workloads_name_the_field(raw, field):
    with pytest.raises(ConfigError) as e:
        WorkloadConfig.from_fields(Fields(raw, "workload"))
    assert e.value.field == field


def test_a_misspelt_shared_prefix_field_is_unknown_not_missing():
    sp = {k: v for k, v in SP.items() if k != "question_len"}
    with pytest.raises(ConfigError) as e:
        workload(shared_prefix={**sp, "question_length": 60})
    assert str(e.value) == ("workload.shared_prefix.question_length: unknown field "
                            "(did you mean question_len?)")
    # an unknown key is reported before a missing one, even when it resembles none
    with pytest.raises(ConfigError) as e:
        workload(shared_prefix={**sp, "q": 60})
    assert e.value.field == "workload.shared_prefix.q"


def test_cached_tokens_follow_the_prompts_blocks():
    s = parse_scenario({
        "name": "sp", "model": "tiny-llama-45m", "hardware": "H100-SXM",
        "engine": {"enable_prefix_caching": True, "block_size": 16, "max_num_seqs": 16},
        "scheduler": {"policy": "vllm_v1"}, "latency": {"model": "constant", "step_ms": 10},
        "workload": {"arrival": "constant", "shared_prefix": dict(SP),
                     "stages": [{"rate": 1, "duration": 12}]}})
    req = simserve.run(s).requests
    cached = req["num_cached_tokens"].to_list()
    # 160-token prompts, 16-token blocks. First of each group (requests 0, 2, 4): a miss; the
    # group's second user (1, 3, 5) hits the system prompt's whole blocks, 100 // 16 = 6
    # blocks = 96 tokens (block 6 holds system and question tokens: the user's own); a user's
    # second request (6..11) hits every block but the one holding its last token,
    # (160 - 1) // 16 = 9 blocks = 144 tokens.
    assert cached == [0, 96, 0, 96, 0, 96] + [144] * 6
