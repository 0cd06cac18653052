"""The GPU ground-truth campaign's CPU-side pieces: HF configs written from model cards
(benchmarks/hf_config.py), vLLM's FlashAttention arguments (profiler/vllm_attention.py), and
benchmarks/fidelity_gpu.py's state, workloads, log parsing and step pricing."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod          # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


hf = _load("hf_config")
gpu = _load("fidelity_gpu")


# --------------------------------------------------------------------------------------------
# config.json from a card


@pytest.mark.parametrize("name,arch", [("Llama-3.1-8B", "LlamaForCausalLM"),
                                       ("Qwen2.5-7B", "Qwen2ForCausalLM"),
                                       ("tiny-llama-45m", "LlamaForCausalLM")])
def test_written_config_round_trips_the_cards_shapes(tmp_path, name, arch):
    from simserve.cards import load_model
    card = load_model(name)
    path = hf.write_model_dir(name, tmp_path / name) / "config.json"
    cfg = json.loads(path.read_text())
    assert cfg["architectures"] == [arch]
    back = hf.card_from_hf_config(cfg)
    for field in hf.SHAPES:
        assert getattr(back, field) == getattr(card, field), field
    # the parameter count the simulator uses for weights follows from the same shapes
    assert back.num_params == card.num_params


def test_llama_8b_config_has_the_published_shapes(tmp_path):
    cfg = hf.hf_config(__import__("simserve.cards", fromlist=["x"]).load_model("Llama-3.1-8B"))
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"]) == \
        (32, 4096, 32, 8, 14336, 128256)
    assert cfg["torch_dtype"] == "bfloat16" and cfg["attention_bias"] is False


def test_hf_config_cli_refuses_an_unknown_card(tmp_path, capsys):
    assert hf.main(["No-Such-Model", str(tmp_path / "x")]) == 2
    assert "No-Such-Model" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# --------------------------------------------------------------------------------------------
# vLLM's FlashAttention: the arguments as vLLM's metadata builder makes them


def test_fa_args_match_the_step_and_vllms_split_rule():
    torch = pytest.importorskip("torch")
    from profiler.layers import build_step
    from profiler.vllm_attention import MAX_SPLITS_FOR_CUDA_GRAPH, fa_args, max_cudagraph_size
    meta = build_step([(13, 37), (16, 0)], [3, 17, 40], block_size=16, num_cache_blocks=64,
                      device="cpu", generator=torch.Generator().manual_seed(0))
    a = fa_args(meta, cudagraph_size=512)
    # tokens: chunks of 13 and 16, then three decodes -> offsets 0, 13, 29, 30, 31, 32
    assert a.cu_seqlens_q.tolist() == [0, 13, 29, 30, 31, 32]
    assert a.seqused_k.tolist() == [50, 16, 4, 18, 41]         # context + new tokens
    assert (a.max_seqlen_q, a.max_seqlen_k) == (16, 50)
    assert a.cu_seqlens_q.dtype == a.seqused_k.dtype == a.block_table.dtype == torch.int32
    assert a.num_splits == MAX_SPLITS_FOR_CUDA_GRAPH            # 32 tokens <= 512
    assert fa_args(meta, cudagraph_size=31).num_splits == 0     # above: the kernel's heuristic
    assert fa_args(meta, 512, max_splits=0).num_splits == 0     # FA2: no split count
    # vLLM 0.24's default capture size: min(2 * max_num_seqs, 512, max_num_batched_tokens)
    assert max_cudagraph_size(1024, 8192) == 512
    assert max_cudagraph_size(128, 2048) == 256
    assert max_cudagraph_size(8, 256) == 16


def test_vllm_fa_backend_is_one_clear_error_without_cuda():
    torch = pytest.importorskip("torch")
    from profiler import attention as attn
    from simserve.cards import ModelCard
    toy = ModelCard(name="toy", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=1,
                    head_dim=32, intermediate_size=256, vocab_size=1000,
                    max_position_embeddings=4096)
    assert "vllm_fa" in attn.BACKENDS
    with pytest.raises(attn.BackendError, match="CUDA only"):
        attn.make_backend("vllm_fa", "cpu", toy, torch.bfloat16)


def _cuda_and_vllm_fa() -> bool:
    try:
        import torch
        from profiler.vllm_attention import vllm_fa_available
        return torch.cuda.is_available() and vllm_fa_available()
    except ImportError:
        return False


@pytest.mark.skipif(not _cuda_and_vllm_fa(),
                    reason="needs CUDA and vLLM's flash-attention kernels (a vLLM CUDA build; "
                           "on the lent GPU machine: benchmarks/gpu_stage_vllm.py)")
def test_vllm_fa_matches_dense_attention():  # pragma: no cover - GPU machines only
    import torch
    from profiler import attention as attn
    from simserve.cards import ModelCard
    shapes = ModelCard(name="t", num_layers=1, hidden_size=1024, num_heads=8, num_kv_heads=2,
                       head_dim=128, intermediate_size=256, vocab_size=1000,
                       max_position_embeddings=4096)
    backend = attn.make_backend("vllm_fa", "cuda", shapes, torch.bfloat16)
    for prefill, decode_ctx in (([(13, 37), (16, 0)], [3, 17, 40]), ([(300, 700)], [9, 2000])):
        err = attn.self_check(backend, prefill, decode_ctx, 16, 8, 2, 128, torch.bfloat16,
                              "cuda", seed=1)
        assert err < attn.TOLERANCE[torch.bfloat16]


# --------------------------------------------------------------------------------------------
# fidelity_gpu.py


def test_state_packs_what_a_stage_added_and_resumes_it(tmp_path):
    import time
    state = gpu.State(tmp_path / "device")
    state.write("old.json", {"a": 1})
    t0 = time.time() + 5             # files written before the stage started stay out
    import os
    os.utime(state.path("old.json"), (t0 - 60, t0 - 60))
    state.write("capacity.json", {"request_throughput": 3.0})
    run = state.path("real/default-light/run0")
    run.mkdir(parents=True)
    (run / "chunks.csv").write_text("request_id,chunk_index,time_s,num_tokens\n")
    (run / "tokens.csv").write_text("request_id,token_index,time_s\n")
    state.mark("capacity")
    tgz = state.pack("capacity", tmp_path / "OUT", since=t0 - 5)
    fresh = gpu.State(tmp_path / "fresh")
    assert fresh.resume(tmp_path / "OUT") == ["state-capacity.tgz"]
    assert fresh.read("capacity.json") == {"request_throughput": 3.0}
    assert fresh.done("capacity")
    assert (fresh.root / "real/default-light/run0/chunks.csv").exists()
    assert not (fresh.root / "real/default-light/run0/tokens.csv").exists()   # left out
    assert fresh.read("old.json") is None
    assert tgz.stat().st_size < 16 << 20


def test_resolved_knobs_from_a_vllm_log():
    log = ("INFO [arg_utils.py] Chunked prefill is enabled with max_num_batched_tokens=8192.\n"
           "INFO [core.py] Initializing a V1 LLM engine (v0.24.0) with config: ... "
           "compilation_config={'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}\n"
           "(APIServer pid=1) INFO vLLM API server version 0.24.0\n")
    k = gpu.resolved_knobs(log)
    assert k["max_num_batched_tokens"] == "8192"
    assert k["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert k["engine_version"] == "0.24.0"
    assert k["max_num_seqs"] is None               # not in this log: said so, not guessed


def test_workloads_are_fractions_of_the_measured_capacity(tmp_path):
    mode = gpu.gpu_mode()
    state = gpu.State(tmp_path)
    wls = gpu.workloads(mode, state, capacity_rps=20.0)
    assert {k: w["rate"] for k, w in wls.items()} == {"light": 4.0, "moderate": 14.0,
                                                     "saturating": 30.0, "trace": 10.0}
    import pandas as pd
    trace = pd.read_csv(state.path("trace.csv"))
    assert len(trace) == 300 and (trace["prompt_tokens"] + trace["output_tokens"]
                                  <= mode.max_model_len).all()
    sc = gpu.scenario_of(mode, state, "trace", wls["trace"], mode.knobs, mode.profile, 160000)
    assert sc.engine.num_gpu_blocks == 10000 and sc.engine.max_num_seqs == 1024


def test_send_budget_shrinks_requests_to_fit_a_call():
    wls = {"light": {"rate": 2.0, "num_requests": 120}, "moderate": {"rate": 10.0,
                                                                     "num_requests": 300}}
    # planned: 3 x (60 + 30 drain) + 3 x (30 + 30) = 450 s; a 300 s budget scales the sends
    planned, scaled = gpu.fit_budget(wls, repeats=3, drain_s=30.0, budget_s=300.0,
                                     min_requests=20)
    assert planned == pytest.approx(450.0)
    sends = sum(3 * (w["num_requests"] / w["rate"] + 30.0) for w in scaled.values())
    assert sends <= 300.0 + 1e-6
    assert all(w["num_requests"] >= 20 for w in scaled.values())
    same = gpu.fit_budget(wls, repeats=3, drain_s=30.0, budget_s=600.0, min_requests=20)[1]
    assert same == wls


def test_price_steps_against_a_model_that_is_exact():
    """Steps priced by the model that generated them: every bin's error is zero."""
    from simserve.live.calibrate import LoadSteps
    from simserve.cards import load_model
    from simserve.latency.profile import ProfileLatency
    from simserve.sched.plan import StepPlan
    model = ProfileLatency.from_file(
        REPO / "simserve/data/profiles/tiny-llama-45m_cpu-epyc-2core_bf16_1t.json",
        load_model("tiny-llama-45m"))
    decode = []
    for ctx in [(100,), (100, 200), (50, 60, 70, 80), tuple(range(100, 120))]:
        b = len(ctx)
        decode.append((model.step_time(StepPlan(tuple(range(b)), (1,) * b, (), (), ctx, b)), ctx))
    mixed = [(300, model.step_time(StepPlan((0, 1), (1, 300), (300,), (0,), (90,), 2)), (90,))]
    dec, mix = gpu.price_steps(LoadSteps(decode, mixed), {"m": model})
    assert dec["n"].sum() == 4 and mix["n"].sum() == 1
    assert dec["m err %"].abs().max() < 1e-9 and mix["m err %"].abs().max() < 1e-9


