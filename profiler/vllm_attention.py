"""Attention through vLLM's own FlashAttention kernels (``--attention vllm_fa``), so that a
profile measures exactly the attention the engine runs on Hopper.

vLLM's CUDA wheel ships FlashAttention as ``vllm.vllm_flash_attn`` (FA2 and FA3 extensions).
Read in vLLM 0.24.0, ``vllm/v1/attention/backends/flash_attn.py``:

* ``FlashAttentionMetadataBuilder.build`` makes one metadata per step for all its sequences,
  prefill chunks and decodes together: ``query_start_loc`` (``cu_seqlens_q``), ``seq_lens``
  (``seqused_k``: context + new tokens), ``max_query_len``, ``max_seq_len``, the block table,
  and with FA3 an ahead-of-time ``scheduler_metadata`` from ``get_scheduler_metadata(...,
  page_size=block_size, causal=True, num_splits=max_num_splits)``. With full CUDA graphs (the
  default ``FULL_AND_PIECEWISE``) ``max_num_splits`` is
  ``attention_config.flash_attn_max_num_splits_for_cuda_graph`` (32) for steps of at most
  ``max_cudagraph_capture_size`` tokens (``min(2 * max_num_seqs, 512, max_num_batched_tokens)``)
  and 0 (the kernel's own heuristic) above; without FA3 (FA2 takes no split count) always 0.
* ``FlashAttentionImpl.forward`` makes one ``flash_attn_varlen_func(q, k_cache, v_cache,
  out=..., cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale, causal=True,
  block_table, scheduler_metadata, fa_version, num_splits)`` call per layer; the KV cache of a
  layer is ``[num_blocks, block_size, kv_heads, head_dim]`` for K and for V, which is
  :class:`profiler.layers.PagedKVCache`'s layout.
* ``fa_utils.get_flash_attn_version``: FA3 on compute capability 9.x when its extension
  loads, else FA2.

This backend builds the same arguments in ``prepare`` (outside the timings, as the engine builds
its metadata once per step) and makes the same call per layer. It needs CUDA and an importable
vLLM CUDA build (on the lent GPU machine: ``benchmarks/gpu_stage_vllm.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from profiler.layers import PagedKVCache, StepMeta

# vLLM 0.24.0's defaults (config/attention.py, config/vllm.py): see the module docstring
MAX_SPLITS_FOR_CUDA_GRAPH = 32


def max_cudagraph_size(max_num_seqs: int = 1024, max_num_batched_tokens: int = 8192) -> int:
    """vLLM's default ``max_cudagraph_capture_size`` (no speculative tokens)."""
    return min(max_num_seqs * 2, 512, max_num_batched_tokens)


@dataclass(frozen=True)
class FaArgs:
    """One step's arguments to ``flash_attn_varlen_func``, as vLLM's metadata builder makes
    them (tensors on the step's device)."""

    cu_seqlens_q: torch.Tensor       # [S + 1] int32: query offsets, prefill chunks first
    seqused_k: torch.Tensor          # [S] int32: context + new tokens of each sequence
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor        # [S, max_blocks] int32
    num_splits: int                  # 0: the kernel's own heuristic


def fa_args(meta: StepMeta, cudagraph_size: int,
            max_splits: int = MAX_SPLITS_FOR_CUDA_GRAPH) -> FaArgs:
    """The step's kernel arguments (plain torch: tested on CPU)."""
    dev = meta.block_tables.device
    return FaArgs(
        cu_seqlens_q=torch.tensor(meta.query_start, dtype=torch.int32, device=dev),
        seqused_k=torch.tensor(meta.seq_lens, dtype=torch.int32, device=dev),
        max_seqlen_q=max(meta.query_lens), max_seqlen_k=max(meta.seq_lens),
        block_table=meta.block_tables.to(torch.int32),
        num_splits=max_splits if meta.num_tokens <= cudagraph_size else 0)


class VllmFlashAttention:
    """``flash_attn_varlen_func`` from vLLM's wheel over the paged cache (see the module
    docstring). FA3 on Hopper, FA2 elsewhere, as vLLM chooses."""

    name = "vllm_fa"
    compiled = False
    fallback: str | None = None

    def __init__(self, device: Any, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, cudagraph_size: int | None = None):
        from profiler.attention import BackendError
        device = torch.device(device)
        if device.type != "cuda":
            raise BackendError("vllm_fa runs vLLM's CUDA FlashAttention kernels: CUDA only")
        try:
            from vllm.vllm_flash_attn import flash_attn_interface as fai
        except ImportError as e:
            raise BackendError(f"vLLM's flash-attention is not importable ({e}); on the lent "
                               f"GPU machine stage it with benchmarks/gpu_stage_vllm.py") \
                from None
        major = torch.cuda.get_device_capability(device)[0]
        self.version = 3 if major == 9 and fai.is_fa_version_supported(3) else 2
        if not fai.is_fa_version_supported(self.version):
            raise BackendError(f"vLLM's FA{self.version} is not supported here: "
                               f"{fai.fa_version_unsupported_reason(self.version)}")
        self._fai = fai
        self.heads, self.kv_heads, self.head_dim, self.dtype = num_heads, num_kv_heads, \
            head_dim, dtype
        self.cudagraph_size = max_cudagraph_size() if cudagraph_size is None else cudagraph_size
        self.compile_seconds: dict[str, float] = {}
        self.device = device

    def prepare(self, meta: StepMeta, num_cache_blocks: int) -> None:
        # vLLM bounds the splits only with FA3's ahead-of-time scheduler (FA2 takes none)
        a = fa_args(meta, self.cudagraph_size,
                    MAX_SPLITS_FOR_CUDA_GRAPH if self.version == 3 else 0)
        sched = None
        if self.version == 3:           # FA3's ahead-of-time tile scheduler, as vLLM builds it
            sched = self._fai.get_scheduler_metadata(
                batch_size=meta.num_seqs, max_seqlen_q=a.max_seqlen_q,
                max_seqlen_k=a.max_seqlen_k, num_heads_q=self.heads,
                num_heads_kv=self.kv_heads, headdim=self.head_dim, cache_seqlens=a.seqused_k,
                qkv_dtype=self.dtype, cu_seqlens_q=a.cu_seqlens_q, page_size=meta.block_size,
                causal=True, window_size=(-1, -1), num_splits=a.num_splits)
        meta.backend_state["vllm_fa"] = (a, sched)

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, meta: StepMeta) -> torch.Tensor:
        a, sched = meta.backend_state["vllm_fa"]
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)    # contiguous, as vLLM's
        self._fai.flash_attn_varlen_func(
            q=q, k=cache.k, v=cache.v, out=out, cu_seqlens_q=a.cu_seqlens_q,
            max_seqlen_q=a.max_seqlen_q, seqused_k=a.seqused_k, max_seqlen_k=a.max_seqlen_k,
            softmax_scale=self.head_dim ** -0.5, causal=True, block_table=a.block_table,
            scheduler_metadata=sched, fa_version=self.version, num_splits=a.num_splits)
        return out


def vllm_fa_available() -> bool:
    """Whether vLLM's flash-attention extension imports (CUDA builds of vLLM only)."""
    try:
        from vllm.vllm_flash_attn import flash_attn_interface as fai
    except ImportError:
        return False
    return bool(getattr(fai, "FA3_AVAILABLE", False) or getattr(fai, "FA2_AVAILABLE", False))
