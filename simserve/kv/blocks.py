"""Paged KV cache accounting: fixed-size blocks on the device, optional host swap space.

Query/command pairs that fail with ``None`` instead of raising (the nano-vllm habit,
nanovllm/engine/block_manager.py): back-pressure is normal, not an error. A request holds
``ceil(tokens / block_size)`` blocks; blocks are counted, not named (prefix caching, which needs
block identities, is the subclass ``kv.prefix.PrefixBlockManager``; this path stays counting only).

    block_size = 4, request holds 7 tokens:
    [t t t t][t t t .]   -> 2 blocks; token 8 fits, token 9 needs a third block
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType


class BlockManager:
    caches_prefixes = False   # True for kv.prefix.PrefixBlockManager (blocks with identities)

    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0):
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_host_blocks = num_host_blocks
        self.num_free = num_blocks
        self.num_host_free = num_host_blocks
        self._held: dict[int, int] = {}      # request id -> device blocks
        self._swapped: dict[int, int] = {}   # request id -> host blocks
        # the same counts, read-only, for the scheduler's per-request loops (a method call
        # per request would cost more than the lookup)
        self.blocks_held: Mapping[int, int] = MappingProxyType(self._held)

    # -- queries ---------------------------------------------------------------------------
    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def held(self, request_id: int) -> int:
        return self._held.get(request_id, 0)

    def num_new_blocks(self, request_id: int, num_tokens: int) -> int:
        """Blocks that must be added so ``request_id`` can hold ``num_tokens`` tokens."""
        return max(0, -(-num_tokens // self.block_size) - self._held.get(request_id, 0))

    def can_allocate(self, request_id: int, num_tokens: int, reserve: int = 0) -> bool:
        """True if the request could grow to ``num_tokens`` leaving ``reserve`` blocks free."""
        return self.num_new_blocks(request_id, num_tokens) + reserve <= self.num_free

    def can_hold(self, request_id: int, num_tokens: int, cached_tokens: int = 0) -> bool:
        """True if the request could hold ``num_tokens`` tokens now (its first
        ``cached_tokens`` being prefix-cache hits, which only a prefix cache has)."""
        # (num_new_blocks written out: checked at every admission; a shrink, < 0, always fits)
        return -(-num_tokens // self.block_size) - self._held.get(request_id, 0) <= self.num_free

    # -- commands --------------------------------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int) -> int | None:
        """Grow the request's blocks to hold ``num_tokens``; the number added, or None if full.

        Never shrinks and never allocates partially: on None nothing changed.
        """
        held = self._held.get(request_id, 0)
        need = -(-num_tokens // self.block_size) - held
        if need <= 0:
            return 0
        if need > self.num_free:
            return None
        self.num_free -= need
        self._held[request_id] = held + need
        return need

    def allocate_all(self, requests: Iterable[tuple[int, int]]) -> int | None:
        """Bulk :meth:`allocate`: grow each ``(request id, num_tokens)``; all or nothing. The
        number of blocks added, or None (nothing changed) if they do not all fit."""
        bs, held = self.block_size, self._held
        grow = []
        added = 0
        for rid, num_tokens in requests:
            h = held.get(rid, 0)
            need = -(-num_tokens // bs)
            if need > h:
                grow.append((rid, need))
                added += need - h
        if added > self.num_free:
            return None
        self.num_free -= added
        held.update(grow)
        return added

    def grow_to(self, requests: list[tuple[int, int]], added: int | None = None) -> int | None:
        """Bulk growth in blocks: each ``(request id, blocks)`` to hold that many (no fewer than
        now); all or nothing. The blocks added, or None (nothing changed) if they do not fit.
        ``added``: that number, when the caller has counted it already (a fast-forward stretch
        knows each member's blocks before and after: sched/stretch.py), sparing the pass that
        counts it."""
        held = self._held
        if added is None:
            added = 0
            for rid, n in requests:
                added += n - held.get(rid, 0)
        if added > self.num_free:
            return None
        self.num_free -= added
        held.update(requests)
        return added

    def grow_decodes(self, request_ids: Sequence[int], num_tokens: Sequence[int]) -> bool:
        """Room for one more token each: request ``request_ids[j]`` holds ``num_tokens[j]``
        tokens and is about to write the next. All or nothing: False, and nothing changed, if
        the blocks they need do not all fit. (``allocate_all`` of ``num_tokens[j] + 1`` each,
        in fewer operations: this runs for every decode step.)

            block_size 4:  c = 8  [x x x x][x x x x]   token 9 needs a third block
                           c = 6  [x x x x][x x . .]   token 7 fits
        """
        bs, held = self.block_size, self._held
        # c tokens fill their blocks exactly when c is a multiple of bs and held = c / bs
        grow = [(i, c // bs + 1) for i, c in zip(request_ids, num_tokens)
                if not c % bs and held.get(i, 0) <= c // bs]
        if grow:
            added = sum(need - held.get(i, 0) for i, need in grow)
            if added > self.num_free:
                return False
            self.num_free -= added
            held.update(grow)
        return True

    def free(self, request_id: int) -> int:
        """Release all device blocks of the request; returns how many."""
        n = self._held.pop(request_id, 0)
        self.num_free += n
        return n

    def release(self, request_id: int, num_tokens: int | None = None) -> int:
        """:meth:`free` the blocks of a request that finished (holding ``num_tokens`` tokens,
        if given: a prefix cache may cache the blocks they fill first)."""
        return self.free(request_id)

    def swap_out(self, request_id: int) -> int | None:
        """Move the request's device blocks to host memory; None if the host has no room."""
        n = self._held.get(request_id, 0)
        if n > self.num_host_free:
            return None
        self.free(request_id)
        self.num_host_free -= n
        self._swapped[request_id] = n
        return n

    def swap_in(self, request_id: int) -> int | None:
        """Bring swapped blocks back to the device; None if the device has no room."""
        n = self._swapped.get(request_id, 0)
        if n > self.num_free:
            return None
        del self._swapped[request_id]
        self.num_host_free += n
        self.num_free -= n
        self._held[request_id] = self._held.get(request_id, 0) + n
        return n

    def take_loaded(self) -> int:
        """Blocks loaded from a host-memory KV tier by admissions since the last call (a
        tier is kv/offload.py's; none here)."""
        return 0

    def swapped_blocks(self, request_id: int) -> int:
        return self._swapped.get(request_id, 0)