def test_bad_stage_is_one_clear_error(capsys):
    with pytest.raises(SystemExit) as e:
        gpu.main(["--stages", "serve,nonsense", "--out", "/nonexistent-out"])
    assert e.value.code == 2
    assert "nonsense" in capsys.readouterr().err
    assert not Path("/nonexistent-out").exists()


def test_grid_ratios_over_common_points_only():
    base = {"linear": {"tokens": [1, 8, 32], "seconds": [1.0, 2.0, 4.0]},
            "attn_decode": {"batch": [1, 4], "ctx": [16, 64],
                            "seconds": [[1.0, 2.0], [3.0, None]]}}
    new = {"linear": {"tokens": [8, 32, 128], "seconds": [1.0, 8.0, 9.0]},
           "attn_decode": {"batch": [1, 4], "ctx": [16, 64],
                           "seconds": [[2.0, 2.0], [1.5, 5.0]]}}
    t = gpu.grid_ratios(base, new)
    # linear: tokens 8 (0.5) and 32 (2.0); decode: three points both measured (2, 1, 0.5)
    assert t.loc["linear", "points"] == 2 and t.loc["linear", "median"] == pytest.approx(1.25)
    assert t.loc["attn_decode", "points"] == 3
    assert (t.loc["attn_decode", "min"], t.loc["attn_decode", "max"]) == (0.5, 2.0)
    assert "attn_prefill" not in t.index


