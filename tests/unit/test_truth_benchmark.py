"""The ground-truth benchmark's pieces (benchmarks/truth/h100_vllm.py): every measured run maps
to a valid scenario, and the per-stage metrics and ITL are computed as the measurements are."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
TRUTH = ROOT.parent / "shared" / "truth" / "h100-vllm"
sys.path.insert(0, str(ROOT / "benchmarks" / "truth"))

import h100_vllm as truth  # noqa: E402

from simserve.config import parse_scenario  # noqa: E402


def test_stage_metrics_and_itl_as_the_measurements_compute_them():
    arrival = np.array([0.0, 1.0, 2.0, 10.0, 11.0])
    ttft = np.array([10.0, 20.0, 30.0, 40.0, 60.0])
    e2e = np.array([110.0, 220.0, 330.0, 440.0, 660.0])
    m = truth.stage_metrics(arrival, ttft, e2e, [(0.0, 5.0), (5.0, 15.0)])
    assert m[0]["ttft_mean"] == 20.0 and m[0]["e2e_mean"] == 220.0 and m[0]["n"] == 3
    assert m[1]["ttft_mean"] == 50.0 and m[1]["decode_ms"] == 550.0 - 50.0
    assert m[-1]["n"] == 5 and m[-1]["e2e_p99"] == pytest.approx(np.percentile(e2e, 99))
    # the measured row counted n - 1 = (e2e - ttft) / itl = 100 gaps: ours over the same count
    measured = {("x", 1, "e2e_mean"): 1050.0, ("x", 1, "ttft_mean"): 50.0,
                ("x", 1, "itl_mean"): 10.0}
    truth.with_itl(m, "x", measured)
    assert m[1]["itl_mean"] == pytest.approx(500.0 / 100) and "itl_mean" not in m[0]


@pytest.mark.skipif(not TRUTH.exists(), reason="the measured runs are not beside the repository")
def test_every_measured_run_is_a_valid_scenario_with_its_stages():
    exps, measured, peers = truth.load_truth(TRUTH)
    assert len(exps) == 12 and measured and peers
    for exp in exps:
        s = parse_scenario(truth.scenario_dict(exp))
        w = s.workload
        assert s.engine.num_gpu_blocks == exp["total_kv_blocks"]
        assert s.engine.tensor_parallel_size == exp["tp"]
        assert [st.rate for st in w.stages] == [
            st["rate"] for st in exp["workload"]["inference_perf"]["stages"]]
        sp = exp["workload"]["inference_perf"]["shared_prefix"]
        assert w.shared_prefix.num_users == (sp["num_unique_system_prompts"]
                                             * sp["num_users_per_system_prompt"])
        assert truth.rows_of(measured, exp["id"])        # every run is scored somewhere


def test_tails_are_split_by_a_runs_first_stage_and_its_later_ones():
    # two runs: one with stages 0 and 1, one scored on its whole run (-1, a first stage too)
    measured = {("a", 0, "ttft_mean"): 50.0, ("a", 0, "ttft_p99"): 100.0,
                ("a", 1, "ttft_mean"): 50.0, ("a", 1, "ttft_p99"): 60.0,
                ("b", -1, "ttft_mean"): 40.0, ("b", -1, "ttft_p99"): 80.0}
    ours = {("a", 0, "ttft_p99"): -40.0, ("a", 1, "ttft_p99"): 5.0, ("b", -1, "ttft_p99"): 20.0}
    lines = truth.stage_split_lines(ours, measured)
    row = next(line for line in lines if line.startswith("ttft_p99"))
    first, later = row.split(";")
    assert "30.0 [ 2]" in first and "2.00x mean" in first        # median of 40 and 20
    assert "5.0 [ 1]" in later and "1.20x mean" in later
    assert not any(line.startswith("e2e_p99") and "[" in line for line in lines)


def test_a_run_is_simulated_as_vllm_ran_it_async_and_poisson():
    # (a synthetic run in the measured runs' format: the test needs nothing beside the repo)
    exp = {"id": "x", "model": "meta-llama/Llama-2-7b-hf", "tp": 1, "max_num_seqs": 64,
           "max_num_batched_tokens": 2048, "total_kv_blocks": 5000, "block_size": 16,
           "workload": {"seed": 7, "inference_perf": {
               "shared_prefix": {"enable_multi_turn_chat": True, "num_unique_system_prompts": 2,
                                 "num_users_per_system_prompt": 3, "system_prompt_len": 100,
                                 "question_len": 400, "output_len": 50},
               "stages": [{"rate": 2.0, "duration": 10}, {"rate": 4.0, "duration": 10}]}}}
    raw = truth.scenario_dict(exp)
    assert raw["engine"]["async_scheduling"] is True            # vLLM 0.32's default
    assert raw["engine"]["enable_prefix_caching"] is True
    assert raw["workload"]["arrival"] == "poisson"
    s = parse_scenario(raw)
    assert s.engine.async_scheduling and s.workload.arrival.process == "poisson"
    assert [st.rate for st in s.workload.stages] == [2.0, 4.0]


def test_a_truth_folder_without_the_runs_says_where_they_come_from(tmp_path, capsys):
    # the default folder beside the checkout is not there on a user's machine: a traceback
    (tmp_path / "measured.csv").write_text("experiment,stage_index,metric,measured_ms\n")
    with pytest.raises(SystemExit) as info:
        truth.load_truth(tmp_path)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"error: --truth {tmp_path}: no experiments.json, peers.csv there")
    assert "docs/fidelity.md (Measured vLLM on H100)" in err
    doc = (ROOT / "docs" / "fidelity.md").read_text()
    assert "github.com/inference-sim/sim-to-real-accuracy-validation" in doc


def test_the_reference_servers_tiny_model_folder(tmp_path):
    # benchmarks/tiny_model.py: the tiny-llama-45m card's shapes, and w<i> is token id i
    import json
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import tiny_model
    from simserve.cards import load_model
    out = tiny_model.write(tmp_path / "tiny")
    card = load_model("tiny-llama-45m")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["head_dim"], cfg["intermediate_size"],
            cfg["vocab_size"]) == (card.hidden_size, card.num_layers, card.num_heads,
                                   card.num_kv_heads, card.head_dim, card.intermediate_size,
                                   card.vocab_size) == (512, 4, 8, 8, 64, 1408, 32000)
    tok = json.loads((out / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    assert tok["model"]["type"] == "WordLevel" and len(vocab) == 32000
    assert [vocab[t] for t in ("<unk>", "<s>", "</s>", "<pad>", "w4", "w31999")] == \
        [0, 1, 2, 3, 4, 31999]
    assert sorted(vocab.values()) == list(range(32000))
    assert cfg["eos_token_id"] == vocab["</s>"] and cfg["bos_token_id"] == vocab["<s>"]
    assert not list(out.glob("*.safetensors")) and not list(out.glob("*.bin"))
