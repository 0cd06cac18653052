"""An MoE block and an MLA decode, timed on the device the profiler runs on (issue #18).

The MoE block is written the way vLLM's fused MoE runs it, with what torch offers:

    router   logits = x · W_gateᵀ (+ bias)            [T, E]   a 16-bit GEMM
    top-k    softmax over E, top-k, renormalised     [T, k]   (Qwen3/Mixtral; gpt-oss and
             DeepSeek route differently, at the same cost to within a tiny softmax)
    permute  the T·k (token, expert) rows sorted by expert, rows gathered   [T·k, h]
    experts  grouped GEMMs over the sorted rows: gate/up [h → 2I], SiLU·up, down [I → h]
             (``torch._grouped_mm``, one group per expert, empty groups for the experts no
             token picked: their weights are not read)
    combine  rows scaled by their routing weight and summed back per token   [T, h]
    shared   the shared expert, a dense gated MLP, when the card has one

Timed on a grid of token counts with random inputs and random router weights, so the routing
is near uniform: the experts a step touches grow with its tokens as balls in bins, which is
what the measured times carry (each point records how many experts its routing hit).

MLA decode is the absorbed ("data-movement friendly") form of vLLM's ``mla_attention.py``:
each query head attends the cached latent rows ``[ctx, kv_lora_rank + rope]`` of its
sequence (one latent "head" shared by all heads, MQA), values are the first ``kv_lora_rank``
columns; the W_UK / W_UV absorptions are GEMMs priced with the linears, not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class MoEShapes:
    """One MoE block's shapes (from a simserve ModelCard with experts)."""

    hidden_size: int
    num_experts: int
    experts_per_token: int
    expert_intermediate: int
    shared_expert_intermediate: int = 0
    router_bias: bool = False

    @classmethod
    def from_card(cls, card: Any) -> MoEShapes:
        if not getattr(card, "num_experts", 0):
            raise ValueError(f"{card.name} has no experts")
        return cls(card.hidden_size, card.num_experts, card.experts_per_token,
                   card.expert_intermediate, card.shared_expert_intermediate, card.router_bias)

    @property
    def params(self) -> int:
        h, e, i, s = (self.hidden_size, self.num_experts, self.expert_intermediate,
                      self.shared_expert_intermediate)
        return h * e + (e if self.router_bias else 0) + e * 3 * h * i + 3 * h * s


def _w(shape: tuple[int, ...], dtype: torch.dtype, device: Any, gen: torch.Generator,
       scale: float) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