def test_compile_cache_travels_back_and_is_restored(tmp_path, capsys):
    state = gpu.State(tmp_path / "m1" / "state")
    cache = gpu.cache_root(state) / "torch_compile_cache" / "abc"
    cache.mkdir(parents=True)
    (cache / "artifact.bin").write_bytes(b"\1" * 1000)
    out = tmp_path / "OUT"
    assert gpu.pack_compile_cache(state, out) == out / "compile-cache.tgz"
    assert gpu.pack_compile_cache(state, out, limit=10) is None      # too big: not kept
    assert not (out / "compile-cache.tgz").exists()
    assert "not kept" in capsys.readouterr().err


def test_a_kept_server_is_stopped_by_its_pidfile_and_reaped(tmp_path):
    import subprocess
    import time
    fc = sys.modules["fidelity_campaign"]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    pidfile = tmp_path / "server.pid"
    pidfile.write_text(f"{proc.pid}\n")
    t0 = time.time()
    fc.Server.stop_pidfile(pidfile)
    assert time.time() - t0 < 10           # SIGTERM answered; no 30 s wait on a zombie
    assert not pidfile.exists()
    fc.Server.stop_pidfile(pidfile)         # nothing recorded: nothing signalled


def test_fidelity_vllm_still_builds_its_cpu_server_from_the_shared_pieces(tmp_path):
    """fidelity_vllm.py after its shared pieces moved to fidelity_campaign.py: the same server
    command, not started."""
    fv = _load("fidelity_vllm")
    srv = fv.vllm_server(fv.HELD_OUT_KNOBS, tmp_path / "server.log")
    assert isinstance(srv, sys.modules["fidelity_campaign"].Server) and srv.port == 8011
    cmd = " ".join(srv.cmd)
    assert "--max-num-seqs 8 --max-num-batched-tokens 256 --block-size 32" in cmd
    assert srv.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and srv.proc is None


