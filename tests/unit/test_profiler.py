"""The profiler: paged attention against dense attention, the block-table arithmetic, an
end-to-end CPU profile that validates, and the profile schema's errors."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from profiler import attention as attn
from profiler.cli import main
from profiler.layers import (DecoderLayer, Model, PagedKVCache, blocks_needed,
                             build_step, gather_slots, make_top_p, sample_greedy)
from profiler.measure import Grid, Options, random_steps, run_profile, token_axis
from simserve.cards import ModelCard
from simserve.errors import DataError
from simserve.latency.schema import (SCHEMA_VERSION, ProfileError, dump, load_profile,
                                     model_mismatch, validate)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The tensors here are tiny: a second intra-op thread adds nothing but its spin-waits,
    which on a busy 2-core machine cost 100 times the work itself (1.3 s of CPU for a 14 ms
    attention check). One thread, as the profiler itself runs on CPU (``--threads 1``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

# torch's own inductor import trips its jit deprecation warning; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated")

# an even tinier model than tiny-llama-45m: GQA (4 query heads per KV head), qkv bias
TOY = ModelCard(name="toy", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=1,
                head_dim=32, intermediate_size=256, vocab_size=1000,
                max_position_embeddings=4096, qkv_bias=True)
TOY_YAML = """\
name: toy
layers: 2
hidden: 128
heads: 4
kv_heads: 1
head_dim: 32
intermediate: 256
vocab: 1000
max_position_embeddings: 4096
qkv_bias: true
"""

# prefill chunks (len, ctx) with context, one longer than a FlexAttention query tile (128), one
# starting mid-block, plus decodes of varied context (ctx 0: a one-token sequence)
PREFILL = [(13, 37), (150, 20), (16, 0), (1, 5)]
DECODE = [3, 17, 40, 0, 64]


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: int) -> torch.Tensor:
    """fp64 attention written out by hand: query i at position ctx + i sees keys 0 .. ctx + i."""
    L, H, D = q.shape
    n, hkv = k.shape[:2]
    group = H // hkv
    out = torch.empty((L, H, D), dtype=torch.float64)
    for h in range(H):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        scores = q[:, h].double() @ kh.T / D ** 0.5
        for i in range(L):
            scores[i, ctx + i + 1:] = float("-inf")
        out[:, h] = scores.softmax(-1) @ vh
    return out


def paged_vs_dense(backend, block_size: int, heads: int, kv_heads: int, dtype: torch.dtype,
                   prefill=PREFILL, decode=DECODE, seed: int = 0,
                   num_blocks: int | None = None) -> float:
    gen = torch.Generator().manual_seed(seed)
    head_dim = 32
    lens = [a + c for a, c in prefill] + [c + 1 for c in decode]
    if num_blocks is None:
        num_blocks = sum(blocks_needed(n, block_size) for n in lens) + 5
    cache = PagedKVCache(num_blocks, block_size, kv_heads, head_dim, dtype, "cpu",
                         generator=gen)
    meta = build_step(prefill, decode, block_size, num_blocks, "cpu", generator=gen)
    q = torch.randn((meta.num_tokens, heads, head_dim), generator=gen).to(dtype)
    backend.prepare(meta, num_blocks)
    out = backend(q, cache, meta)
    assert out.shape == q.shape and torch.isfinite(out).all()
    worst = 0.0
    for s in range(meta.num_seqs):
        # the dense yardstick reads K/V by logical position, straight from the block table
        blocks = meta.block_tables[s, :meta.num_blocks_per_seq[s]].tolist()
        k = torch.cat([cache.k[b] for b in blocks])[:meta.seq_lens[s]]
        v = torch.cat([cache.v[b] for b in blocks])[:meta.seq_lens[s]]
        a, b = meta.query_start[s], meta.query_start[s + 1]
        ref = dense(q[a:b], k, v, meta.ctx_lens[s])
        assert ref.abs().max() > 0.05                          # non-trivial inputs
        worst = max(worst, float((out[a:b].double() - ref).abs().max() / ref.abs().max()))
    return worst


# --------------------------------------------------------------------------------------------
# Paged attention correctness


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("batch_decodes", [False, True], ids=["decode-loop", "decode-batch"])
def test_reference_backend_matches_dense(dtype, heads, kv_heads, block_size, batch_decodes):
    backend = attn.ReferenceAttention(batch_decodes=batch_decodes)
    err = paged_vs_dense(backend, block_size, heads, kv_heads, dtype)
    assert err < attn.TOLERANCE[dtype], err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)])
def test_flex_eager_backend_matches_dense(dtype, heads, kv_heads):
    err = paged_vs_dense(attn.FlexPagedAttention("cpu", compile=False), 16, heads, kv_heads,
                         dtype)
    assert err < attn.TOLERANCE[dtype], err


@pytest.mark.parametrize("heads,kv_heads", [(6, 2), (7, 1), (8, 2)])
def test_flex_cuda_layout_for_short_queries_matches_dense(heads, kv_heads):
    """What the backend does for short queries on CUDA, run eagerly on CPU: partial blocks only
    (so Flex's decoding kernel splits a sequence's own pages) and query heads padded with zero
    heads to a power of two per KV head (3 -> 4, 7 -> 8; 4 stays)."""
    flex = attn.FlexPagedAttention("cpu", compile=False, heads_per_kv=heads // kv_heads,
                                   short_split=True, pad_groups=True)
    assert flex.group == 1 << (heads // kv_heads - 1).bit_length()
    err = paged_vs_dense(flex, 16, heads, kv_heads, torch.float32)
    assert err < attn.TOLERANCE[torch.float32], err
    # a step of decodes only: every query is short; the mask has no full blocks
    gen = torch.Generator().manual_seed(4)
    meta = build_step([], [5, 40, 17], 16, 12, "cpu", generator=gen)
    flex.prepare(meta, 12)
    (_, _, _, _, mask), = meta.backend_state["flex"]
    assert mask.full_kv_num_blocks is None
    err = attn.self_check(flex, [(3, 9)], [5, 40, 17], 16, heads, kv_heads, 32,
                          torch.float32, "cpu")
    assert err < attn.TOLERANCE[torch.float32], err


@pytest.mark.compile
def test_flex_compiled_backend_matches_dense():
    # one shape family (prefill rows only: batch 4, query length padded to 256), compiled once
    # on CPU -- seconds, most of it inductor's start-up. Decode rows go through the same
    # mask_mod and block mask, checked eagerly above.
    backend = attn.FlexPagedAttention("cpu", compile=True)
    err = paged_vs_dense(backend, 16, 8, 2, torch.bfloat16, decode=[], num_blocks=40)
    assert backend.fallback is None, backend.fallback
    assert backend.compiled
    assert len(backend.compile_seconds) == 1 and all(
        s > 0 for s in backend.compile_seconds.values())
    assert err < attn.TOLERANCE[torch.bfloat16], err
    # same family again (batch and query length pad to the same powers of two): no recompile
    err = paged_vs_dense(backend, 16, 8, 2, torch.bfloat16,
                         prefill=[(140, 3), (30, 60), (2, 0), (9, 9)], decode=[], seed=1,
                         num_blocks=40)
    assert len(backend.compile_seconds) == 1
    assert err < attn.TOLERANCE[torch.bfloat16], err


def test_flex_compile_failure_falls_back_to_eager_and_says_why():
    backend = attn.FlexPagedAttention("cpu", compile=True)

    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler\nmore detail")

    backend._compiled_fn = broken
    err = paged_vs_dense(backend, 16, 8, 2, torch.float32)
    assert err < attn.TOLERANCE[torch.float32]
    assert backend.compiled is False and backend.compile_seconds == {}
    assert backend.fallback == "torch.compile failed (RuntimeError: no C++ compiler); eager used"


def test_flex_eager_refuses_to_materialise_too_much():
    backend = attn.FlexPagedAttention("cpu", compile=False, eager_limit_bytes=1000)
    with pytest.raises(attn.BackendError, match="reference"):
        paged_vs_dense(backend, 16, 4, 4, torch.float32)


def test_self_check_reports_small_error_for_every_cpu_backend():
    for backend in (attn.ReferenceAttention(), attn.FlexPagedAttention("cpu", compile=False)):
        err = attn.self_check(backend, [(13, 37)], [3, 40], 16, 8, 2, 32, torch.bfloat16, "cpu")
        assert 0 < err < attn.TOLERANCE[torch.bfloat16]


def test_flashinfer_page_table_from_block_tables():
    # seq 0: 13 new + 37 context = 50 tokens -> 4 pages of 16, last holds 2
    # seq 1: decode at ctx 16 -> 17 tokens -> 2 pages, last holds 1
    meta = build_step([(13, 37)], [16], 16, 20, "cpu", generator=torch.Generator().manual_seed(3))
    t = attn.flashinfer_page_table(meta, [0, 1])
    assert t["qo_indptr"].tolist() == [0, 13, 14]
    assert t["kv_indptr"].tolist() == [0, 4, 6]
    assert t["kv_indices"].tolist() == (meta.block_tables[0, :4].tolist()
                                        + meta.block_tables[1, :2].tolist())
    assert t["kv_last_page_len"].tolist() == [2, 1]
    assert all(x.dtype == torch.int32 for x in t.values())


def test_flashinfer_needs_cuda():
    with pytest.raises(attn.BackendError, match="CUDA"):
        attn.FlashInferAttention("cpu", 8, 2, 32, torch.bfloat16)


def test_auto_backend_choice():
    assert attn.resolve_backend_name("auto", "cpu") == "reference"
    assert attn.resolve_backend_name("auto", "cuda") in ("flashinfer", "flex")
    assert attn.resolve_backend_name("flex", "cpu") == "flex"


@pytest.mark.skipif(not (torch.cuda.is_available() and attn.flashinfer_available()),
                    reason="needs CUDA and flashinfer")
def test_flashinfer_backend_matches_dense():  # pragma: no cover - GPU machines only
    backend = attn.FlashInferAttention("cuda", 8, 2, 32, torch.bfloat16)
    err = attn.self_check(backend, PREFILL, DECODE, 16, 8, 2, 32, torch.bfloat16, "cuda")
    assert err < attn.TOLERANCE[torch.bfloat16]


# --------------------------------------------------------------------------------------------
# Block tables, slot mapping, cache writes


def test_shuffled_block_table_gathers_tokens_in_position_order():
    block_size, num_blocks = 4, 12
    gen = torch.Generator().manual_seed(7)
    # two sequences: a chunk of 6 after 5 cached tokens (11 tokens, 3 blocks) and a decode at
    # ctx 6 (7 tokens, 2 blocks)
    meta = build_step([(6, 5)], [6], block_size, num_blocks, "cpu", generator=gen)
    used = meta.block_tables[0, :3].tolist() + meta.block_tables[1, :2].tolist()
    assert len(set(used)) == 5                                   # no block shared
    assert used != sorted(used) or used[0] != 0                  # not the identity layout
    # slot(pos) = table[pos // block_size] * block_size + pos % block_size
    table0 = meta.block_tables[0].tolist()
    assert meta.slot_mapping[:6].tolist() == [table0[p // 4] * 4 + p % 4 for p in range(5, 11)]
    assert meta.positions.tolist() == list(range(5, 11)) + [6]

    # write every position of every sequence with its (sequence, position) id, through slots
    cache = PagedKVCache(num_blocks, block_size, 1, 2, torch.float32, "cpu")
    for s, n in enumerate(meta.seq_lens):
        slots = gather_slots(meta.block_tables[s], n, block_size)
        ids = torch.tensor([[s * 100.0 + p, -(s * 100.0 + p)] for p in range(n)])
        cache.write(ids[:, None, :], ids[:, None, :], slots)
    for s, n in enumerate(meta.seq_lens):
        blocks = meta.block_tables[s, :meta.num_blocks_per_seq[s]].long()
        got = cache.k[blocks].reshape(-1, 2)[:n, 0]
        assert got.tolist() == [s * 100.0 + p for p in range(n)]


def test_build_step_rejects_too_small_cache_and_empty_chunk():
    with pytest.raises(ValueError, match="KV blocks"):
        build_step([(40, 0)], [], 16, 2, "cpu")
    with pytest.raises(ValueError, match="at least one token"):
        build_step([(0, 4)], [], 16, 8, "cpu")


def test_build_step_wraps_onto_reused_blocks_only_when_asked():
    with pytest.raises(ValueError, match="KV blocks"):
        build_step([], [40, 40], 16, 5, "cpu")
    meta = build_step([], [40, 40], 16, 5, "cpu", generator=torch.Generator().manual_seed(0),
                      wrap=True)
    assert meta.num_blocks_per_seq == [3, 3]
    used = meta.block_tables.flatten().tolist()
    assert all(0 <= b < 5 for b in used) and len(set(used)) == 5   # every block, one twice
    assert int(meta.slot_mapping.max()) < 5 * 16


def test_layer_writes_new_kv_at_slots_and_keeps_shape():
    gen = torch.Generator().manual_seed(0)
    model = Model(TOY, torch.float32, "cpu", seed=0)
    layer: DecoderLayer = model.layers[0]
    meta = build_step([(5, 3)], [2], 4, 10, "cpu", generator=gen)
    cache = PagedKVCache(10, 4, TOY.num_kv_heads, TOY.head_dim, torch.float32, "cpu",
                         generator=gen)
    backend = attn.ReferenceAttention()
    backend.prepare(meta, 10)
    x = torch.randn(meta.num_tokens, TOY.hidden_size, generator=gen)
    y = layer.forward(x, meta, cache, backend)
    assert y.shape == x.shape and torch.isfinite(y).all()
    # the V written for the new tokens is the V projection of the normed input
    from profiler.layers import rms_norm
    _, _, v = layer.split_qkv(layer.qkv(rms_norm(x, layer.input_norm)))
    flat_v = cache.v.view(-1, TOY.num_kv_heads, TOY.head_dim)
    torch.testing.assert_close(flat_v[meta.slot_mapping], v)


def test_compiled_layer_pieces_compute_what_the_eager_layer_does():
    """The profiler compiles a layer's two pieces on CUDA (as vLLM does); they must compute the
    same function as the eager ops, at any token count (shapes are dynamic in T)."""
    gen = torch.Generator().manual_seed(3)
    eager = Model(TOY, torch.float32, "cpu", seed=0)
    fused = Model(TOY, torch.float32, "cpu", seed=0, compile_layers=True)
    assert fused.pieces.compiled and not eager.pieces.compiled
    for prefill, decodes in (([(5, 3)], [7, 2]), ([(11, 0), (4, 9)], [])):
        meta = build_step(prefill, decodes, 16, 20, "cpu", generator=gen)
        x0 = torch.randn(meta.num_tokens, TOY.hidden_size, generator=gen)
        outs = []
        for model in (eager, fused):
            backend = attn.ReferenceAttention()
            backend.prepare(meta, 20)
            caches = [PagedKVCache(20, 16, TOY.num_kv_heads, TOY.head_dim, torch.float32,
                                   "cpu", fill="tile", generator=torch.Generator().manual_seed(1))
                      for _ in model.layers]
            x = x0
            for layer, cache in zip(model.layers, caches):
                x = layer.forward(x, meta, cache, backend)
            outs.append(x)
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_flex_short_queries_fold_into_one_query_tile():
    """Flex's decoding kernel takes blocks of next_pow2(q_len * heads per KV head) rows (at
    least 16), which must divide the 128-row query tile: queries whose fold is larger go to the
    general kernel, and every page size gets a BLOCK_N that divides it."""
    flex = attn.FlexPagedAttention("cpu", compile=False, heads_per_kv=4)
    assert [q for q in (1, 8, 32, 33, 64, 128) if flex.short(q)] == [1, 8, 32]
    padded = attn.FlexPagedAttention("cpu", compile=False, heads_per_kv=7, pad_groups=True)
    assert padded.group == 8 and padded.short(16) and not padded.short(17)
    for q in range(1, 129):
        if flex.short(q):
            assert flex.Q_TILE % max(16, 1 << (q * 4 - 1).bit_length()) == 0
    assert attn.cuda_kernel_options(16, True) == {"BLOCK_N": 16}
    assert attn.cuda_kernel_options(32, False) == {"BLOCK_N": 32,
                                                  "FORCE_USE_FLEX_ATTENTION": True}
    assert attn.cuda_kernel_options(128, True) == {"BLOCK_N": 64}
    assert flex.kernel_options(None, 1) is None          # CPU kernels take none


def test_model_step_samples_one_token_per_row_and_distinct_layers():
    model = Model(TOY, torch.float32, "cpu", seed=0)
    assert len({id(layer) for layer in model.layers}) == TOY.num_layers
    shared = Model(TOY, torch.float32, "cpu", seed=0, distinct_layers=False)
    assert len({id(layer) for layer in shared.layers}) == 1
    meta = build_step([(7, 0)], [4, 9], 4, 16, "cpu")
    caches = [PagedKVCache(16, 4, 1, 32, torch.float32, "cpu") for _ in model.layers]
    backend = attn.ReferenceAttention()
    backend.prepare(meta, 16)
    ids = torch.randint(0, TOY.vocab_size, (meta.num_tokens,))
    rows = torch.tensor([6, 7, 8])
    out = model.step(ids, meta, caches, backend, sample_greedy, rows)
    assert out.shape == (3,) and int(out.max()) < TOY.vocab_size


def test_samplers():
    logits = torch.tensor([[0.0, 5.0, 1.0, 4.9], [3.0, 0.0, 0.0, 0.0]])
    assert sample_greedy(logits).tolist() == [1, 0]
    # a tiny nucleus keeps only the most likely token
    assert make_top_p(1e-6)(logits).tolist() == [1, 0]
    # p = 0.9 keeps tokens 1 and 3 in row 0 and never samples outside them
    picks = {int(make_top_p(0.9, seed=i)(logits)[0]) for i in range(30)}
    assert picks <= {1, 3} and len(picks) == 2


def test_random_heldout_steps_respect_the_budget():
    for prefill, decode, sampled in random_steps(50, 300, 40, 1000, seed=1):
        assert sum(q for q, _ in prefill) + len(decode) <= 300
        assert prefill or decode
        assert len(decode) <= sampled <= len(decode) + len(prefill)
        assert all(q >= 1 for q, _ in prefill)


def test_token_axis_caps_at_the_step_budget():
    assert token_axis((1, 8, 32, 128, 512), 100) == [1, 8, 32, 100]
    assert token_axis((1, 8), 8) == [1, 8]


# --------------------------------------------------------------------------------------------
# End to end on CPU


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory) -> Path:
    """The CLI, in process, on the toy model read from a YAML file, quick grid, 1 thread;
    contexts up to 384 and a 96-token step budget, neither on the quick grid, so both show up as
    added points (the quick grid's 2048 would take many times as long and test nothing more)."""
    d = tmp_path_factory.mktemp("prof")
    card = d / "toy.yaml"
    card.write_text(TOY_YAML)
    out = d / "toy.json"
    rc = main(["--model", str(card), "--device", "cpu", "--out", str(out), "--grid", "quick",
               "--threads", "1", "--max-num-batched-tokens", "96", "--block-size", "16",
               "--max-model-len", "384"])
    assert rc == 0
    return out


def test_cli_quick_profile_validates(profile_file):
    p = load_profile(profile_file)
    assert p["schema_version"] == SCHEMA_VERSION
    prov = p["provenance"]
    assert prov["device"] == "cpu" and prov["threads"] == 1 and prov["cuda_version"] is None
    assert prov["command"].startswith("python -m profiler --model ")
    assert prov["date"].endswith("Z") and prov["dtype"] == "bf16"
    assert p["model"]["num_kv_heads"] == 1 and p["model"]["qkv_bias"] is True
    assert p["attention"]["backend"] == "reference"
    assert p["attention"]["self_check_rel_err"] < 2e-2
    lin = p["linear"]
    assert lin["tokens"][-1] == 96                           # the step budget is on the grid
    assert set(lin["ops"]) == set(DecoderLayer.OPS)
    assert all(a <= m <= b for a, m, b in zip(lin["p10"], lin["seconds"], lin["p90"]))
    assert all(s > 0 for s in lin["seconds"])
    # more work costs more time, far enough apart for noise not to matter
    assert lin["seconds"][-1] > lin["seconds"][0]
    dec = p["attn_decode"]["seconds"]
    assert dec[-1][-1] > dec[0][0]
    # the context axes stop at --max-model-len, which is on them
    assert p["attn_decode"]["ctx"] == [16, 256, 384] and p["attn_prefill"]["ctx"] == [0, 384]
    mem = p["memory"]
    assert mem["activation_peak_method"] == "estimated" and mem["num_gpu_blocks"] is None
    # K and V, 2 layers, 1 KV head of 32, bf16
    assert mem["kv_bytes_per_token"] == 2 * 2 * 1 * 32 * 2
    assert mem["block_bytes"] == 16 * mem["kv_bytes_per_token"]
    assert len(p["heldout"]) >= 1
    for step in p["heldout"]:
        assert sum(q for q, _ in step["prefill"]) + len(step["decode_ctx"]) <= 96
        assert step["seconds"] > 0


def test_weights_bytes_match_the_allocated_parameters(profile_file):
    p = load_profile(profile_file)
    model = Model(TOY, torch.bfloat16, "cpu")
    from profiler.layers import param_bytes
    assert p["memory"]["weights_bytes"] == param_bytes(model.parameters())


def test_run_profile_in_process_with_flex_eager_and_tiny_grid():
    # one context per attention axis and one held-out step: eager FlexAttention costs ~50 ms a
    # call whatever the shape, so the points are the time (the quick-grid profile above has
    # multi-point context axes, test_flex_eager_backend_matches_dense prefills without context)
    grid = Grid(tokens=(1, 16), prefill_chunk=(8, 32), prefill_ctx=(40,), decode_batch=(1, 3),
                decode_ctx=(50,), lm_seqs=(1, 4), heldout=1, heldout_max_decodes=4,
                heldout_max_ctx=60, warmup=0, repeats=3, point_budget_s=0.1)
    opts = Options(attention="flex", compile=False, max_num_batched_tokens=32,
                   grid_override=grid, command="test")
    import io
    log = io.StringIO()
    p = run_profile(TOY, opts, stream=log)
    validate(p)
    assert p["attention"]["backend"] == "flex" and p["attention"]["compiled"] is False
    assert "eager" in p["attention"]["note"]
    assert p["attn_prefill"]["chunk"] == [8, 32] and p["attn_decode"]["batch"] == [1, 3]
    assert "profiled" in log.getvalue()


# --------------------------------------------------------------------------------------------
# Schema


def test_schema_round_trip(profile_file, tmp_path):
    p = load_profile(profile_file)
    again = tmp_path / "again.json"
    dump(p, again)
    assert load_profile(again) == p
    assert json.loads(again.read_text()) == json.loads(profile_file.read_text())


def _one_line_error(path: Path) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    assert isinstance(info.value, DataError)                # simserve's CLI prints it cleanly
    return message


def test_schema_errors_are_one_clear_line(profile_file, tmp_path):
    good = json.loads(profile_file.read_text())
    f = tmp_path / "bad.json"

    f.write_text("{not json")
    assert "not JSON" in _one_line_error(f)

    f.write_text("[1, 2]")
    assert _one_line_error(f) == f"{f}: expected an object, got list"

    bad = copy.deepcopy(good)
    del bad["attn_decode"]
    f.write_text(json.dumps(bad))
    assert "attn_decode: missing" in _one_line_error(f)

    bad = copy.deepcopy(good)
    del bad["memory"]["block_bytes"]
    f.write_text(json.dumps(bad))
    assert "memory.block_bytes: missing" in _one_line_error(f)

    bad = copy.deepcopy(good)
    bad["schema_version"] = SCHEMA_VERSION + 1
    del bad["linear"]                                       # a newer layout: version wins
    f.write_text(json.dumps(bad))
    msg = _one_line_error(f)
    assert "newer" in msg and "upgrade" in msg

    bad = copy.deepcopy(good)
    del bad["schema_version"]
    f.write_text(json.dumps(bad))
    assert "schema_version: missing" in _one_line_error(f)

    bad = copy.deepcopy(good)
    bad["linear"]["seconds"][1] = "fast"
    f.write_text(json.dumps(bad))
    assert "linear.seconds[1]: expected a finite number" in _one_line_error(f)

    bad = copy.deepcopy(good)
    bad["attn_prefill"]["seconds"][0] = bad["attn_prefill"]["seconds"][0][:-1]
    f.write_text(json.dumps(bad))
    assert "attn_prefill.seconds[0]: expected" in _one_line_error(f)

    bad = copy.deepcopy(good)
    bad["attn_decode"]["batch"] = list(reversed(bad["attn_decode"]["batch"]))
    f.write_text(json.dumps(bad))
    assert "ascending" in _one_line_error(f)

    bad = copy.deepcopy(good)
    bad["model"]["num_layers"] = True
    f.write_text(json.dumps(bad))
    assert "model.num_layers: expected an integer" in _one_line_error(f)

    assert "cannot read" in _one_line_error(tmp_path / "absent.json")


def test_dump_refuses_an_invalid_profile(profile_file, tmp_path):
    bad = json.loads(profile_file.read_text())
    bad["heldout"][0]["seconds"] = -1.0
    with pytest.raises(ProfileError, match="negative"):
        dump(bad, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_model_mismatch_names_the_fields(profile_file):
    p = load_profile(profile_file)
    assert model_mismatch(p, p["model"]) == []
    other = {**p["model"], "num_layers": 32, "hidden_size": 4096}
    assert model_mismatch(p, other) == ["num_layers: profile 2, model 32",
                                        "hidden_size: profile 128, model 4096"]


def test_schema_module_does_not_import_torch():
    code = ("import sys; import simserve.latency.schema; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


# --------------------------------------------------------------------------------------------
# CLI errors


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cli_cuda_without_cuda_exits_2_with_one_line(tmp_path):
    out = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "profiler", "--model", "tiny-llama-45m",
                        "--device", "cuda", "--out", str(out)],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith("profiler: error: --device cuda") and "CUDA" in lines[0]
    assert not out.exists()


def test_cli_unknown_model_exits_2(tmp_path, capsys):
    rc = main(["--model", "no-such-model", "--device", "cpu", "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "unknown name 'no-such-model'" in err and len(err.strip().splitlines()) == 1
    rc = main(["--model", str(tmp_path / "absent.yaml"), "--device", "cpu",
               "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "absent.yaml: file not found" in err
    bad = tmp_path / "card.yaml"
    bad.write_bytes(b"name: caf\xe9\n")            # not UTF-8: one line, never a traceback
    rc = main(["--model", str(bad), "--device", "cpu", "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "card.yaml:1: is not UTF-8" in err and len(err.strip().splitlines()) == 1


def test_cli_rejects_bad_numbers(tmp_path, capsys):
    rc = main(["--model", "tiny-llama-45m", "--device", "cpu", "--out", str(tmp_path / "p.json"),
               "--block-size", "0"])
    assert rc == 2 and "--block-size must be >= 1" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Parts timed inside whole steps


def test_sections_split_a_step_into_its_parts():
    from profiler.layers import Sections
    model = Model(TOY, torch.float32, "cpu", seed=0)
    meta = build_step([(7, 3)], [4, 9], 4, 16, "cpu")
    caches = [PagedKVCache(16, 4, 1, 32, torch.float32, "cpu") for _ in model.layers]
    backend = attn.ReferenceAttention()
    backend.prepare(meta, 16)
    ids = torch.randint(0, TOY.vocab_size, (meta.num_tokens,))
    rec = Sections("cpu", time.perf_counter)
    t0 = time.perf_counter()
    model.step(ids, meta, caches, backend, sample_greedy, torch.tensor([6, 7, 8]), rec)
    total = time.perf_counter() - t0
    parts = rec.result()
    assert set(parts) == {"embedding", "linear", "attention", "lm_head"}
    assert all(v > 0 for v in parts.values())
    assert sum(parts.values()) <= total
    # the marks tile the step, each stretch charged once to the part that ran in it: on a
    # clock that ticks once per reading, every part's share is its count of stretches (the
    # step's whole time but the two readings outside it), on any machine under any load
    ticks = itertools.count()
    rec = Sections("cpu", lambda: float(next(ticks)))
    t0 = rec.clock()
    model.step(ids, meta, caches, backend, sample_greedy, torch.tensor([6, 7, 8]), rec)
    total = rec.clock() - t0
    layers = len(model.layers)          # per layer: linear (QKV), attention, linear (O, MLP)
    assert rec.result() == {"embedding": 2.0, "linear": 2.0 * layers, "attention": layers,
                            "lm_head": 1.0}
    assert sum(rec.result().values()) == total - 2
    # the same step without sections samples the same tokens
    torch.manual_seed(0)
    again = model.step(ids, meta, caches, backend, sample_greedy, torch.tensor([6, 7, 8]))
    assert again.shape == (3,)


def test_timer_sections_gives_a_stat_per_part():
    from profiler.measure import Timer
    timer = Timer(torch.device("cpu"), warmup=1, repeats=4, budget_s=10.0,
                  clock=time.thread_time)
    calls = []

    def fn(rec):
        calls.append(1)
        rec.start()
        sum(range(20000))
        rec.mark("a")
        sum(range(60000))
        rec.mark("b")
        rec.mark("a")

    from profiler.measure import WHOLE_STEP
    stats = timer.sections(fn)
    assert len(calls) == 5 and set(stats) == {"a", "b", WHOLE_STEP}
    assert stats["a"].n == 4 and stats["a"].p10 <= stats["a"].median <= stats["a"].p90
    assert stats["b"].median > stats["a"].median
    assert stats[WHOLE_STEP].median >= stats["b"].median     # the whole step holds its parts


def test_clock_and_method_recorded(profile_file):
    p = load_profile(profile_file)
    # one CPU thread: the measuring thread's CPU time (other processes' time left out)
    assert p["settings"]["timer"] == "thread_time"
    assert p["settings"]["method"] == "in_step"
    note = p["provenance"]["note"]
    assert "load average (1 min)" in note
    assert "glibc malloc held steady" in note or not sys.platform.startswith("linux")
    with pytest.raises(ValueError, match="one thread"):
        Options(threads=2, timer="cpu")
    assert Options(threads=2).timer_name == "perf_counter"
    assert Options(threads=1, timer="wall").timer_name == "perf_counter"


def test_settings_method_is_optional_but_checked(profile_file, tmp_path):
    good = json.loads(profile_file.read_text())
    del good["settings"]["method"]                      # the first version-1 files
    validate(good)
    good["settings"]["method"] = "guessed"
    with pytest.raises(ProfileError, match="settings.method: expected one of in_step"):
        validate(good)


def test_layer_caches_are_shared_when_memory_is_short(monkeypatch):
    from profiler import measure
    grid = Grid(tokens=(1, 16), prefill_chunk=(8,), prefill_ctx=(0,), decode_batch=(1,),
                decode_ctx=(5,), lm_seqs=(1,), heldout=1, heldout_max_decodes=1,
                heldout_max_ctx=8, warmup=0, repeats=3, point_budget_s=0.1)
    import io
    opts = Options(max_num_batched_tokens=16, grid_override=grid)
    monkeypatch.setattr(measure, "_host_available_bytes", lambda: 10_000_000)
    p = run_profile(TOY, opts, stream=io.StringIO())
    assert "one shared by every layer" not in p["memory"]["note"]      # small caches: per layer
    monkeypatch.setattr(measure, "_host_available_bytes", lambda: 1000)
    p = run_profile(TOY, opts, stream=io.StringIO())
    assert "one shared by every layer" in p["memory"]["note"]
    validate(p)


def test_num_gpu_blocks_the_way_vllm_sizes_the_cache():
    from profiler.measure import num_gpu_blocks
    # 80 GiB x 0.9 = 72 GiB; minus 16 GiB of weights and 2 GiB of activations = 54 GiB;
    # blocks of 16 tokens x 128 KiB per token (Llama-3.1-8B, bf16) = 2 MiB -> 27,648 blocks
    gib = 1 << 30
    assert num_gpu_blocks(80 * gib, 0.9, 16 * gib, 2 * gib, 2 << 20) == 27648
    # a partial block does not count; nothing left is zero, never negative
    assert num_gpu_blocks(10_000, 1.0, 0, 0, 3000) == 3
    assert num_gpu_blocks(10 * gib, 0.5, 16 * gib, 0, 2 << 20) == 0


# --------------------------------------------------------------------------------------------
# `simserve profile`


def test_simserve_profile_forwards_to_the_profiler(tmp_path, capsys):
    from simserve.cli import main as simserve_main
    rc = simserve_main(["profile", "--model", "no-such-model", "--device", "cpu", "--out",
                        str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert rc == 2 and "profiler: error: --model: unknown name 'no-such-model'" in err
    with pytest.raises(SystemExit) as info:
        simserve_main(["profile", "--help"])
    assert info.value.code == 0 and "usage: simserve profile" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--model", "tiny-llama-45m", "--out", "p.json"], "the following arguments are required: "
                                                       "--device"),
    (["--model", "tiny-llama-45m", "--device", "cpu", "--out", "p.json", "--seed", "abc"],
     "argument --seed: invalid int value: 'abc'"),
    (["--model", "tiny-llama-45m", "--device", "tpu", "--out", "p.json"], "--device"),
])
def test_simserve_profile_usage_errors_are_one_line(capsys, argv, words):
    # argparse printed its whole usage block (eight lines) above the error
    from simserve.cli import main as simserve_main
    with pytest.raises(SystemExit) as info:
        simserve_main(["profile", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert info.value.code == 2 and len(err) == 1
    assert err[0].startswith("error: simserve profile: ") and words in err[0]
    assert err[0].endswith("(see simserve profile --help)")


def test_simserve_profile_without_torch_says_how_to_install(monkeypatch, capsys):
    import importlib.util
    from simserve.cli import main as simserve_main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    assert simserve_main(["profile", "--model", "tiny-llama-45m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # README's CPU-safe install line (the CPU wheel first), not a bare '.[profile]' that pulls
    # torch's CUDA build on Linux
    assert err == ["error: simserve profile needs torch, which is not installed; on a CPU-only "
                   "machine install the CPU wheel first, pip install torch==2.13.0 --index-url "
                   "https://download.pytorch.org/whl/cpu, then pip install -e '.[profile]' (with "
                   "a GPU: pip install -e '.[profile]' alone, which takes torch's CUDA build)"]
    readme = (REPO / "README.md").read_text()
    assert "pip install torch==2.13.0 --index-url\nhttps://download.pytorch.org/whl/cpu" in readme


def test_python_m_profiler_without_torch_says_how_to_install(monkeypatch, capsys):
    # docs/profiler.md's command, run without torch: a 14-line ModuleNotFoundError traceback
    import importlib.util
    from profiler.cli import main as profiler_main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setitem(sys.modules, "torch", None)        # import torch → ImportError
    assert profiler_main(["--model", "tiny-llama-45m", "--device", "cpu", "--out",
                          "p.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "profiler: error: measuring needs torch, which is not installed; on a CPU-only "
        "machine install the CPU wheel first, pip install torch==2.13.0")
    with pytest.raises(SystemExit) as info:                # its help needs none
        profiler_main(["--help"])
    assert info.value.code == 0 and "--model" in capsys.readouterr().out


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_simserve_profile_help_needs_no_torch(monkeypatch, capsys, flag):
    import importlib.util
    from simserve.cli import main as simserve_main
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setitem(sys.modules, "torch", None)        # import torch → ImportError
    with pytest.raises(SystemExit) as info:
        simserve_main(["profile", flag])
    out = capsys.readouterr().out
    assert info.value.code == 0 and "usage: simserve profile" in out and "--model" in out


def test_importing_simserve_cli_does_not_import_torch():
    code = ("import sys, simserve, simserve.cli; simserve.cli._parser(); "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_context_axes_stop_at_max_model_len():
    """No sequence of the model gets longer than max_model_len, so the context axes end
    there, with that length itself measured (the CLI defaults it to the card's
    max_position_embeddings)."""
    from profiler.measure import GRIDS, Options
    full = GRIDS["full"]
    g = Options(grid="full", max_model_len=1000).grid_spec
    assert g.prefill_ctx == tuple(sorted({v for v in full.prefill_ctx if v <= 1000} | {1000}))
    assert g.decode_ctx == tuple(sorted({v for v in full.decode_ctx if v <= 1000} | {1000}))
    assert g.heldout_max_ctx == 1000
    assert g.decode_batch == full.decode_batch and g.prefill_chunk == full.prefill_chunk
    assert Options(grid="full").grid_spec == full
    with pytest.raises(ValueError, match="max_model_len"):
        Options(max_model_len=0)


def test_rounds_interleave_a_family_and_keep_whole_steps():
    """Timer.rounds: every step once per round in a shuffled order, prepare right before each
    run, warm-up rounds dropped, and each step's whole time (the sum of its parts) kept."""
    from profiler.measure import WHOLE_STEP, Timer
    ticks = iter(range(10**6))
    clock = lambda: float(next(ticks))     # noqa: E731  each reading one second later
    timer = Timer(torch.device("cpu"), warmup=2, repeats=5, budget_s=1e9, clock=clock)
    calls: list[tuple[str, int]] = []

    def step(i: int, parts: int):
        def prepare():
            calls.append(("prepare", i))

        def run(sections):
            assert calls[-1] == ("prepare", i)     # its own metadata, right before it
            calls.append(("run", i))
            sections.start()
            for p in range(parts):
                sections.mark(f"part{p}")
        return prepare, run

    rounds_seen: list[tuple[int, int]] = []
    out = timer.rounds([step(i, parts=i + 1) for i in range(6)], seed=3,
                       on_round=lambda done, total: rounds_seen.append((done, total)))
    assert rounds_seen == [(r, 7) for r in range(1, 8)]
    runs = [i for kind, i in calls if kind == "run"]
    orders = [runs[k:k + 6] for k in range(0, len(runs), 6)]
    assert len(orders) == 7 and all(sorted(o) == list(range(6)) for o in orders)
    assert len({tuple(o) for o in orders}) > 1                # shuffled, not one fixed order
    for i, stats in enumerate(out):
        assert set(stats) == {f"part{p}" for p in range(i + 1)} | {WHOLE_STEP}
        assert all(s.n == 5 for s in stats.values())          # warm-up rounds not kept
        assert all(s.median == 1.0 for name, s in stats.items() if name != WHOLE_STEP)
        assert stats[WHOLE_STEP].median == i + 1              # one second per part


def test_warm_rounds_run_each_step_twice_in_a_row_and_keep_the_second():
    from profiler.measure import WHOLE_STEP, Timer
    ticks = iter(range(10**6))
    timer = Timer(torch.device("cpu"), warmup=1, repeats=3, budget_s=1e9,
                  clock=lambda: float(next(ticks)))
    runs: list[int] = []

    def step(i: int):
        def run(sections):
            runs.append(i)
            sections.start()
            sections.mark("part")
            if len(runs) % 2:          # the first of each pair is slow: it must not count
                sections.mark("part")
        return (lambda: None), run

    out = timer.rounds([step(i) for i in range(4)], seed=1, warm=True)
    assert len(runs) == 2 * 4 * 4                            # 4 rounds, 4 steps, twice each
    assert all(runs[k] == runs[k + 1] for k in range(0, len(runs), 2))   # pairs in a row
    for stats in out:
        assert stats[WHOLE_STEP].n == 3 and stats[WHOLE_STEP].median == 1.0


triton_missing = not __import__("profiler.triton_decode", fromlist=["x"]).triton_available()
TRITON_CHECK = """
import sys, torch
from profiler import attention as attn
heads, kv_heads = int(sys.argv[1]), int(sys.argv[2])
for programs in (1, 64):
    backend = attn.TritonDecodeAttention("cpu", heads, kv_heads, 32, compile=False,
                                         programs=programs)
    print(programs, attn.self_check(backend, [(13, 37)], [5, 40, 17, 200, 1], 16, heads,
                                    kv_heads, 32, torch.float32, "cpu"))
"""


@pytest.mark.skipif(triton_missing, reason="triton is not installed (it ships with torch's "
                                           "CUDA builds, not with the CPU wheel)")
@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (7, 1), (4, 4)])
def test_triton_split_kv_decode_matches_dense_in_the_interpreter(heads, kv_heads):
    """Our split-KV paged decode kernel, run by Triton's interpreter on CPU tensors (fp32: the
    interpreter's bf16 dot is wrong), against dense attention, with one split and with many;
    the prefill chunk in the same step goes through Flex. A fresh process: the interpreter is
    chosen when triton is imported."""
    import os
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", TRITON_CHECK, str(heads), str(kv_heads)],
                       capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    errs = {int(a): float(b) for a, b in (line.split() for line in r.stdout.split("\n")
                                            if line.strip())}
    assert set(errs) == {1, 64}
    assert all(e < attn.TOLERANCE[torch.float32] for e in errs.values()), errs


def test_triton_decode_splits_keys_for_few_sequences_and_not_for_many():
    from profiler.triton_decode import BLOCK_N, plan_decodes
    tables = torch.zeros((1, 600), dtype=torch.int32)
    one = plan_decodes(tables, [8192], 32, 8, 128, 264, "cpu")
    assert one.splits > 1 and one.keys_per_split % BLOCK_N == 0
    assert one.splits * one.keys_per_split >= 8192 > (one.splits - 1) * one.keys_per_split
    many = plan_decodes(torch.zeros((256, 600), dtype=torch.int32), [8192] * 256, 32, 8, 128,
                        264, "cpu")
    assert many.splits == 1 and many.keys_per_split >= 8192
    short = plan_decodes(tables, [10], 32, 8, 128, 264, "cpu")
    assert short.splits == 1 and one.acc.shape == (one.splits, 32, 128)


def test_triton_backend_without_triton_is_one_clear_error(monkeypatch):
    from profiler import triton_decode
    monkeypatch.setattr(triton_decode, "triton_available", lambda: False)
    with pytest.raises(attn.BackendError, match="needs the triton package"):
        attn.make_backend("triton", "cpu", TOY, torch.float32)
