"""How many KV blocks fit on a device, resolved the way vLLM resolves ``num_gpu_blocks``.

Per device (one tensor-parallel rank)::

    free   = mem_bytes × gpu_memory_utilization − weight_bytes / TP − activation_reserve
    blocks = floor(free / kv_block_bytes)

With pipeline parallelism (``pipeline_parallel_size`` p > 1) each stage's ranks hold that
stage's layers (:func:`pipeline_layers`, vLLM's split), the first stage the embedding, the last
the LM head (a copy of a tied embedding too), and the KV cache of their own layers only: a
block's bytes per rank shrink to the stage's layers, and a replica has as many blocks as its
tightest stage fits (vLLM takes the minimum over workers)::

    blocks = min over stages j of floor((mem × util − weights_j / TP − activation_reserve)
                                        / (kv_block_bytes × layers_j / layers))

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


def pipeline_layers(num_layers: int, pp: int) -> list[int]:
    """Layers of each pipeline stage, as vLLM splits them (``vllm/distributed/utils.py``,
    ``get_pp_indices``): evenly, the remainder going one each to the stages before the last,
    from the second-to-last backwards (the last stage holds the final norm and the LM head)."""
    parts = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        parts[-i] += 1
    return parts


def stage_weight_bytes(model: ModelCard, tp: int, ep: int, pp: int) -> list[float]:
    """Weights on one rank of each pipeline stage: the stage's share of the decoder layers
    (their mean size: an MoE card's dense first layers are spread evenly, an estimate), the
    embedding on the first stage, the final norm and the LM head on the last (with tied
    embeddings the last stage holds its own copy, as vLLM loads it)."""
    d, h = model.dtype_bytes, model.hidden_size
    embedding = (model.embedding_params + model.learned_positions * h) * d / tp
    head = model.embedding_params * d / tp
    norm = model.norm_params * d / tp
    layers = model.weight_bytes_per_rank(tp, ep) - embedding - norm \
        - (0.0 if model.tie_word_embeddings else head)
    per_layer = layers / model.num_layers
    out = [n * per_layer for n in pipeline_layers(model.num_layers, pp)]
    out[0] += embedding
    out[-1] += head + norm
    return out


def stage_block_bytes(model: ModelCard, block_size: int, tp: int, pp: int) -> list[int]:
    """One KV block's bytes on one rank of each stage (its layers' K and V only)."""
    per_layer = kv_block_bytes(model, block_size, tp) // model.num_layers
    return [n * per_layer for n in pipeline_layers(model.num_layers, pp)]


def check_weights_fit(model: ModelCard, hw: HardwareSpec, weights: float, tp: int,
                      pp: int = 1) -> None:
    """Raise ConfigError on ``model`` when one device's share of the weights (``weights``
    bytes: the heaviest pipeline stage's) is at least the device's whole memory: only more
    parallelism or a larger device helps, not ``gpu_memory_utilization``."""
    if weights < hw.mem_bytes:
        return
    parallel = f"tensor_parallel_size {tp}" + (f", pipeline_parallel_size {pp}" if pp > 1
                                               else "")
    more = "engine.tensor_parallel_size" + (" or engine.pipeline_parallel_size" if pp > 1
                                            else "")
    raise ConfigError("model", f"{model.name}'s weights need {weights / GB:.1f} GB per device "
                               f"({parallel}), more than the {hw.mem_bytes / GB:.1f} GB of "
                               f"{hw.name}: raise {more} or use a larger device")


def kv_capacity_blocks(model: ModelCard, hw: HardwareSpec, *, block_size: int,
                       gpu_memory_utilization: float, tensor_parallel_size: int = 1,
                       max_num_batched_tokens: int, max_num_seqs: int = 256,
                       expert_parallel_size: int = 1, block_bytes: int | None = None,
                       extra_weight_bytes: float = 0.0, pipeline_parallel_size: int = 1) -> int:
    """KV blocks per rank (every rank holds the same blocks' share of heads). With expert
    parallelism the routed experts are split over ``expert_parallel_size`` ranks instead of
    being TP-sharded (:meth:`ModelCard.weight_bytes_per_rank`). ``block_bytes`` and
    ``extra_weight_bytes`` (a speculative drafter's KV in the same blocks, and its weights)
    replace the block's bytes and add to the weights.

    Raises ConfigError on ``model`` when the weights alone exceed the device (no
    ``gpu_memory_utilization`` can help), else on ``engine.gpu_memory_utilization`` when weights
    and activations leave no room for a single block.
    """
    tp = tensor_parallel_size
    if pipeline_parallel_size > 1:
        if block_bytes is not None or extra_weight_bytes:
            # a speculative drafter's KV and weights: which stage holds them is not modelled
            # (config refuses speculative decoding with pipeline_parallel_size > 1)
            raise ValueError("kv_capacity_blocks: block_bytes and extra_weight_bytes (a "
                             "drafter's) are not modelled with pipeline_parallel_size > 1")
        return _pipeline_blocks(model, hw, block_size, gpu_memory_utilization, tp,
                                max_num_batched_tokens, max_num_seqs, expert_parallel_size,
                                pipeline_parallel_size)
    block = block_bytes or kv_block_bytes(model, block_size, tp)
    budget = hw.mem_bytes * gpu_memory_utilization
    weights = model.weight_bytes_per_rank(tp, expert_parallel_size)
    if extra_weight_bytes:
        weights += extra_weight_bytes
    check_weights_fit(model, hw, weights, tp)
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


def _pipeline_blocks(model: ModelCard, hw: HardwareSpec, block_size: int, util: float, tp: int,
                     max_num_batched_tokens: int, max_num_seqs: int, ep: int, pp: int) -> int:
    """``kv_capacity_blocks`` with pipeline stages: the fewest blocks any stage fits (the
    activation reserve counted on every stage alike: an estimate)."""
    budget = hw.mem_bytes * util
    reserve = activation_reserve_bytes(model, max_num_batched_tokens=max_num_batched_tokens,
                                       max_num_seqs=max_num_seqs, tensor_parallel_size=tp)
    fits = []
    check_weights_fit(model, hw, max(stage_weight_bytes(model, tp, ep, pp)), tp, pp)
    for j, (weights, block) in enumerate(zip(stage_weight_bytes(model, tp, ep, pp),
                                             stage_block_bytes(model, block_size, tp, pp))):
        free = budget - weights - reserve
        if free < block:
            raise ConfigError(
                "engine.gpu_memory_utilization",
                f"no room for the KV cache on pipeline stage {j}: {model.name} weights "
                f"({weights / GB:.2f} GB per device) and the activation reserve "
                f"({reserve / GB:.2f} GB) exceed {util:g} × {hw.mem_bytes / GB:.1f} GB of "
                f"{hw.name}; raise gpu_memory_utilization, tensor_parallel_size or "
                "pipeline_parallel_size, or use a larger device")
        fits.append(int(free // block))
    return min(fits)
