"""KV offload to host memory (issue #18): a host tier behind the prefix cache, as vLLM 0.32's
native CPU offloading (``kv_offloading_size``, ``kv_offloading_backend: native``;
``v1/kv_offload/``, ``distributed/kv_transfer/kv_connector/v1/offloading/``).

* **Capacity**: ``kv_offloading_size`` GiB in all, summed over the TP ranks (vLLM's meaning),
  so ``floor(size · 2^30 / TP / block_bytes_per_rank)`` blocks per rank, LRU.
* **Store, write-through**: every block that becomes full (its KV computed, so cached on the
  device) is copied to the host tier too, not only on eviction (vLLM's offloading scheduler
  stores chunks as they are computed). The copy is device → host and asynchronous: it occupies
  the link, not the step, and is counted (``num_stored``) but not priced.
* **Load**: a new request takes the longest run of its blocks cached on the device, then
  continues in the host tier; the host hits are loaded host → device at the host link's
  bandwidth and become device blocks like any other. vLLM loads them asynchronously while the
  request waits (others run); simserve charges the load to the step that admits the request
  (the plan's ``swap_in_blocks``, priced by every latency model at ``host_link_bandwidth``): the
  request's own wait is the same, the other requests' step is longer — conservative for them.

Requires prefix caching (block identities), as vLLM's connector does; recompute preemption
only. Not modelled: LMCache (``lmcache`` backend: capacity then comes from its server), chunk
sizes above one block, ``store_threshold``, the ARC policy.
"""

from __future__ import annotations

from collections import OrderedDict

from simserve.kv.prefix import PrefixBlockManager
from simserve.workload.spec import SOURCE_BLOCK_SIZE

GIB = 2**30


def host_blocks(kv_offloading_size_gib: float, tensor_parallel_size: int,
                block_bytes_per_rank: int) -> int:
    """Host blocks per rank for vLLM's ``kv_offloading_size`` (total over the TP ranks)."""
    return int(kv_offloading_size_gib * GIB / tensor_parallel_size // block_bytes_per_rank)


class OffloadingBlockManager(PrefixBlockManager):
    """A prefix cache with a host-memory tier of ``num_offload_blocks`` blocks (LRU keys)."""

    def __init__(self, num_blocks: int, block_size: int, num_offload_blocks: int,
                 source_block_size: int = SOURCE_BLOCK_SIZE):
        super().__init__(num_blocks, block_size, 0, source_block_size)
        self.num_offload_blocks = num_offload_blocks
        self._host: OrderedDict[int, None] = OrderedDict()   # keys held on the host, LRU first
        self.num_stored = 0          # blocks copied device → host (write-through)
        self.num_loaded = 0          # blocks copied host → device (hits on the host tier)
        self.num_host_evicted = 0
        self._loading = 0            # blocks loaded by admissions since take_loaded()

    @property
    def num_host_used(self) -> int:
        return len(self._host)

    def take_loaded(self) -> int:
        """Blocks loaded host → device since the last call (the scheduler charges them to the
        step it is building)."""
        n, self._loading = self._loading, 0
        return n

    def _split(self, request_id: int, num_tokens: int) -> tuple[int, int]:
        """(device-cached blocks, host-cached blocks after them) at the start of a request,
        never covering its last token."""
        limit = (num_tokens - 1) // self.block_size
        keys = self._keys_upto(request_id, limit)
        gpu = 0
        while gpu < limit and keys[gpu] in self._cached:
            gpu += 1
        host = gpu
        while host < limit and keys[host] in self._host:
            host += 1
        return gpu, host - gpu

    def cached_tokens(self, request_id: int, num_tokens: int) -> int:
        gpu, host = self._split(request_id, num_tokens)
        return (gpu + host) * self.block_size

    def can_hold(self, request_id: int, num_tokens: int, cached_tokens: int = 0) -> bool:
        # host hits need device blocks like new ones; only device hits are shared
        gpu = self._device_hits(request_id, cached_tokens)
        return super().can_hold(request_id, num_tokens, gpu * self.block_size)

    def allocate_cached(self, request_id: int, num_tokens: int, cached_tokens: int) -> int | None:
        """Device hits shared, host hits loaded into new blocks (registered as cached once
        loaded), the rest new. All or nothing."""
        gpu = self._device_hits(request_id, cached_tokens)
        loaded = cached_tokens // self.block_size - gpu
        if gpu:
            got = super().allocate_cached(request_id, num_tokens, gpu * self.block_size)
        else:
            got = self.allocate(request_id, num_tokens)
        if got is None:
            return None
        # the loaded blocks hold their content now: cache them (as a computed block would be;
        # allocate() already did for every block num_tokens fills), which also refreshes
        # their host entries as most recently used
        self._register_full(request_id, cached_tokens)
        self.num_loaded += loaded
        self._loading += loaded
        return got

    def _device_hits(self, request_id: int, cached_tokens: int) -> int:
        if not cached_tokens:
            return 0
        keys = self._keys_upto(request_id, cached_tokens // self.block_size)
        gpu = 0
        while gpu < len(keys) and gpu < cached_tokens // self.block_size \
                and keys[gpu] in self._cached:
            gpu += 1
        return gpu

    def _register_full(self, request_id: int, num_tokens: int) -> None:
        start = self._num_keyed.get(request_id, 0)
        super()._register_full(request_id, num_tokens)
        full = self._num_keyed.get(request_id, 0)
        if full <= start or not self.num_offload_blocks:
            return
        keys, host = self._keys_upto(request_id, full), self._host
        for b in range(start, full):             # write-through of each newly full block
            key = keys[b]
            if key in host:
                host.move_to_end(key)
                continue
            host[key] = None
            self.num_stored += 1
            if len(host) > self.num_offload_blocks:
                host.popitem(last=False)
                self.num_host_evicted += 1
