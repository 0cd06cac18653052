"""Attention over a paged KV cache: four interchangeable backends.

Every backend is called as ``backend(q, cache, meta) -> out`` with ``q`` and ``out`` packed
``[T, heads, head_dim]`` (prefill chunks first, then decodes, as in :class:`StepMeta`) and K/V read
from the cache through the block tables. ``backend.prepare(meta, num_cache_blocks)`` builds the
per-step index structures once; it is outside every timing, as an engine builds its attention
metadata once per step and shares it across layers.

* ``reference``: gathers each sequence's blocks into contiguous K/V and calls SDPA, sequence by
  sequence, with a bottom-right causal mask for a chunk after context (query ``i`` at position
  ``ctx + i``); on CUDA the decodes go as one padded batch with a key-padding mask instead.
* ``flex``: FlexAttention reading the cache in place. The whole cache is one long K/V sequence
  (``num_blocks * block_size``); a BlockMask lists, per sequence, exactly its physical pages
  (pages fully visible to a query tile as "full" blocks, the diagonal ones as partial blocks
  checked by ``mask_mod``), so the kernel never touches another sequence's pages. Compiled with
  torch.compile once per shape family (batch and query length padded to powers of two, so a grid
  of points reuses a few compiled kernels); falls back to eager, and says so, when compile fails.
* ``triton``: prefill chunks as ``flex``; decodes through our split-KV paged decode kernel
  (:mod:`profiler.triton_decode`).
* ``flashinfer``: FlashInfer's paged prefill/decode wrappers on CUDA, when importable. The page
  table conversion (:func:`flashinfer_page_table`) is plain torch and tested on CPU.
* ``vllm_fa``: vLLM's own FlashAttention (FA3 on Hopper) called as vLLM's engine calls it
  (:mod:`profiler.vllm_attention`), on CUDA with a vLLM CUDA build importable.
"""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable

import torch
import torch.nn.functional as F

from profiler.layers import PagedKVCache, StepMeta, gather_slots

BACKENDS = ("reference", "flex", "triton", "flashinfer", "vllm_fa")


class BackendError(Exception):
    """A backend that cannot run here (not importable, no device, too much memory)."""


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


# --------------------------------------------------------------------------------------------
# Reference: gather + SDPA


class ReferenceAttention:
    """Gather whole blocks through the block table, then torch SDPA (no fused paged kernel).

    Prefill chunks run one by one. Decodes run one by one on CPU too: SDPA without a mask takes
    CPU's flash kernel, about twice as fast as one padded batch with a key-padding mask (which
    falls to the unfused path). On CUDA decodes run as that one padded batch: a loop of tiny
    kernels would time the launches, not the attention.
    """

    name = "reference"
    compiled = False
    fallback: str | None = None

    def __init__(self, batch_decodes: bool | None = None) -> None:
        self.compile_seconds: dict[str, float] = {}
        self.batch_decodes = batch_decodes          # None: batch on CUDA, one by one on CPU

    def prepare(self, meta: StepMeta, num_cache_blocks: int) -> None:
        dev = meta.block_tables.device
        p = meta.num_prefills
        batch_decodes = dev.type == "cuda" if self.batch_decodes is None else self.batch_decodes
        one_by_one = range(p if batch_decodes else meta.num_seqs)
        seqs = []
        for s in one_by_one:
            n, ctx, q_len = meta.seq_lens[s], meta.ctx_lens[s], meta.query_lens[s]
            blocks = meta.block_tables[s, :meta.num_blocks_per_seq[s]].long()
            # bottom-right causal: query i (position ctx + i) sees keys 0 .. ctx + i.
            # ctx == 0 is SDPA's own (top-left) causal; one query sees every key: no mask.
            if ctx == 0:
                mask, causal = None, q_len > 1
            elif q_len == 1:
                mask, causal = None, False
            else:
                mask = (torch.arange(n, device=dev)[None, :]
                        <= torch.arange(ctx, n, device=dev)[:, None])
                causal = False
            seqs.append((meta.query_start[s], meta.query_start[s + 1], blocks, n, mask, causal))
        batch = None
        if len(one_by_one) < meta.num_seqs:
            width = max(meta.num_blocks_per_seq[p:])
            # padded rows of the block table point at block 0; the key mask hides them
            blocks = meta.block_tables[p:, :width].long()
            lens = meta.seq_lens_t[p:]
            valid = torch.arange(width * meta.block_size, device=dev)[None, :] < lens[:, None]
            batch = (meta.query_start[p], blocks, valid[:, None, None, :])
        meta.backend_state["reference"] = (seqs, batch)

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, meta: StepMeta) -> torch.Tensor:
        seqs, batch = meta.backend_state["reference"]
        hkv, d = cache.k.shape[2], cache.k.shape[3]
        gqa = q.shape[1] != hkv
        out = torch.empty_like(q)
        for start, end, blocks, n, mask, causal in seqs:
            qs = q[start:end].transpose(0, 1).unsqueeze(0)              # [1, H, L, D]
            k = cache.k[blocks].view(-1, hkv, d)[:n].transpose(0, 1).unsqueeze(0)
            v = cache.v[blocks].view(-1, hkv, d)[:n].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, is_causal=causal,
                                               enable_gqa=gqa)
            out[start:end] = o[0].transpose(0, 1)
        if batch is not None:
            start, blocks, valid = batch
            rows = blocks.shape[0]
            qd = q[start:].unsqueeze(2)                                 # [B, H, 1, D]
            k = cache.k[blocks].view(rows, -1, hkv, d).transpose(1, 2)  # [B, Hkv, n, D]
            v = cache.v[blocks].view(rows, -1, hkv, d).transpose(1, 2)
            o = F.scaled_dot_product_attention(qd, k, v, attn_mask=valid, enable_gqa=gqa)
            out[start:] = o.squeeze(2)
        return out


