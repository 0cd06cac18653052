"""How many KV blocks fit on a device, resolved the way vLLM resolves ``num_gpu_blocks``.

Per device (one tensor-parallel rank)::

    free   = mem_bytes × gpu_memory_utilization − weight_bytes / TP − activation_reserve
    blocks = floor(free / kv_block_bytes)

vLLM measures the activation peak with a profiling forward pass of ``max_num_batched_tokens``
tokens. Until our profiler measures it, :func:`activation_reserve_bytes` is an explicit
estimate (see its docstring); it leaves out CUDA-graph pools and non-torch allocations
(NCCL buffers, cuBLAS workspaces), which a real engine also subtracts.
"""

from __future__ import annotations

from simserve.cards import HardwareSpec, ModelCard
from simserve.errors import ConfigError

GB = 1e9


def check_tensor_parallel(model: ModelCard, tp: int,
                          field: str = "engine.tensor_parallel_size") -> None:
    """Attention heads must split evenly across ranks; KV heads split or are replicated."""
    if tp < 1:
        raise ConfigError(field, f"must be >= 1, got {tp}")
    if model.num_heads % tp:
        raise ConfigError(field, f"{model.name} has {model.num_heads} attention heads, "
                                 f"not divisible by tensor_parallel_size {tp}")
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ConfigError(field, f"{model.name} has {kv} KV heads; tensor_parallel_size {tp} "
                                 "must divide it or be a multiple of it")


def kv_heads_per_rank(model: ModelCard, tp: int) -> int:
    """KV heads stored on one rank; with fewer KV heads than ranks each head is replicated."""
    return max(1, model.num_kv_heads // tp)


def kv_block_bytes(model: ModelCard, block_size: int, tp: int = 1) -> int:
    """Bytes of one KV block on one rank: block_size tokens of K and V in every layer."""
    check_tensor_parallel(model, tp)
    per_token = 2 * model.num_layers * kv_heads_per_rank(model, tp) * model.head_dim
    return block_size * per_token * model.dtype_bytes


def activation_reserve_bytes(model: ModelCard, *, max_num_batched_tokens: int,
                             max_num_seqs: int = 256, tensor_parallel_size: int = 1) -> int:
    """Estimated peak of activations in a forward pass of ``max_num_batched_tokens`` tokens.

    With ``T`` tokens, ``S = min(T, max_num_seqs)`` sampled rows, per rank::

        residual + normed hidden states   2 · T · hidden · dtype
        + the larger of
          MLP gate/up (fc1) output + act  (3 | 2) · T · intermediate / TP · dtype
          logits (bf16 and fp32 copies)   S · vocab · (dtype + 4)

    An estimate, not a measurement: the profiler replaces it with the measured peak.
    """
    t, tp, d = max_num_batched_tokens, tensor_parallel_size, model.dtype_bytes
    rows = min(t, max_num_seqs)
    mlp = model.mlp_matrices * t * model.intermediate_size // tp * d   # gate/up or fc1 out + act
    logits = rows * model.vocab_size * (d + 4)
    return 2 * t * model.hidden_size * d + max(mlp, logits)


def kv_capacity_blocks(model: ModelCard, hw: HardwareSpec, *, block_size: int,
                       gpu_memory_utilization: float, tensor_parallel_size: int = 1,
                       max_num_batched_tokens: int, max_num_seqs: int = 256) -> int:
    """KV blocks per rank (every rank holds the same blocks' share of heads).

    Raises ConfigError on ``engine.gpu_memory_utilization`` when weights and activations leave
    no room for a single block.
    """
    tp = tensor_parallel_size
    block = kv_block_bytes(model, block_size, tp)
    budget = hw.mem_bytes * gpu_memory_utilization
    weights = model.weight_bytes / tp
    reserve = activation_reserve_bytes(model, max_num_batched_tokens=max_num_batched_tokens,
                                       max_num_seqs=max_num_seqs, tensor_parallel_size=tp)
    free = budget - weights - reserve
    if free < block:
        raise ConfigError(
            "engine.gpu_memory_utilization",
            f"no room for the KV cache: {model.name} weights ({weights / GB:.2f} GB per device) "
            f"and the activation reserve ({reserve / GB:.2f} GB) exceed "
            f"{gpu_memory_utilization:g} × {hw.mem_bytes / GB:.1f} GB of {hw.name}; raise "
            "gpu_memory_utilization or tensor_parallel_size, or use a larger device")
    return int(free // block)