def test_the_cold_stage_replays_one_load_twice_without_warmup(tmp_path, monkeypatch):
    mode, state = gpu.rehearse_mode(), gpu.State(tmp_path / "state")
    calls = []

    class Res:
        def __init__(self, k):
            self.summary = {"completed": 12, "mean_ttft_ms": 10.0 * k, "p90_ttft_ms": 20.0,
                            "p99_ttft_ms": 40.0 / k, "mean_e2el_ms": 100.0, "p99_e2el_ms": 300.0}

        def save(self, path):
            Path(path).mkdir(parents=True)

    def fake_replay(sc, endpoint, **kw):
        calls.append(kw)
        return Res(len(calls))

    monkeypatch.setattr(gpu, "ensure_server", lambda *a: {"kv_tokens": 4096})
    monkeypatch.setattr(gpu, "replay", fake_replay)
    gpu.stage_cold(mode, state, None)
    assert [kw["warmup"] for kw in calls] == [0, 0]        # the first load is the server's first
    cold = state.read("cold.json")
    assert cold["first"]["p99_ttft_ms"] == 40.0 and cold["again"]["p99_ttft_ms"] == 20.0
    assert cold["workload"]["rate"] == mode.cold[0]
    assert cold["workload"]["num_requests"] == mode.cold[1]
    assert (state.root / "cold-first").is_dir() and (state.root / "cold-again").is_dir()


def test_the_cold_stage_refuses_a_server_that_has_served(tmp_path, monkeypatch):
    state = gpu.State(tmp_path / "state")
    state.write("capacity.json", {"request_throughput": 3.0})
    monkeypatch.setattr(gpu, "ensure_server", lambda *a: pytest.fail("server started"))
    with pytest.raises(SystemExit) as e:
        gpu.stage_cold(gpu.rehearse_mode(), state, None)
    assert "fresh state" in str(e.value)