# --------------------------------------------------------------------------------------------
# FlexAttention over the cache in place


class _FlexFamily:
    """State shared by every step of one shape family: the compiled-kernel key and the tensors
    ``mask_mod`` reads. The ``mask_mod`` closure is created once per family and its tensors are
    refilled in place each step, so torch.compile sees the same function and shapes and does
    not recompile. Hence: run a step right after preparing it; preparing another step of the same
    family overwrites what the first one's ``mask_mod`` reads."""

    def __init__(self, batch: int, q_len: int, num_pages: int, block_size: int, device: Any):
        self.batch, self.q_len, self.num_pages = batch, q_len, num_pages
        self.page_owner = torch.full((num_pages,), -1, dtype=torch.int32, device=device)
        self.page_logical = torch.zeros((num_pages,), dtype=torch.int32, device=device)
        self.q_pos = torch.full((batch, q_len), -1, dtype=torch.int32, device=device)
        owner, logical, q_pos, bs = self.page_owner, self.page_logical, self.q_pos, block_size

        def mask_mod(b, h, q_idx, kv_idx):
            page = kv_idx // bs
            key_pos = logical[page] * bs + kv_idx % bs
            return (owner[page] == b) & (key_pos <= q_pos[b, q_idx])

        self.mask_mod = mask_mod


