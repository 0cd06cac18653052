"""A split-KV paged decode kernel in Triton: one query token per sequence, K/V read in place
through the block table, each sequence's keys cut into splits that run side by side, then one
combine. Written here (not copied) after the split-KV ("flash-decoding") idea that vLLM's and
FlashInfer's decode kernels use: a small batch at long context is otherwise one long serial walk
per sequence and KV head, far from the GPU's bandwidth (docs/profiler.md, the H100 runs).

Grid ``(sequences, kv_heads, splits)``. A program loads the query heads that share its KV head
(``group`` of them, padded with masked rows to at least 16 for ``tl.dot``), walks its split's
keys ``BLOCK_N`` at a time (several pages: each key's page comes from the block table), keeps a
running max, sum and accumulator (online softmax, fp32), and writes them as a partial. The
combine rescales the partials to the largest max and divides: plain torch ops.

``TRITON_INTERPRET=1`` runs the kernel on CPU tensors (how the tests check it against dense
attention); on CUDA it compiles like any Triton kernel and launches can be captured in a CUDA
graph (every launch argument is fixed once a step is prepared).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

BLOCK_N = 64          # keys a program handles per iteration (4 pages of 16)


def triton_available() -> bool:
    """Whether triton can be imported (found, not imported: importing it fixes whether its
    interpreter mode, TRITON_INTERPRET, is on)."""
    import importlib.util
    return importlib.util.find_spec("triton") is not None


@functools.cache
def _kernel():
    """The Triton kernel, built on first use (importing triton is slow, and optional)."""
    import triton
    import triton.language as tl

    @triton.jit
    def paged_decode_split(Q, K, V, TABLES, LENS, ACC, M, L,
                           stride_qt, stride_qh, stride_kb, stride_kp, stride_kh,
                           stride_tab, stride_as, stride_ah, stride_ms,
                           scale, keys_per_split,
                           GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                           HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, BLOCK: tl.constexpr):
        seq = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        n_splits = tl.num_programs(2)
        seq_len = tl.load(LENS + seq)
        lo = split * keys_per_split
        hi = tl.minimum(lo + keys_per_split, seq_len)
        g = tl.arange(0, BLOCK_G)
        d = tl.arange(0, HEAD_DIM)
        rows = g < GROUP
        head = kvh * GROUP + g
        q = tl.load(Q + seq * stride_qt + head[:, None] * stride_qh + d[None, :],
                    mask=rows[:, None], other=0.0)
        m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
        for start in range(lo, hi, BLOCK):
            pos = start + tl.arange(0, BLOCK)
            keep = pos < hi
            page = tl.load(TABLES + seq * stride_tab + pos // PAGE, mask=keep, other=0)
            at = page.to(tl.int64) * stride_kb + (pos % PAGE) * stride_kp + kvh * stride_kh
            k = tl.load(K + at[:, None] + d[None, :], mask=keep[:, None], other=0.0)
            v = tl.load(V + at[:, None] + d[None, :], mask=keep[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(keep[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        part = seq * n_splits + split
        tl.store(ACC + part * stride_as + head[:, None] * stride_ah + d[None, :], acc,
                 mask=rows[:, None])
        tl.store(M + part * stride_ms + head, m_i, mask=rows)
        tl.store(L + part * stride_ms + head, l_i, mask=rows)

    return paged_decode_split


@dataclass
class DecodePlan:
    """What a step's decodes need, built once per step (outside timings)."""

    tables: torch.Tensor          # [D, W] int32, each decode's block table
    lens: torch.Tensor            # [D] int32, keys each decode attends (context + the new one)
    splits: int
    keys_per_split: int
    acc: torch.Tensor             # [D * splits, H, head_dim] fp32 partials
    m: torch.Tensor               # [D * splits, H]
    l: torch.Tensor


def plan_decodes(tables: torch.Tensor, lens: list[int], heads: int, kv_heads: int,
                 head_dim: int, programs: int, device: Any) -> DecodePlan:
    """Split the decodes' keys so that about ``programs`` (sequence, KV head, split) programs
    run (twice the multiprocessors, say): many splits for few sequences, one for a large batch;
    never a split shorter than ``BLOCK_N`` keys."""
    longest = max(lens)
    splits = max(1, min(-(-programs // (len(lens) * kv_heads)), -(-longest // BLOCK_N)))
    per = -(-longest // splits)
    per = -(-per // BLOCK_N) * BLOCK_N
    splits = -(-longest // per)
    n = len(lens) * splits
    return DecodePlan(tables=tables.to(device=device, dtype=torch.int32).contiguous(),
                      lens=torch.tensor(lens, dtype=torch.int32, device=device),
                      splits=splits, keys_per_split=per,
                      acc=torch.empty((n, heads, head_dim), dtype=torch.float32, device=device),
                      m=torch.empty((n, heads), dtype=torch.float32, device=device),
                      l=torch.empty((n, heads), dtype=torch.float32, device=device))


def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 plan: DecodePlan) -> torch.Tensor:
    """Attention of ``q [D, H, head_dim]`` (one token per decode) over the paged cache
    ``[blocks, page, kv_heads, head_dim]``: ``[D, H, head_dim]`` in ``q``'s dtype."""
    n, heads, dim = q.shape
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    if k_cache.stride(3) != 1 or q.stride(2) != 1:
        raise ValueError("paged_decode needs the head dimension contiguous")
    _kernel()[(n, kv_heads, plan.splits)](
        q, k_cache, v_cache, plan.tables, plan.lens, plan.acc, plan.m, plan.l,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        plan.tables.stride(0), plan.acc.stride(0), plan.acc.stride(1), plan.m.stride(0),
        1.0 / math.sqrt(dim), plan.keys_per_split,
        GROUP=group, BLOCK_G=max(16, 1 << (group - 1).bit_length()), HEAD_DIM=dim,
        PAGE=page, BLOCK=BLOCK_N)
    m = plan.m.view(n, plan.splits, heads)
    top = m.max(dim=1, keepdim=True).values
    w = torch.exp(m - top)                                     # empty splits: exp(-inf) = 0
    total = (plan.l.view(n, plan.splits, heads) * w).sum(dim=1)
    out = (plan.acc.view(n, plan.splits, heads, dim) * w[..., None]).sum(dim=1)
    return (out / total[..., None]).to(q.dtype)
