"""Each replica resolved once: the values vLLM would compute at start-up, from a scenario.

A :class:`ReplicaSpec` is built when a scenario (or a replica group's scenario) is validated
(``Scenario.replica``) and is everything that building the replica needs: the scheduler's
limits, chunking and token budget as the policy and the engine knobs decide them, the KV
cache's blocks (device and host), and the bytes of one block on one rank (what a swap moves
and what a KV transfer prices). Nothing downstream re-derives them.

    KV block bytes (one rank) = block_size · 2 (K and V) · layers (of its pipeline stage)
                                · KV heads per rank
                                · head_dim · KV dtype bytes   (MLA: block_size · layers ·
                                latent width · KV dtype bytes, whole on every rank)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simserve.errors import ConfigError
from simserve.kv.capacity import kv_block_bytes, kv_capacity_blocks, stage_block_bytes
from simserve.sched import describe
from simserve.sched.limits import SchedulerLimits

if TYPE_CHECKING:
    from simserve.config import Scenario


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    """One replica of a scenario, resolved (see the module docstring)."""

    policy: str
    params: Any                    # the policy's knobs (sched.params), or None
    limits: SchedulerLimits        # max_num_seqs, token budget, chunking, threshold, preemption
    max_model_len: int
    block_size: int
    num_gpu_blocks: int            # device KV blocks; 0 when none fit (``kv_error`` says why)
    reserved_blocks: int           # of those, kept out of use by the policy (vLLM's null block)
    num_host_blocks: int           # host swap space, in blocks (0 without swap preemption)
    kv_block_bytes: int            # one block's K and V on one rank (with pipeline stages: on a
                                   # rank of the stage with the most layers)
    prefix_caching: bool
    tensor_parallel_size: int
    kv_error: str = ""             # why no KV block fits the device memory, if none does
    num_offload_blocks: int = 0    # host-memory KV tier (kv_offloading_size), in blocks per rank

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token on one rank (what a KV transfer moves per token and rank)."""
        return self.kv_block_bytes // self.block_size

    @property
    def usable_blocks(self) -> int:
        """The device blocks the policy's block manager gets."""
        return self.num_gpu_blocks - self.reserved_blocks

    def check_kv(self) -> None:
        """Raise the KV-capacity error, if this replica has no room for a KV block."""
        if self.kv_error:
            raise ConfigError("engine.gpu_memory_utilization", self.kv_error)


def resolve(s: Scenario) -> ReplicaSpec:
    """The replica a (validated) scenario describes. A KV cache that does not fit is recorded,
    not raised: a sweep reports it as that point's error when its replicas are built."""
    facts = describe(s.policy)
    e = s.engine
    max_model_len = e.max_model_len or s.model.max_position_embeddings
    chunked = facts.chunked if facts.chunked is not None else \
        (True if e.enable_chunked_prefill is None else e.enable_chunked_prefill)
    # vLLM's defaults: a fixed chunk budget with chunked prefill, else room for any prompt
    budget = e.max_num_batched_tokens if e.max_num_batched_tokens is not None else \
        (8192 if chunked else max(max_model_len, 2048))
    limits = SchedulerLimits(max_num_seqs=e.max_num_seqs, max_num_batched_tokens=budget,
                             enable_chunked_prefill=chunked,
                             long_prefill_token_threshold=e.long_prefill_token_threshold,
                             preemption_mode=e.preemption_mode,
                             max_model_len=max_model_len,
                             reserve_full_sequence=e.scheduler_reserve_full_isl,
                             speculative_config=e.speculative_config,
                             async_scheduling=e.async_scheduling,
                             pipeline_parallel_size=e.pipeline_parallel_size)
    tp, pp = e.tensor_parallel_size, e.pipeline_parallel_size
    block_bytes = kv_block_bytes(s.model, e.block_size, tp)
    if pp > 1:    # a rank holds its stage's layers' K and V: the largest stage's share
        block_bytes = max(stage_block_bytes(s.model, e.block_size, tp, pp))
    # an EAGLE / MTP / draft-model drafter keeps its own layers' KV in the same blocks and
    # its weights on every rank (latency/spec.py says which card prices it)
    drafter = None
    if e.speculative_config is not None:
        from simserve.latency.spec import drafter_card, drafter_weight_bytes
        drafter = drafter_card(s.model, e.speculative_config)
    extra_weights = 0.0
    if drafter is not None:
        block_bytes += kv_block_bytes(drafter, e.block_size, tp)
        assert e.speculative_config is not None      # a drafter comes from it
        extra_weights = drafter_weight_bytes(drafter, e.speculative_config, tp)
    blocks, error = e.num_gpu_blocks, ""
    if blocks is None:
        try:
            blocks = kv_capacity_blocks(s.model, s.hardware, block_size=e.block_size,
                                        gpu_memory_utilization=e.gpu_memory_utilization,
                                        tensor_parallel_size=tp, max_num_batched_tokens=budget,
                                        expert_parallel_size=tp * e.data_parallel_size
                                        if e.enable_expert_parallel else 1,
                                        # the model's own block unless a drafter adds
                                        block_bytes=block_bytes if drafter else None,
                                        extra_weight_bytes=extra_weights,
                                        pipeline_parallel_size=pp)
        except ConfigError as err:
            blocks, error = 0, err.message
    host = math.floor(e.swap_space_gb * 2**30 / block_bytes) if e.preemption_mode == "swap" \
        else 0
    if not error and blocks <= facts.reserved_blocks:
        error = ("no memory is left for the KV cache after the weights; raise it, use more "
                 "tensor parallelism, or set engine.num_gpu_blocks")
    offload = 0
    if e.kv_offloading_size is not None:
        from simserve.kv.offload import host_blocks
        offload = host_blocks(e.kv_offloading_size, tp, block_bytes)
    return ReplicaSpec(s.policy, s.policy_params, limits, max_model_len, e.block_size, blocks,
                       facts.reserved_blocks, host, block_bytes, e.enable_prefix_caching, tp,
                       error, offload)