class FlexPagedAttention:
    name = "flex"
    Q_TILE = 128      # BlockMask query tile; the kernel skips tiles with no pages

    def __init__(self, device: Any, compile: bool = True, eager_limit_bytes: int = 2 << 30,
                 heads_per_kv: int = 1, short_split: bool | None = None,
                 pad_groups: bool | None = None):
        from torch.nn.attention.flex_attention import BlockMask, flex_attention
        self._flex = flex_attention
        self._block_mask_cls = BlockMask
        self.device = torch.device(device)
        self.compiled = compile
        self.fallback: str | None = None
        self.compile_seconds: dict[str, float] = {}
        self.eager_limit_bytes = eager_limit_bytes
        self.heads_per_kv = heads_per_kv
        cuda = self.device.type == "cuda"
        # Short queries (< Q_TILE: decodes, small chunks) go to Flex's decoding kernel, which
        # splits a sequence's KV among SPLIT_KV programs (more for small batches). With "full"
        # blocks in the mask it cuts the whole KV length (here: the whole cache) into the
        # splits, so all of one sequence's pages land in one split and run serially
        # (torch/_inductor/kernel/flex/templates/flex_decode.py.jinja, TILE_KV under
        # HAS_FULL_BLOCKS); with partial blocks only, it cuts the sequence's own pages. Seen on
        # an H100: one 8,192-token decode 0.83 ms a layer with full blocks. So on CUDA short
        # queries get partial blocks only (mask_mod on every page). CPU kernels need full blocks.
        self.short_split = cuda if short_split is None else short_split
        # That kernel also needs a power-of-two number of query heads per KV head; otherwise
        # Flex falls back to its general kernel, one program per query head, each reading its
        # K/V again (Qwen2.5-7B, 7 per KV head: 13.6 ms a layer for 256 x 8,192 decodes against
        # a 1.4 ms bandwidth floor). On CUDA short queries get zero query heads added to each
        # group up to the next power of two (their outputs dropped).
        self.pad_groups = cuda if pad_groups is None else pad_groups
        self.group = (_next_pow2(heads_per_kv) if self.pad_groups else heads_per_kv)
        self._families: dict[tuple, _FlexFamily] = {}
        self._seen: set[str] = set()
        self._compiled_fn: Callable | None = None
        if compile:
            import torch._dynamo.config as dynamo_config
            # one compiled kernel per family, and many families in a full grid: raise the
            # recompile limit (fullgraph=True turns hitting it into an error, not silent eager)
            for knob in ("recompile_limit", "cache_size_limit"):
                if hasattr(dynamo_config, knob):
                    setattr(dynamo_config, knob, max(256, getattr(dynamo_config, knob)))
            self._compiled_fn = torch.compile(flex_attention, dynamic=False, fullgraph=True)

    def short(self, q_len: int) -> bool:
        """Whether queries of this (padded) length run Flex's decoding kernel: it folds a KV
        head's query heads into the rows of one block of ``BLOCK_M = next_pow2(q_len * heads
        per KV head)`` rows (at least 16), which must divide the BlockMask's query tile
        (torch/_inductor/kernel/flex/flex_decoding.py). Up to one 128-row tile it does; longer
        folds are sent to the general kernel (``cuda_kernel_options``): on an H100 the
        decoding kernel with 256-row blocks (33-64-token chunks of an 8B model, 4 heads per KV
        head) cost 3.6-4.6 ms a layer at contexts of 1,024 and more, against 0.28 ms for
        32-token chunks."""
        return q_len * self.group <= self.Q_TILE

    def kernel_options(self, block_mask, q_len: int) -> dict[str, Any] | None:
        if self.device.type != "cuda":
            return None        # CPU kernels take no Triton block options
        return cuda_kernel_options(block_mask.BLOCK_SIZE[1], self.short(q_len))

    # ---- per step

    def prepare(self, meta: StepMeta, num_cache_blocks: int) -> None:
        groups = []
        p = meta.num_prefills
        for kind, seqs in (("prefill", range(0, p)), ("decode", range(p, meta.num_seqs))):
            if len(seqs):
                groups.append(self._prepare_group(kind, list(seqs), meta, num_cache_blocks))
        meta.backend_state["flex"] = groups

    def _prepare_group(self, kind: str, seqs: list[int], meta: StepMeta, num_pages: int):
        bs, dev = meta.block_size, meta.block_tables.device
        batch = len(seqs)
        q_len = max(meta.query_lens[s] for s in seqs)
        if self.compiled:  # pad to powers of two so nearby shapes share one compiled kernel
            batch, q_len = _next_pow2(batch), _next_pow2(q_len)
        key = (kind, batch, q_len, num_pages)
        fam = self._families.get(key)
        if fam is None:
            fam = self._families[key] = _FlexFamily(batch, q_len, num_pages, bs, dev)
        tile = self.Q_TILE
        n_tiles = -(-q_len // tile)
        partial_only = self.short_split and self.short(q_len)

        # per-row query gather (padding rows/columns point at token 0 and are dropped after)
        q_index = torch.zeros((batch, q_len), dtype=torch.long)
        valid = torch.zeros((batch, q_len), dtype=torch.bool)
        q_pos = torch.full((batch, q_len), -1, dtype=torch.int32)
        owner = torch.full((num_pages,), -1, dtype=torch.int32)
        logical = torch.zeros((num_pages,), dtype=torch.int32)
        kv_num = torch.zeros((batch, 1, n_tiles), dtype=torch.int32)
        kv_idx = torch.zeros((batch, 1, n_tiles, num_pages), dtype=torch.int32)
        full_num = torch.zeros((batch, 1, n_tiles), dtype=torch.int32)
        full_idx = torch.zeros((batch, 1, n_tiles, num_pages), dtype=torch.int32)
        tables = meta.block_tables.cpu()
        for row, s in enumerate(seqs):
            ql, ctx = meta.query_lens[s], meta.ctx_lens[s]
            start = meta.query_start[s]
            q_index[row, :ql] = torch.arange(start, start + ql)
            valid[row, :ql] = True
            q_pos[row, :ql] = torch.arange(ctx, ctx + ql, dtype=torch.int32)
            pages = tables[s, :meta.num_blocks_per_seq[s]]
            owner[pages.long()] = row
            logical[pages.long()] = torch.arange(len(pages), dtype=torch.int32)
            for t in range(n_tiles):
                lo, hi = t * tile, min((t + 1) * tile, ql) - 1
                if lo > hi:
                    break
                # page i is fully visible to the tile if its last key <= the tile's first query
                n_full = 0 if partial_only else (ctx + lo + 1) // bs
                n_any = (ctx + hi) // bs + 1
                full_num[row, 0, t] = n_full
                full_idx[row, 0, t, :n_full] = pages[:n_full]
                kv_num[row, 0, t] = n_any - n_full
                kv_idx[row, 0, t, :n_any - n_full] = pages[n_full:n_any]
        fam.q_pos.copy_(q_pos)
        fam.page_owner.copy_(owner)
        fam.page_logical.copy_(logical)
        full = (None, None) if partial_only else (full_num.to(dev), full_idx.to(dev))
        block_mask = self._block_mask_cls.from_kv_blocks(
            kv_num.to(dev), kv_idx.to(dev), *full,
            BLOCK_SIZE=(tile, bs), mask_mod=fam.mask_mod,
            seq_lengths=(q_len, num_pages * bs))
        # the real (row, query) cells and their tokens, as index lists: no boolean indexing
        # at run time (a data-dependent shape would stall the host, and break CUDA graphs)
        rows, cols = valid.nonzero(as_tuple=True)
        return key, q_index.to(dev), (rows.to(dev), cols.to(dev)), \
            q_index[rows, cols].to(dev), block_mask

    # ---- per layer

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, meta: StepMeta) -> torch.Tensor:
        return self._run_groups(q, cache, meta.backend_state["flex"], torch.empty_like(q))

    def _run_groups(self, q: torch.Tensor, cache: PagedKVCache, groups: list,
                    out: torch.Tensor) -> torch.Tensor:
        hkv, d = cache.k.shape[2], cache.k.shape[3]
        # the whole cache as one K/V sequence of num_blocks * block_size keys, batch 1 broadcast
        k = cache.k.view(1, -1, hkv, d).transpose(1, 2)
        v = cache.v.view(1, -1, hkv, d).transpose(1, 2)
        for key, q_index, cells, tokens, block_mask in groups:
            qg = q[q_index].permute(0, 2, 1, 3)                         # [B, H, Lq, D]
            pad = self.group - self.heads_per_kv if self.short(key[2]) else 0
            if pad:     # zero query heads up to a power of two per KV head (see __init__)
                b, h, lq, _ = qg.shape
                qg = F.pad(qg.reshape(b, hkv, h // hkv, lq, d), (0, 0, 0, 0, 0, pad))
                qg = qg.reshape(b, hkv * self.group, lq, d)
            og = self._run(key, qg, k, v, block_mask)
            if pad:
                og = og.reshape(b, hkv, self.group, lq, d)[:, :, :h // hkv].reshape(b, h, lq, d)
            out[tokens] = og.permute(0, 2, 1, 3)[cells]
        return out

    def _run(self, key: tuple, q, k, v, block_mask) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        if self.compiled:
            name = f"{key[0]} b{key[1]} q{key[2]} pages{key[3]}"
            first = name not in self._seen
            t0 = time.perf_counter()
            try:
                out = self._compiled_fn(q, k, v, block_mask=block_mask, enable_gqa=gqa,
                                        kernel_options=self.kernel_options(block_mask,
                                                                           key[2]))
            except Exception as e:  # noqa: BLE001 - any compile failure means "use eager"
                if self.device.type == "cuda":
                    if torch.cuda.is_current_stream_capturing():
                        raise        # the CUDA graph's problem: the Timer times it eagerly
                    # eager Flex on a GPU materialises every score: its times would mean
                    # nothing, and the next large point would run out of memory
                    raise BackendError(f"FlexAttention family {name}: torch.compile failed "
                                       f"({_root_cause(e)}); refusing eager Flex on CUDA") \
                        from None
                self.compiled = False
                self.fallback = f"torch.compile failed ({_root_cause(e)}); eager used"
            else:
                if first:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()
                    self._seen.add(name)
                    self.compile_seconds[name] = time.perf_counter() - t0
                return out
        # eager flex materialises the full [B, H, Lq, num_blocks * block_size] score matrix
        need = q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * 4
        if need > self.eager_limit_bytes:
            raise BackendError(f"eager FlexAttention would materialise {need / 2**30:.1f} GiB "
                               f"of scores; use --attention reference"
                               + (f" ({self.fallback})" if self.fallback else ""))
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # "called without torch.compile": we know
            return self._flex(q, k, v, block_mask=block_mask, enable_gqa=gqa)


def cuda_kernel_options(page: int, short: bool) -> dict[str, Any]:
    """Triton options for compiled Flex over pages of ``page`` tokens on CUDA. The kernels walk
    a BlockMask's KV blocks ``BLOCK_N`` keys at a time, and ``BLOCK_N`` must divide the block,
    here one page (16 tokens in vLLM's default): the kernels' own default (64 or 128) does not,
    and nothing would compile. Take the largest power of two up to 64 that divides the page.
    Queries that are not ``short`` (see ``FlexPagedAttention.short``) are kept off the decoding
    kernel."""
    n = 64
    while n > 1 and page % n:
        n //= 2
    return {"BLOCK_N": n} if short else {"BLOCK_N": n, "FORCE_USE_FLEX_ATTENTION": True}


class TritonDecodeAttention(FlexPagedAttention):
    """Prefill chunks through compiled Flex (as ``flex``); decodes through our own split-KV
    paged decode kernel (:mod:`profiler.triton_decode`), which spreads each sequence's keys
    over many programs as vLLM's and FlashInfer's decode kernels do."""

    name = "triton"

    def __init__(self, device: Any, heads: int, kv_heads: int, head_dim: int,
                 compile: bool = True, programs: int | None = None, **flex_options: Any):
        from profiler import triton_decode
        if not triton_decode.triton_available():
            raise BackendError("the triton backend needs the triton package (it comes with "
                               "torch's CUDA builds)")
        super().__init__(device, compile=compile, heads_per_kv=heads // kv_heads,
                         **flex_options)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        if programs is None:   # twice the multiprocessors; a handful on CPU (interpreter)
            programs = (2 * torch.cuda.get_device_properties(self.device).multi_processor_count
                        if self.device.type == "cuda" else 8)
        self.programs = programs
        self._decode = triton_decode

    def prepare(self, meta: StepMeta, num_cache_blocks: int) -> None:
        p = meta.num_prefills
        groups = ([self._prepare_group("prefill", list(range(p)), meta, num_cache_blocks)]
                  if p else [])
        plan = None
        if meta.num_seqs > p:
            plan = self._decode.plan_decodes(meta.block_tables[p:], meta.seq_lens[p:],
                                             self.heads, self.kv_heads, self.head_dim,
                                             self.programs, meta.block_tables.device)
        meta.backend_state["triton"] = (groups, plan, meta.query_start[p])

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, meta: StepMeta) -> torch.Tensor:
        groups, plan, start = meta.backend_state["triton"]
        out = torch.empty_like(q)
        if groups:
            self._run_groups(q, cache, groups, out)
        if plan is not None:
            out[start:] = self._decode.paged_decode(q[start:], cache.k, cache.v, plan)
        return out


def _root_cause(e: BaseException) -> str:
    """``Type: first line`` of the innermost exception (inductor wraps the useful one)."""
    while True:
        inner = getattr(e, "inner_exception", None) or e.__cause__
        if not isinstance(inner, BaseException) or inner is e:
            break
        e = inner
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {lines[0][:200]}" if lines else type(e).__name__


# --------------------------------------------------------------------------------------------
# FlashInfer (CUDA only)


def flashinfer_page_table(meta: StepMeta, seqs: list[int]) -> dict[str, torch.Tensor]:
    """FlashInfer's CSR page table for sequences ``seqs`` of a step:

    ``qo_indptr[i]``  token offset of sequence i's queries (relative to the group)
    ``kv_indptr[i]``  offset of sequence i's pages in ``kv_indices``
    ``kv_indices``    the physical pages, block-table order, concatenated
    ``kv_last_page_len[i]``  tokens used in the sequence's last page (1 .. block_size)
    """
    qo, kv, idx, last = [0], [0], [], []
    tables = meta.block_tables.cpu()
    for s in seqs:
        n_pages = meta.num_blocks_per_seq[s]
        seq_len = meta.seq_lens[s]
        qo.append(qo[-1] + meta.query_lens[s])
        kv.append(kv[-1] + n_pages)
        idx.append(tables[s, :n_pages])
        last.append(seq_len - (n_pages - 1) * meta.block_size)
    i32 = torch.int32
    return {"qo_indptr": torch.tensor(qo, dtype=i32), "kv_indptr": torch.tensor(kv, dtype=i32),
            "kv_indices": torch.cat(idx).to(i32) if idx else torch.zeros(0, dtype=i32),
            "kv_last_page_len": torch.tensor(last, dtype=i32)}


class FlashInferAttention:
    name = "flashinfer"
    compiled = False
    fallback: str | None = None

    def __init__(self, device: Any, num_heads: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype):
        if torch.device(device).type != "cuda":
            raise BackendError("flashinfer runs on CUDA only")
        try:
            import flashinfer
        except ImportError as e:
            raise BackendError(f"flashinfer is not importable ({e})") from None
        self.compile_seconds: dict[str, float] = {}
        self.heads, self.kv_heads, self.head_dim, self.dtype = num_heads, num_kv_heads, \
            head_dim, dtype
        ws = torch.empty(128 << 20, dtype=torch.uint8, device=device)
        self._prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        self._decode = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
        self.device = device

    def prepare(self, meta: StepMeta, num_cache_blocks: int) -> None:
        p = meta.num_prefills
        plans = []
        if p:
            t = flashinfer_page_table(meta, list(range(p)))
            self._prefill.plan(t["qo_indptr"].to(self.device), t["kv_indptr"].to(self.device),
                               t["kv_indices"].to(self.device),
                               t["kv_last_page_len"].to(self.device), self.heads,
                               self.kv_heads, self.head_dim, meta.block_size, causal=True,
                               q_data_type=self.dtype, kv_data_type=self.dtype)
            plans.append((self._prefill, 0, meta.query_start[p]))
        if meta.num_seqs > p:
            t = flashinfer_page_table(meta, list(range(p, meta.num_seqs)))
            self._decode.plan(t["kv_indptr"].to(self.device), t["kv_indices"].to(self.device),
                              t["kv_last_page_len"].to(self.device), self.heads, self.kv_heads,
                              self.head_dim, meta.block_size, q_data_type=self.dtype,
                              kv_data_type=self.dtype)
            plans.append((self._decode, meta.query_start[p], meta.num_tokens))
        meta.backend_state["flashinfer"] = plans

    def __call__(self, q: torch.Tensor, cache: PagedKVCache, meta: StepMeta) -> torch.Tensor:
        out = torch.empty_like(q)
        for wrapper, start, end in meta.backend_state["flashinfer"]:
            # flashinfer's causal mask is bottom-right aligned: the prefill-with-context case
            out[start:end] = wrapper.run(q[start:end], (cache.k, cache.v))
        return out


# --------------------------------------------------------------------------------------------


def flashinfer_available() -> bool:
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend_name(name: str, device: str) -> str:
    """``auto``: FlashInfer on CUDA when importable, else compiled Flex on CUDA; the gather+SDPA
    reference on CPU (compiling Flex there costs seconds per shape family)."""
    if name != "auto":
        return name
    if device == "cuda":
        return "flashinfer" if flashinfer_available() else "flex"
    return "reference"


def make_backend(name: str, device: Any, shapes: Any, dtype: torch.dtype,
                 compile: bool = True):
    if name == "reference":
        return ReferenceAttention()
    if name == "flex":
        return FlexPagedAttention(device, compile=compile,
                                  heads_per_kv=shapes.num_heads // shapes.num_kv_heads)
    if name == "triton":
        return TritonDecodeAttention(device, shapes.num_heads, shapes.num_kv_heads,
                                     shapes.head_dim, compile=compile)
    if name == "flashinfer":
        return FlashInferAttention(device, shapes.num_heads, shapes.num_kv_heads,
                                   shapes.head_dim, dtype)
    if name == "vllm_fa":
        from profiler.vllm_attention import VllmFlashAttention
        return VllmFlashAttention(device, shapes.num_heads, shapes.num_kv_heads,
                                  shapes.head_dim, dtype)
    raise BackendError(f"unknown attention backend {name!r}; expected one of "
                       f"{', '.join(BACKENDS)}")


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: int) -> torch.Tensor:
    """fp32 attention of one sequence, no paging: ``q [L, H, D]`` at positions ``ctx ..
    ctx+L-1`` over ``k, v [ctx+L, Hkv, D]``. The yardstick every backend is checked against."""
    L, H, D = q.shape
    n, hkv = k.shape[0], k.shape[1]
    kf = k.float().repeat_interleave(H // hkv, dim=1)                  # [n, H, D]
    vf = v.float().repeat_interleave(H // hkv, dim=1)
    scores = torch.einsum("lhd,nhd->hln", q.float(), kf) / D ** 0.5
    allowed = torch.arange(n)[None, :] <= torch.arange(ctx, ctx + L)[:, None]
    scores = scores.masked_fill(~allowed.to(scores.device), float("-inf"))
    return torch.einsum("hln,nhd->lhd", scores.softmax(-1), vf)


def self_check(backend, prefill: list[tuple[int, int]], decode_ctx: list[int], block_size: int,
               num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
               device: Any, seed: int = 0) -> float:
    """Largest relative error (max |paged - dense| / max |dense|) of ``backend`` on random
    inputs, one step of ``prefill`` chunks and decodes through a shuffled block table."""
    from profiler.layers import blocks_needed, build_step
    gen = torch.Generator().manual_seed(seed)
    seq_lens = [q + c for q, c in prefill] + [c + 1 for c in decode_ctx]
    num_blocks = sum(blocks_needed(n, block_size) for n in seq_lens) + 3   # a few spare pages
    cache = PagedKVCache(num_blocks, block_size, num_kv_heads, head_dim, dtype, device,
                         fill="random", generator=gen)
    meta = build_step(prefill, decode_ctx, block_size, num_blocks, device, generator=gen)
    q = torch.randn((meta.num_tokens, num_heads, head_dim), generator=gen).to(dtype).to(device)
    backend.prepare(meta, num_blocks)
    out = backend(q, cache, meta)
    if out.device.type == "cuda":
        torch.cuda.synchronize()
    worst = 0.0
    flat_k = cache.k.view(-1, num_kv_heads, head_dim)
    flat_v = cache.v.view(-1, num_kv_heads, head_dim)
    for s in range(meta.num_seqs):
        slots = gather_slots(meta.block_tables[s], meta.seq_lens[s], block_size)
        a, b = meta.query_start[s], meta.query_start[s + 1]
        ref = dense_attention(q[a:b], flat_k[slots], flat_v[slots], meta.ctx_lens[s])
        err = (out[a:b].float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)
        worst = max(worst, float(err))
    return worst


# relative error allowed against the fp32 dense yardstick, per dtype (bf16 keeps 8 mantissa bits)
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4}