class MoEBlock:
    """Router, top-k, grouped expert GEMMs, combine (and a shared expert)."""

    def __init__(self, s: MoEShapes, dtype: torch.dtype, device: Any, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        h, e, i = s.hidden_size, s.num_experts, s.expert_intermediate
        self.s = s
        self.w_router = _w((e, h), dtype, device, gen, h ** -0.5)
        self.b_router = _w((e,), dtype, device, gen, 0.1) if s.router_bias else None
        # stored [E, in, out] so each expert's GEMM is rows · w[e]
        self.w_gate_up = _w((e, h, 2 * i), dtype, device, gen, h ** -0.5)
        self.w_down = _w((e, i, h), dtype, device, gen, i ** -0.5)
        si = s.shared_expert_intermediate
        self.w_shared_gate_up = _w((2 * si, h), dtype, device, gen, h ** -0.5) if si else None
        self.w_shared_down = _w((h, si), dtype, device, gen, si ** -0.5) if si else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k experts and their renormalised weights per token: ``[T, k]`` each."""
        logits = F.linear(x, self.w_router, self.b_router)
        weights, experts = torch.topk(torch.softmax(logits.float(), dim=-1),
                                      self.s.experts_per_token, dim=-1)
        return experts, (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The block's output ``[T, h]`` and how many distinct experts the step touched."""
        k = self.s.experts_per_token
        experts, weights = self.route(x)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.s.num_experts)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        rows = x.index_select(0, order // k)                       # [T·k, h], by expert
        gate, up = torch._grouped_mm(rows, self.w_gate_up, offs=offs).chunk(2, dim=-1)
        out = torch._grouped_mm(F.silu(gate) * up, self.w_down, offs=offs)
        out = out * weights.reshape(-1)[order].unsqueeze(-1)
        y = torch.zeros_like(x).index_add_(0, order // k, out)
        if self.w_shared_gate_up is not None:
            g, u = F.linear(x, self.w_shared_gate_up).chunk(2, dim=-1)
            y = y + F.linear(F.silu(g) * u, self.w_shared_down)
        return y, int((counts > 0).sum())

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """The same block as a loop over tokens and their experts (for the self-check)."""
        experts, weights = self.route(x)
        y = torch.zeros_like(x, dtype=torch.float32)
        for tok in range(x.shape[0]):
            for j in range(self.s.experts_per_token):
                e = int(experts[tok, j])
                g, u = (x[tok].float() @ self.w_gate_up[e].float()).chunk(2)
                y[tok] += weights[tok, j].float() * ((F.silu(g) * u) @ self.w_down[e].float())
        if self.w_shared_gate_up is not None:
            g, u = F.linear(x.float(), self.w_shared_gate_up.float()).chunk(2, dim=-1)
            y += F.linear(F.silu(g) * u, self.w_shared_down.float())
        return y


def expected_experts_hit(num_experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts ``tokens`` uniformly routed tokens touch: E · (1 − (1 − k/E)^T)."""
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def measure_moe(shapes: MoEShapes, tokens: list[int], timer, *, dtype: torch.dtype,
                device: Any, seed: int = 0, progress=None) -> dict[str, Any]:
    """Seconds of one MoE block per token count, and the experts each point's routing hit.

    ``timer(fn)`` returns a stat with ``median``/``p10``/``p90`` (profiler.measure.Timer)."""
    block = MoEBlock(shapes, dtype, device, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    out = {"tokens": list(tokens), "seconds": [], "p10": [], "p90": [], "experts_hit": []}
    for t in tokens:
        x = torch.randn((t, shapes.hidden_size), generator=gen).to(dtype).to(device)
        _, hit = block.forward(x)
        stat = timer(lambda x=x: block.forward(x))
        out["seconds"].append(stat.median)
        out["p10"].append(stat.p10)
        out["p90"].append(stat.p90)
        out["experts_hit"].append(hit)
        if progress is not None:
            progress.step("moe", f"tokens={t}")
    out["note"] = ("one MoE block per layer: router GEMM, softmax top-k, rows sorted by "
                   "expert, torch._grouped_mm gate/up and down (empty groups for experts not "
                   "hit), combine by index_add; random router: near-uniform routing")
    return out


def mla_decode(q: torch.Tensor, latent: torch.Tensor, kv_lora_rank: int,
               scale: float) -> torch.Tensor:
    """Absorbed MLA decode for B sequences of one context length: ``q`` ``[B, H, L+R]``
    against ``latent`` ``[B, ctx, L+R]`` (one shared latent head); output ``[B, H, L]``."""
    scores = torch.einsum("bhd,bcd->bhc", q.float(), latent.float()) * scale
    return torch.einsum("bhc,bcl->bhl", torch.softmax(scores, dim=-1),
                        latent[..., :kv_lora_rank].float()).to(q.dtype)


def measure_mla_decode(num_heads: int, kv_lora_rank: int, rope_dim: int, batch: list[int],
                       ctx: list[int], timer, *, dtype: torch.dtype, device: Any,
                       seed: int = 0) -> dict[str, Any]:
    """Seconds of one layer's absorbed MLA decode on a (batch, context) grid."""
    gen = torch.Generator().manual_seed(seed)
    width = kv_lora_rank + rope_dim
    table = []
    for b in batch:
        row = []
        for c in ctx:
            q = torch.randn((b, num_heads, width), generator=gen).to(dtype).to(device)
            lat = torch.randn((b, c, width), generator=gen).to(dtype).to(device)
            row.append(timer(lambda q=q, lat=lat: mla_decode(q, lat, kv_lora_rank,
                                                             width ** -0.5)).median)
        table.append(row)
    return {"batch": list(batch), "ctx": list(ctx), "seconds": table,
            "note": "absorbed MQA over the latent rows (einsum + softmax, unfused)"}
