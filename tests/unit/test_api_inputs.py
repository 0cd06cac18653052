"""The Python API's entry points (simserve.run, compare, capacity) given the wrong kind of
input: one ConfigError naming the argument or field, never a TypeError from deep inside."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import simserve
from simserve.config import load_scenario
from simserve.errors import ConfigError

TINY = Path(__file__).parents[1] / "data" / "tiny.yaml"


def tiny() -> dict:
    return yaml.safe_load(TINY.read_text())


def message(fn, *args, **kwargs) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_run_takes_a_scenario_mapping_as_sweep_and_plan_do():
    # was: TypeError "expected str, bytes or os.PathLike object, not dict"
    from_mapping = simserve.run(tiny(), overrides=["workload.rate=10"])
    from_file = simserve.run(TINY, overrides=["workload.rate=10"])
    assert from_mapping.summary == from_file.summary
    assert from_mapping.scenario.overrides == ("workload.rate=10",)


def test_a_bad_field_in_a_mapping_is_named():
    raw = tiny()
    raw["workload"]["rate"] = "abc"
    assert message(simserve.run, raw).startswith("workload.rate: ")
    raw = tiny()
    raw["engine"]["max_num_seqz"] = 4
    assert message(simserve.run, raw).startswith("engine.max_num_seqz: unknown field")


@pytest.mark.parametrize("scenario", [None, 5, [1, 2], b"tiny.yaml"])
def test_run_refuses_what_is_not_a_scenario(scenario):
    assert message(simserve.run, scenario).startswith("scenario: expected a Scenario, a "
                                                      "scenario mapping or the path")


@pytest.mark.parametrize("overrides", ["workload.rate=3", [5], ("seed=1", None), 7])
def test_overrides_must_be_a_list_of_strings(overrides):
    # a lone string was split into characters: "--set: expected FIELD=VALUE, got 'w'"
    assert message(simserve.run, TINY, overrides=overrides).startswith("overrides: expected")


@pytest.mark.parametrize("item", ["workload.rate", "=3", " =3"])
def test_an_override_without_field_or_value_names_the_argument_not_the_cli_flag(item):
    # Python said "--set: expected FIELD=VALUE", naming a flag the caller never used
    for call in (simserve.run, simserve.compare):
        assert message(call, TINY, overrides=[item]) == \
            f"overrides: expected FIELD=VALUE, got {item!r}"


def test_overrides_on_a_resolved_scenario_are_refused_not_dropped():
    # they were silently ignored: the run was the scenario's own
    s = load_scenario(TINY)
    assert message(simserve.run, s, overrides=["workload.rate=3"]).startswith("overrides: ")
    assert simserve.run(s, overrides=[]).summary["num_requests"] == 60


def test_a_mapping_with_compare_or_a_sweep_says_which_call_runs_it():
    raw = {**tiny(), "compare": {"seed": [1, 2]}}
    assert message(simserve.run, raw).startswith("compare: ")
    assert "simserve.sweep()" in message(simserve.run, {"base": str(TINY),
                                                        "grid": {"seed": [1]}})


def test_compare_names_its_path_argument():
    assert message(simserve.compare, tiny()).startswith("path: expected the path")


@pytest.mark.parametrize("kwargs, field", [
    ({"target_rate": "40"}, "target_rate"),        # was TypeError: '<' not supported
    ({"tolerance": "0.1"}, "tolerance"),
    ({"seeds": 1.5}, "seeds"),                     # passed the bound check, then range(1.5)
    ({"seeds": True}, "seeds"),
    ({"max_replicas": "8", "target_rate": 40}, "max_replicas"),
])
def test_capacity_arguments_of_the_wrong_type_are_named(kwargs, field):
    assert message(simserve.capacity, TINY, **kwargs).startswith(f"{field}: expected")


def test_capacity_takes_a_mapping_and_names_its_bad_field():
    raw = tiny()
    raw["slo"]["ttft_ms"] = -1
    assert message(simserve.capacity, raw).startswith("slo.ttft_ms: ")
