"""Contiguous per-request KV chunks from a buddy allocator: the memory management the vLLM
paper (Kwon et al., SOSP'23, §6.1) assumes for its Orca baselines ("We assume Orca uses the
buddy allocation algorithm to determine the memory address to store KV cache").

Each request gets one contiguous chunk, reserved at admission and held until it finishes; the
chunk is its reservation rounded up to a power of two of blocks (internal fragmentation), cut
from the smallest free power-of-two region that fits, splitting larger ones; freed chunks merge
with their free buddy. A request fits only if one free region is large enough, however many
blocks are free in all (external fragmentation)::

    pool of 12 blocks = aligned regions 8 + 4:   [0 . . . . . . .][8 . . .]
    reserve 3 blocks -> chunk of 4, split 8:      [A A A a][4 . . .][8 . . .]
    reserve 5 blocks -> chunk of 8: none free     (8 blocks free in all, largest region 4)

Counted in blocks like :class:`BlockManager` (``held`` is the whole chunk, so KV usage counts
the reservation with its rounding). A reservation larger than the largest region takes the
whole pool when it is empty (it runs alone), so whatever fits the pool is served eventually.
A chunk never grows: asking for more than it holds returns
None, and nothing is swapped (Orca never preempts).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simserve.kv.blocks import BlockManager


def pow2_at_least(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class BuddyBlockManager(BlockManager):
    def __init__(self, num_blocks: int, block_size: int):
        super().__init__(num_blocks, block_size, 0)
        self._chunk: dict[int, tuple[int, int]] = {}  # request id -> (address, size)
        self._free = self._regions()                 # region size -> free region addresses
        self.max_region = max(self._free)

    def _regions(self) -> dict[int, set[int]]:
        """The empty pool as aligned maximal power-of-two regions."""
        free: dict[int, set[int]] = {}
        addr = 0
        for bit in reversed(range(self.num_blocks.bit_length())):
            size = 1 << bit
            if self.num_blocks - addr >= size:
                free.setdefault(size, set()).add(addr)
                addr += size
        return free

    def largest_free(self) -> int:
        """Blocks of the largest free region (what the next request can get at most)."""
        return max((s for s, a in self._free.items() if a), default=0)

    def _fits(self, size: int) -> bool:
        return any(s >= size and a for s, a in self._free.items())

    def can_allocate(self, request_id: int, num_tokens: int, reserve: int = 0) -> bool:
        held = self._held.get(request_id, 0)
        need = self.blocks_for(num_tokens)
        if held:
            return need <= held
        if pow2_at_least(need) > self.max_region:
            return need <= self.num_blocks and self.num_used == 0 and reserve == 0
        return self._fits(pow2_at_least(need)) and pow2_at_least(need) + reserve <= self.num_free

    def can_hold(self, request_id: int, num_tokens: int, cached_tokens: int = 0) -> bool:
        return self.can_allocate(request_id, num_tokens)

    def allocate(self, request_id: int, num_tokens: int) -> int | None:
        held = self._held.get(request_id, 0)
        need = self.blocks_for(num_tokens)
        if held:
            return 0 if need <= held else None      # contiguous: a chunk never grows
        if need == 0:
            return 0
        size = pow2_at_least(need)
        if size > self.max_region:
            # larger than any region: only the whole empty pool will do (the request runs alone)
            if need > self.num_blocks or self.num_used:
                return None
            self._free = {}
            self._chunk[request_id] = (0, self.num_blocks)
            self._held[request_id] = self.num_blocks
            self.num_free = 0
            return self.num_blocks
        region = min((s for s, a in self._free.items() if s >= size and a), default=None)
        if region is None:
            return None
        addr = min(self._free[region])              # lowest address: deterministic
        self._free[region].discard(addr)
        while region > size:                        # split, keep the upper halves free
            region //= 2
            self._free.setdefault(region, set()).add(addr + region)
        self._chunk[request_id] = (addr, size)
        self._held[request_id] = size
        self.num_free -= size
        return size

    # bulk verbs of BlockManager: a reserved chunk never grows, so each either fits already or
    # fails (a request without a chunk gets one through allocate)
    def allocate_all(self, requests: Iterable[tuple[int, int]]) -> int | None:
        requests = list(requests)
        if all(self.blocks_for(n) <= self._held.get(r, 0) for r, n in requests):
            return 0
        if len(requests) == 1:
            return self.allocate(*requests[0])
        return None

    def grow_to(self, requests: list[tuple[int, int]], added: int | None = None) -> int | None:
        return 0 if all(n <= self._held.get(r, 0) for r, n in requests) else None

    def grow_decodes(self, request_ids: Sequence[int], num_tokens: Sequence[int]) -> bool:
        return all(self.blocks_for(c + 1) <= self._held.get(r, 0)
                   for r, c in zip(request_ids, num_tokens))

    def free(self, request_id: int) -> int:
        if request_id not in self._chunk:
            return 0
        addr, size = self._chunk.pop(request_id)
        del self._held[request_id]
        self.num_free += size
        released = size
        if size == self.num_blocks:          # the whole pool (or its one region) comes back
            self._free = self._regions()
            return released
        while True:                                 # merge with the free buddy, if any
            buddy = addr ^ size
            peers = self._free.get(size)
            if not peers or buddy not in peers or buddy + size > self.num_blocks:
                break
            peers.discard(buddy)
            addr, size = min(addr, buddy), size * 2
        self._free.setdefault(size, set()).add(addr)
        return released

    def swap_out(self, request_id: int) -> int | None:
        return None

    def swap_in(self, request_id: int) -> int | None:
        return None
