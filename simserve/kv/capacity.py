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


def check_expert_parallel(model: ModelCard, ep: int,
                          field: str = "engine.enable_expert_parallel") -> None:
    """Experts must split evenly across the EP ranks. Stricter than vLLM 0.32, which gives the
    first ``E mod EP`` ranks one expert more (``fused_moe/expert_map_manager.py``); simserve
    prices every rank alike, so it refuses an uneven split rather than mis-price it."""
    if ep <= 1:
        return
    if not model.is_moe:
        raise ConfigError(field, f"{model.name} is a dense model; expert parallelism needs "
                                 "experts")
    if model.num_experts % ep:
        raise ConfigError(field, f"{model.name} has {model.num_experts} experts, not divisible "
                                 f"by the expert-parallel size {ep} (tensor_parallel_size × "
                                 "data_parallel_size); simserve is stricter than vLLM here, "
                                 "which gives the first ranks one expert more")


def kv_heads_per_rank(model: ModelCard, tp: int) -> int:
    """KV heads stored on one rank; with fewer KV heads than ranks each head is replicated
    (MLA's one latent "head" is on every rank)."""
    return max(1, model.num_kv_heads // tp)


def kv_block_bytes(model: ModelCard, block_size: int, tp: int = 1) -> int:
    """Bytes of one KV block on one rank: block_size tokens of K and V (MLA: the latent) in
    every layer, at the KV cache dtype (``kv_cache_dtype``)."""
    check_tensor_parallel(model, tp)
    return block_size * model.kv_bytes_per_token_per_rank(tp)


def activation_reserve_bytes(model: ModelCard, *, max_num_batched_tokens: int,
                             max_num_seqs: int = 256, tensor_parallel_size: int = 1) -> int:
    """Estimated peak of activations in a forward pass of ``max_num_batched_tokens`` tokens.

    With ``T`` tokens, ``S = min(T, max_num_seqs)`` sampled rows, per rank::

        residual + normed hidden states   2 · T · hidden · dtype
        + the larger of
          MLP gate/up (fc1) output + act  (3 | 2) · T · intermediate / TP · dtype
          (MoE without dense layers: 3 · T · top-k · expert_intermediate / TP · dtype)
          logits (bf16 and fp32 copies)   S · vocab · (dtype + 4)

    An estimate, not a measurement: the profiler replaces it with the measured peak.
    """
    t, tp, d = max_num_batched_tokens, tensor_parallel_size, model.dtype_bytes
    rows = min(t, max_num_seqs)
    mlp = model.mlp_matrices * t * model.intermediate_size // tp * d   # gate/up or fc1 out + act
    if model.is_moe and not model.first_dense_layers:
        # every layer routes: each token's top-k expert activations (gate/up out + SiLU);
        # an estimate of the same kind, not a measured fused-MoE workspace
        mlp = 3 * t * model.experts_per_token * model.expert_intermediate // tp * d
    logits = rows * model.vocab_size * (d + 4)
    return 2 * t * model.hidden_size * d + max(mlp, logits)


def kv_capacity_blocks(model: ModelCard, hw: HardwareSpec, *, block_size: int,
                       gpu_memory_utilization: float, tensor_parallel_size: int = 1,
                       max_num_batched_tokens: int, max_num_seqs: int = 256,
                       expert_parallel_size: int = 1, block_bytes: int | None = None,
                       extra_weight_bytes: float = 0.0) -> int:
    """KV blocks per rank (every rank holds the same blocks' share of heads). With expert
    parallelism the routed experts are split over ``expert_parallel_size`` ranks instead of
    being TP-sharded (:meth:`ModelCard.weight_bytes_per_rank`). ``block_bytes`` and
    ``extra_weight_bytes`` (a speculative drafter's KV in the same blocks, and its weights)
    replace the block's bytes and add to the weights.

    Raises ConfigError on ``engine.gpu_memory_utilization`` when weights and activations leave
    no room for a single block.
    """
    tp = tensor_parallel_size
    block = block_bytes or kv_block_bytes(model, block_size, tp)
    budget = hw.mem_bytes * gpu_memory_utilization
    weights = model.weight_bytes_per_rank(tp, expert_parallel_size)
    if extra_weight_bytes:
        weights += extra_weight_bytes
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
