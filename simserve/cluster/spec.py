"""Each replica resolved once: the values vLLM would compute at start-up, from a scenario.

A :class:`ReplicaSpec` is built when a scenario (or a replica group's scenario) is validated
(``Scenario.replica``: ``config.resolve_replica``) and is everything that building the replica
needs: the scheduler's limits, chunking and token budget as the policy and the engine knobs
decide them, the KV cache's blocks (device and host), and the bytes of one block on one rank
(what a swap moves and what a KV transfer prices). Nothing downstream re-derives them.

    KV block bytes (one rank) = block_size · 2 (K and V) · layers (of its pipeline stage)
                                · KV heads per rank
                                · head_dim · KV dtype bytes   (MLA: block_size · layers ·
                                latent width · KV dtype bytes, whole on every rank)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simserve.errors import ConfigError
from simserve.sched.batch import SchedulerLimits


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
    # the model's own K and V of one block, every layer, on one rank (no drafter's; with
    # pipeline stages the whole model's, which latency/pipeline.py shares out by layers): what
    # the latency models price a swapped block with
    model_block_bytes: int = 0
    kv_error_field: str = "engine.gpu_memory_utilization"   # the field ``kv_error`` names

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
            raise ConfigError(self.kv_error_field, self.kv_error)
