"""A Llama-style decoder built from a model card's shapes, with random weights.

Only the shapes matter for timing, so weights are random (non-zero, small, seeded). The layer is
written the way a serving engine runs it: all tokens of a step packed into one ``[T, hidden]``
tensor (prefill chunks and decodes together), positions per token, and the new K/V written into a
paged cache through a slot mapping before attention reads the cache through a block table.

Paged KV cache and the index arithmetic (block_size = 4 in the picture)::

    sequence s, 10 tokens:   pos  0 1 2 3 | 4 5 6 7 | 8 9 . .
    block_table[s]        =  [     7      ,    2    ,   5     ]   (any free blocks, any order)
    slot(pos)             =  block_table[s][pos // block_size] * block_size + pos % block_size
    slot(9)               =  5 * 4 + 1 = 21   ->  cache_k.view(-1, kv_heads, head_dim)[21]

``StepMeta`` holds everything derived from the step's composition (positions, slots, block
tables); it is built once per step and shared by every layer, like an engine's attention metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

import torch
import torch.nn.functional as F

from simserve.cards import ModelCard

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
RMS_EPS = 1e-6
ROPE_THETA = 10000.0


# --------------------------------------------------------------------------------------------
# Paged KV cache and per-step metadata


class PagedKVCache:
    """K and V of one layer: ``[num_blocks, block_size, kv_heads, head_dim]`` each."""

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, fill: str = "random",
                 generator: torch.Generator | None = None):
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.block_size = block_size
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        # random numbers come from a CPU generator (seeded, device-independent), then move
        if fill == "random":
            # checks want every slot distinct; fine while the cache is small
            self.k.copy_(torch.randn(shape, generator=generator).to(dtype))
            self.v.copy_(torch.randn(shape, generator=generator).to(dtype))
        else:
            # timing only needs finite, non-constant values: tile one random block on the device
            # (memset speed; randn over gigabytes would cost seconds per grid point)
            one = torch.randn((1, *shape[1:]), generator=generator).to(dtype).to(device)
            self.k.copy_(one.expand(shape))
            self.v.copy_((-one).expand(shape))

    @property
    def num_blocks(self) -> int:
        return self.k.shape[0]

    def write(self, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store the new tokens' K/V ``[T, kv_heads, head_dim]`` at their slots."""
        flat_k = self.k.view(-1, *self.k.shape[2:])
        flat_v = self.v.view(-1, *self.v.shape[2:])
        flat_k.index_copy_(0, slot_mapping, k)
        flat_v.index_copy_(0, slot_mapping, v)

    def nbytes(self) -> int:
        return self.k.numel() * self.k.element_size() * 2


@dataclass
class StepMeta:
    """What a step is made of, as tensors. Tokens are packed prefill chunks first, then decodes.

    ``query_lens[s]`` new tokens of sequence ``s`` attend its first ``seq_lens[s]`` cached tokens
    (``seq_lens = ctx + query_len``): query ``i`` of ``s`` sits at position ``ctx + i`` and sees
    keys at positions ``<= ctx + i``.
    """

    block_size: int
    num_prefills: int              # sequences [0, num_prefills) are prefill chunks
    query_lens: list[int]
    ctx_lens: list[int]
    query_start: list[int]         # token offset of each sequence in the packed batch (len S+1)
    positions: torch.Tensor        # [T] int64
    slot_mapping: torch.Tensor     # [T] int64
    block_tables: torch.Tensor     # [S, max_blocks] int32, padded with 0
    num_blocks_per_seq: list[int]
    seq_lens_t: torch.Tensor       # [S] int64 on device
    backend_state: dict[str, Any]  # whatever an attention backend precomputes per step

    @property
    def num_tokens(self) -> int:
        return self.query_start[-1]

    @property
    def num_seqs(self) -> int:
        return len(self.query_lens)

    @property
    def seq_lens(self) -> list[int]:
        return [c + q for c, q in zip(self.ctx_lens, self.query_lens)]


