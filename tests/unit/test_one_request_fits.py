"""issue #33 item 3: a deployment vLLM would refuse to start — a KV cache sized from memory that
cannot hold one request of max_model_len (vllm/v1/core/kv_cache_utils.py,
check_enough_kv_cache_memory) — is refused by validate, run and sweeps, naming the knobs."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from simserve.cli import main

# Llama-3.1-70B at TP 2 on 80 GB H100s: 141 GB of weights leave 180 blocks of 16 tokens
# (2,880 tokens) at gpu_memory_utilization 0.9, under max_model_len 8,192
L70 = {
    "name": "l70", "model": "Llama-3.1-70B", "hardware": "H100-SXM",
    "engine": {"tensor_parallel_size": 2, "max_model_len": 8192},
    "scheduler": {"policy": "vllm_v1"}, "latency": {"model": "roofline"},
    "workload": {"arrival": "poisson", "rate": 1, "num_requests": 10,
                 "prompt": {"dist": "fixed", "value": 100},
                 "output": {"dist": "fixed", "value": 10}},
}


def write(tmp_path, raw, name="s.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.mark.parametrize("command", ["validate", "run"])
def test_validate_and_run_refuse_it_naming_the_knobs(tmp_path, capsys, command):
    args = [command, str(write(tmp_path, L70))]
    if command == "run":
        args += ["--out", str(tmp_path / "o")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: engine.max_model_len:")
    assert "KV cache of 2,880 tokens" in err and "max_model_len 8,192" in err
    for knob in ("max_model_len", "gpu_memory_utilization", "tensor_parallel_size"):
        assert f"engine.{knob}" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("override", ["engine.max_model_len=2880",
                                      "engine.tensor_parallel_size=4"])
def test_the_named_changes_make_it_start(tmp_path, capsys, override):
    assert main(["validate", str(write(tmp_path, L70)), "--set", override]) == 0


def test_a_sweep_marks_the_refused_point_and_shows_rejected_requests(tmp_path, capsys):
    base = write(tmp_path, {**L70, "engine": {"tensor_parallel_size": 2,
                                              "max_model_len": 4096}}, "base.yaml")
    grid = write(tmp_path, {"base": str(base),
                            "grid": {"engine.tensor_parallel_size": [2, 4]}}, "grid.yaml")
    assert main(["sweep", str(grid), "--out", str(tmp_path / "o"), "--workers", "1",
                 "--no-report"]) == 2
    out, err = capsys.readouterr()
    table = pd.read_csv(tmp_path / "o" / "sweep.csv")
    assert "vLLM refuses to start" in table.loc[0, "error"]
    assert pd.isna(table.loc[1, "error"])
    header = next(line for line in out.splitlines() if "point" in line)
    assert "completed" in header and "num_rejected" in header
    assert "sweep point 0" in err and "vLLM refuses" in err


@pytest.mark.parametrize("engine", [{}, {"num_gpu_blocks": 100}, {"gpu_memory_utilization": 1.0},
                                    {"pipeline_parallel_size": 2}])
def test_weights_past_the_device_name_the_model_not_gpu_memory_utilization(tmp_path, capsys,
                                                                              engine):
    # 141.1 GB of Llama-3.1-70B weights on one 48 GB L40S: no gpu_memory_utilization can help,
    # with or without a KV cache given as num_gpu_blocks (pipeline stage: 70.6 GB, still too big)
    raw = {**L70, "hardware": "L40S", "engine": {"tensor_parallel_size": 1, **engine}}
    assert main(["validate", str(write(tmp_path, raw))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: model: Llama-3.1-70B's weights need")
    assert "more than the 48.0 GB of L40S" in err and "gpu_memory_utilization" not in err