def blocks_needed(seq_len: int, block_size: int) -> int:
    return -(-seq_len // block_size)


def build_step(prefill: list[tuple[int, int]], decode_ctx: list[int], block_size: int,
               num_cache_blocks: int, device: torch.device | str,
               generator: torch.Generator | None = None,
               block_order: torch.Tensor | None = None, wrap: bool = False) -> StepMeta:
    """Metadata for a step of prefill chunks ``(len, ctx)`` and decodes (``ctx``, 1 new token).

    Blocks are handed out from a shuffled order of the cache's blocks (or ``block_order``), so
    block tables are non-contiguous as in a long-running server. With ``wrap`` a step that
    needs more blocks than the cache has reuses them (the shuffled order again): the same
    bytes moved, for a timing, where the cache cannot be as large as the step.
    """
    if not prefill and not decode_ctx:
        raise ValueError("a step needs at least one sequence")
    query_lens = [q for q, _ in prefill] + [1] * len(decode_ctx)
    ctx_lens = [c for _, c in prefill] + list(decode_ctx)
    for q in query_lens:
        if q < 1:
            raise ValueError(f"a prefill chunk needs at least one token, got {q}")
    nblocks = [blocks_needed(c + q, block_size) for q, c in zip(query_lens, ctx_lens)]
    if sum(nblocks) > num_cache_blocks and not wrap:
        raise ValueError(f"step needs {sum(nblocks)} KV blocks, cache has {num_cache_blocks}")
    if block_order is None:
        block_order = torch.randperm(num_cache_blocks, generator=generator)
    if sum(nblocks) > len(block_order):
        block_order = block_order.repeat(-(-sum(nblocks) // len(block_order)))
    width = max(nblocks) if nblocks else 1
    tables = torch.zeros((len(nblocks), width), dtype=torch.int32)
    positions, slots, starts = [], [], [0]
    used = 0
    for s, (q, c, n) in enumerate(zip(query_lens, ctx_lens, nblocks)):
        table = block_order[used:used + n]
        used += n
        tables[s, :n] = table
        pos = torch.arange(c, c + q)
        positions.append(pos)
        slots.append(table[pos // block_size].long() * block_size + pos % block_size)
        starts.append(starts[-1] + q)
    return StepMeta(
        block_size=block_size, num_prefills=len(prefill), query_lens=query_lens,
        ctx_lens=ctx_lens, query_start=starts,
        positions=torch.cat(positions).to(device), slot_mapping=torch.cat(slots).to(device),
        block_tables=tables.to(device), num_blocks_per_seq=nblocks,
        seq_lens_t=torch.tensor([c + q for q, c in zip(query_lens, ctx_lens)], device=device),
        backend_state={})


def gather_slots(block_table: torch.Tensor, seq_len: int, block_size: int) -> torch.Tensor:
    """Cache slot of each of a sequence's first ``seq_len`` positions (see the module picture)."""
    pos = torch.arange(seq_len, device=block_table.device)
    return block_table[pos // block_size].long() * block_size + pos % block_size


# --------------------------------------------------------------------------------------------
# Building blocks


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # variance in fp32, as engines do, or bf16 rounding dominates the error
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
    return xf.to(x.dtype) * weight


class Rotary:
    """Neox-style rotary embedding with a cos/sin table built once for ``max_positions``."""

    def __init__(self, head_dim: int, max_positions: int, dtype: torch.dtype,
                 device: torch.device | str):
        inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32)
                                         / head_dim))
        t = torch.arange(max_positions, dtype=torch.float32)
        freqs = torch.outer(t, inv_freq)
        self.cos = freqs.cos().to(dtype).to(device)
        self.sin = freqs.sin().to(dtype).to(device)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape ``[T, heads, head_dim]``."""
        return rotate(x, self.cos, self.sin, positions)


def rotate(x: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor,
           positions: torch.Tensor) -> torch.Tensor:
    cos = cos_table[positions].unsqueeze(1)
    sin = sin_table[positions].unsqueeze(1)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


# A layer's work outside attention in two pieces, the code between attention calls, as vLLM v1
# cuts a model for torch.compile (vllm/compilation/backends.py splits the graph at the attention
# op): on CUDA the profiler compiles each piece, so norms, RoPE, SiLU·up and residual adds run
# fused as in the engine, not as a dozen eager kernels each. Plain functions of tensors (no
# ``self``), so one compiled piece serves every layer.

def pre_attention(x: torch.Tensor, norm_w: torch.Tensor, w_qkv: torch.Tensor,
                  b_qkv: torch.Tensor | None, cos_table: torch.Tensor, sin_table: torch.Tensor,
                  positions: torch.Tensor, heads: int, kv_heads: int, head_dim: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm, fused QKV projection, RoPE: ``q [T, heads, d]``, ``k, v [T, kv_heads, d]``."""
    qkv = F.linear(rms_norm(x, norm_w), w_qkv, b_qkv)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = rotate(q.reshape(-1, heads, head_dim), cos_table, sin_table, positions)
    k = rotate(k.reshape(-1, kv_heads, head_dim), cos_table, sin_table, positions)
    return q, k, v.reshape(-1, kv_heads, head_dim)


def post_attention(x: torch.Tensor, o: torch.Tensor, w_o: torch.Tensor, norm_w: torch.Tensor,
                   w_gate_up: torch.Tensor, w_down: torch.Tensor) -> torch.Tensor:
    """O projection and residual, RMSNorm, gate/up, SiLU·up, down and residual."""
    x = x + F.linear(o.reshape(x.shape[0], -1), w_o)
    gate, up = F.linear(rms_norm(x, norm_w), w_gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, w_down)


class Pieces:
    """The two pieces a layer runs, eager or compiled (``torch.compile``, shapes dynamic in
    the token count so every step size shares one compiled piece)."""

    def __init__(self, compiled: bool = False) -> None:
        self.compiled = compiled
        if compiled:
            self.pre = torch.compile(pre_attention, dynamic=True, fullgraph=True)
            self.post = torch.compile(post_attention, dynamic=True, fullgraph=True)
        else:
            self.pre, self.post = pre_attention, post_attention


def _weight(rows: int, cols: int, dtype: torch.dtype, device: Any, gen: torch.Generator,
            std: float | None = None) -> torch.Tensor:
    # std 1/sqrt(cols) keeps activations O(1) through many random layers; drawn on the device
    # (a CPU draw of an 8B model's weights would take minutes)
    w = torch.randn((rows, cols), generator=gen, device=gen.device, dtype=dtype)
    # a layer without a dense MLP (an MoE card: its MoE block is timed on its own) has
    # zero-width MLP weights
    return w.mul_(max(cols, 1) ** -0.5 if std is None else std).to(device)


def _near_one(n: int, dtype: torch.dtype, device: Any, gen: torch.Generator) -> torch.Tensor:
    """Norm weights: 1 + small noise (non-trivial, but no layer scales activations away)."""
    return (1 + 0.1 * torch.randn(n, generator=gen, device=gen.device)).to(dtype).to(device)


AttentionFn = Callable[[torch.Tensor, "PagedKVCache", StepMeta], torch.Tensor]


class DecoderLayer:
    """RMSNorm → fused QKV → RoPE → paged-cache write → attention → O proj → residual →
    RMSNorm → fused gate/up → SiLU·up → down → residual."""

    OPS = ("input_norm", "qkv_proj", "rope", "kv_write", "o_proj", "post_norm", "mlp")

    def __init__(self, shapes: ModelCard, dtype: torch.dtype, device: Any, gen: torch.Generator,
                 rotary: Rotary, pieces: Pieces | None = None):
        h, s = shapes.hidden_size, shapes
        self.s = s
        self.rotary = rotary
        self.pieces = pieces or Pieces()
        self.input_norm = _near_one(h, dtype, device, gen)
        self.post_norm = _near_one(h, dtype, device, gen)
        self.w_qkv = _weight(s.q_dim + 2 * s.kv_dim, h, dtype, device, gen)
        self.b_qkv = (_near_one(s.q_dim + 2 * s.kv_dim, dtype, device, gen) - 1
                      if s.qkv_bias else None)
        self.w_o = _weight(h, s.q_dim, dtype, device, gen)
        self.w_gate_up = _weight(2 * s.intermediate_size, h, dtype, device, gen)
        self.w_down = _weight(h, s.intermediate_size, dtype, device, gen)

    def parameters(self) -> list[torch.Tensor]:
        ps = [self.input_norm, self.post_norm, self.w_qkv, self.w_o, self.w_gate_up, self.w_down]
        return ps + ([self.b_qkv] if self.b_qkv is not None else [])

    # each op on its own, so the profiler can time them one by one
    def qkv(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(h, self.w_qkv, self.b_qkv)

    def split_qkv(self, qkv: torch.Tensor) -> tuple[torch.Tensor, ...]:
        s = self.s
        q, k, v = qkv.split([s.q_dim, s.kv_dim, s.kv_dim], dim=-1)
        return (q.view(-1, s.num_heads, s.head_dim), k.view(-1, s.num_kv_heads, s.head_dim),
                v.view(-1, s.num_kv_heads, s.head_dim))

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(h, self.w_gate_up).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, self.w_down)

    def forward(self, x: torch.Tensor, meta: StepMeta, cache: PagedKVCache,
                attention: AttentionFn | None,
                sections: Sections | None = None) -> torch.Tensor:
        """``x`` is ``[T, hidden]``. With ``attention=None`` the attention output is replaced by
        the queries themselves (same shape): everything else in the layer still runs, which is
        how the per-token ("linear") part of a layer is timed in isolation. With ``sections``
        the layer's time is charged to ``linear`` and ``attention`` as it runs."""
        s, pieces = self.s, self.pieces
        q, k, v = pieces.pre(x, self.input_norm, self.w_qkv, self.b_qkv, self.rotary.cos,
                             self.rotary.sin, meta.positions, s.num_heads, s.num_kv_heads,
                             s.head_dim)
        cache.write(k, v, meta.slot_mapping)
        if sections is not None:
            sections.mark("linear")
        o = q if attention is None else attention(q, cache, meta)
        if sections is not None:
            sections.mark("attention")
        x = pieces.post(x, o, self.w_o, self.post_norm, self.w_gate_up, self.w_down)
        if sections is not None:
            sections.mark("linear")
        return x


class Sections:
    """Splits one step's time among its parts while the step runs, so that each part is timed
    with the caches in the state the rest of the step leaves them in (a part timed alone, over
    and over, finds its weights and K/V still cached; inside a step they were evicted by the
    other layers and the LM head: 15-25 % of a small step on a CPU with a 32 MB L3).

    ``start()`` opens the step; ``mark(name)`` charges the time since the previous mark to
    ``name`` (a name may be charged many times: every layer's ``linear``); ``result()`` gives
    seconds per name. On CPU the marks read ``clock`` (torch runs CPU ops synchronously); on
    CUDA they record events, read after one synchronisation at the end, so no mark stalls the
    host or changes what overlaps.
    """

    def __init__(self, device: torch.device | str, clock: Callable[[], float],
                 graph: bool = False):
        self.cuda = torch.device(device).type == "cuda"
        self.clock = clock
        # marks made while a CUDA graph is captured: "external" events become event-record
        # nodes of the graph (a plain event would only order streams), re-recorded each replay
        self.graph = graph
        self._names: list[str] = []
        self._stamps: list[Any] = []

    def start(self) -> None:
        self._names.clear()
        self._stamps = [self._stamp()]

    def mark(self, name: str) -> None:
        self._names.append(name)
        self._stamps.append(self._stamp())

    def _stamp(self) -> Any:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True, external=self.graph)
            e.record()
            return e
        return self.clock()

    def result(self) -> dict[str, float]:
        if self.cuda:
            torch.cuda.synchronize()
            gaps = [a.elapsed_time(b) / 1000.0 for a, b in zip(self._stamps, self._stamps[1:])]
        else:
            gaps = [b - a for a, b in zip(self._stamps, self._stamps[1:])]
        out: dict[str, float] = {}
        for name, gap in zip(self._names, gaps):
            out[name] = out.get(name, 0.0) + gap
        return out


class Model:
    """Embedding, ``num_layers`` decoder layers, final norm and LM head.

    ``distinct_layers=False`` reuses one layer's weights for every layer: the same work per step
    with a fraction of the memory, for models too large for the device (recorded in the profile).
    """

    def __init__(self, shapes: ModelCard, dtype: torch.dtype, device: Any, seed: int = 0,
                 num_layers: int | None = None, distinct_layers: bool = True,
                 max_positions: int = 4096, compile_layers: bool = False):
        gen = torch.Generator(device=device).manual_seed(seed)
        self.shapes = shapes
        self.dtype = dtype
        self.device = device
        self.rotary = Rotary(shapes.head_dim, max_positions, dtype, device)
        self.pieces = Pieces(compiled=compile_layers)
        n = shapes.num_layers if num_layers is None else num_layers
        first = DecoderLayer(shapes, dtype, device, gen, self.rotary, self.pieces)
        self.layers = [first] + [DecoderLayer(shapes, dtype, device, gen, self.rotary,
                                              self.pieces)
                                 if distinct_layers else first for _ in range(n - 1)]
        self.embed = _weight(shapes.vocab_size, shapes.hidden_size, dtype, device, gen,
                             std=1.0)
        self.final_norm = _near_one(shapes.hidden_size, dtype, device, gen)
        self.lm_head = self.embed if shapes.tie_word_embeddings else _weight(
            shapes.vocab_size, shapes.hidden_size, dtype, device, gen)

    def parameters(self) -> list[torch.Tensor]:
        seen: dict[int, torch.Tensor] = {}
        for t in [self.embed, self.final_norm, self.lm_head,
                  *[p for layer in self.layers for p in layer.parameters()]]:
            seen.setdefault(id(t), t)
        return list(seen.values())

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.embed)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.lm_head)

    def step(self, token_ids: torch.Tensor, meta: StepMeta, caches: list[PagedKVCache],
             attention: AttentionFn, sample: Callable[[torch.Tensor], torch.Tensor],
             sample_rows: torch.Tensor, sections: Sections | None = None) -> torch.Tensor:
        """One engine step: returns the sampled token of each row in ``sample_rows``. With
        ``sections``, the step's time is split into ``embedding`` (lookup and final norm),
        ``linear`` and ``attention`` (all layers) and ``lm_head`` (LM head and sampling)."""
        if sections is not None:
            sections.start()
        x = self.embed_tokens(token_ids)
        if sections is not None:
            sections.mark("embedding")
        for layer, cache in zip(self.layers, caches):
            x = layer.forward(x, meta, cache, attention, sections)
        x = rms_norm(x, self.final_norm)
        if sections is not None:
            sections.mark("embedding")
        out = sample(self.logits(x[sample_rows]))
        if sections is not None:
            sections.mark("lm_head")
        return out


def param_bytes(tensors: list[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


# --------------------------------------------------------------------------------------------
# Sampling


def sample_greedy(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


def make_top_p(top_p: float = 0.9, temperature: float = 1.0,
               seed: int = 0) -> Callable[[torch.Tensor], torch.Tensor]:
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches ``top_p``."""
    gen: dict[Any, torch.Generator] = {}

    def sample(logits: torch.Tensor) -> torch.Tensor:
        if logits.device not in gen:
            gen[logits.device] = torch.Generator(device=logits.device).manual_seed(seed)
        # while a CUDA graph is captured, the default generator (which graphs know how to
        # advance); ours would have to be registered with the graph
        g = None if logits.is_cuda and torch.cuda.is_current_stream_capturing() \
            else gen[logits.device]
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop = sorted_p.cumsum(dim=-1) - sorted_p > top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        pick = torch.multinomial(sorted_p, 1, generator=g)
        return order.gather(-1, pick).squeeze(-1)

    return sample
