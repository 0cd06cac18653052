"""Prefix caching: KV blocks with identities, a chained hash per full block, an LRU free pool.

The model is vLLM v1's (``vllm/v1/core/kv_cache_utils.py``, ``block_pool.py``,
``kv_cache_manager.py``; the same scheme as nano-vllm's ``block_manager.py`` and, over a radix
tree, SGLang's ``RadixCache``):

* a full block's key is ``hash((parent key, the block's content))``, so equal keys mean equal
  content *and* equal everything before it;
* a block becomes cached when it is full, at schedule time (``allocate`` covering its last
  token); a new request takes the longest run of cached blocks from its start, but never its
  last prompt token, which must be recomputed to sample (vLLM: ``max_cache_hit_length =
  num_tokens - 1``);
* a block whose content is already cached elsewhere is cached too (vLLM does not de-duplicate:
  block tables are append-only); a hit takes the oldest copy still cached;
* freed blocks keep their key and go to the tail of an LRU free pool (vLLM's free-block queue), a
  request's blocks in reverse order so its tail is evicted first; freed blocks with no cached
  content go to the pool's head instead (reused first); a new block is taken from the head and
  loses its key then. A hit on a block in the pool takes it back out.

The pool is kept as vLLM's queue would be, but cheaply: a deque of *segments*, each the blocks
one free put there (a request's table, or its keyed or unkeyed part: its keyed blocks, cached
content or ``_DEAD``, lead it, ``_num_keyed`` of them), and a per-block mark naming the segment
a free block is in (``_where``; 0 while held). A free appends one segment and marks its blocks;
a hit only unmarks; a take pops from the head segment, passing over blocks whose mark names
another segment (hit, or freed again since). Only blocks two or more requests hold carry a count
(``_extra``). Segments are compacted when their stale entries outgrow the cache.

Requests carry no token ids, so content is derived. With Mooncake ``hash_ids`` (one id per
``source_block_size`` = 512 prompt tokens; equal ids = identical content), engine block ``b`` of
size ``B`` covers tokens ``[bB, (b+1)B)`` and its content is the ids of every 512-block it
overlaps; chaining the parent key makes it equal across requests exactly when those ids and
everything before them are equal::

    source blocks (512)   |      id 7       |      id 9       |  id 4 ...
    engine blocks (B=256) |  b0    |  b1    |  b2    |  b3    |  b4
    key(b2) = hash((key(b1), (9,)))        key(b1) = hash((key(b0), (7,)))

Blocks without such content (no ``hash_ids``, ids that run out, a block past the prompt or
holding generated tokens) get keys unique to the request: nobody else hits them, but the request
itself does after a recompute preemption, as in vLLM. Swap is not supported (vLLM v1 preempts by
recompute only): ``swap_out`` reports no host room, so a swap preemption falls back to
recompute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import islice
from operator import itemgetter

from simserve.kv.blocks import BlockManager

SOURCE_BLOCK_SIZE = 512   # tokens per Mooncake hash id
_ROOT = 0                 # parent key of block 0
# Keys of blocks whose content no other request has: ``_UNIQUE + (request id << 32) + block``,
# outside the range of Python's hash() (a key's only job is to be equal exactly when content
# is, and a chained hash of ("request", id) would be unique too, only dearer)
_UNIQUE = 1 << 64
_MEMO_MAX = 1 << 16       # content chains remembered (by hash_ids), cleared when full
# The key of a block whose content only a finished request had (``release``): nobody can hit
# it, but it held content all the same (freed to the pool's tail, counted when evicted).
# hash() never returns -1, and _UNIQUE keys are larger, so it is no key of any content.
_DEAD = -1
_first = itemgetter(0)


class PrefixBlockManager(BlockManager):
    """A :class:`BlockManager` whose blocks have ids, keys, holder counts and an LRU pool."""

    caches_prefixes = True
    # entries the free pool's segments may list beyond three per block before it is compacted
    # (and beyond one per block between counts): see _tidy
    _slack = 4096

    def __init__(self, num_blocks: int, block_size: int, num_host_blocks: int = 0,
                 source_block_size: int = SOURCE_BLOCK_SIZE):
        super().__init__(num_blocks, block_size, 0)
        self.source_block_size = source_block_size
        self._key: list[int | None] = [None] * num_blocks
        # the free pool (vLLM's free-block queue) as segments: the deque's right end is the
        # pool's head (taken next), its left end the tail; each segment is ``[-serial, block,
        # ...]``, its last block taken first. A block is free, in segment ``serial``, while
        # ``_where[block] == serial`` (> 0); 0 while held. Block 0 is taken first at the start.
        self._where = [1] * num_blocks
        self._segs: deque[list[int]] = deque([[-1, *range(num_blocks - 1, -1, -1)]])
        self._serial = 1
        self._entries = num_blocks              # blocks listed in segments (stale ones too)
        self._compact_at = 2 * num_blocks + self._slack
        # block -> requests holding it beyond the first, for blocks two or more hold (hits on
        # blocks in use); a held block not in here has one holder
        self._extra: dict[int, int] = {}
        # key -> the blocks holding that content, oldest first: vLLM does not de-duplicate
        # (block tables are append-only), so two requests computing the same content each keep
        # a copy, and a hit takes the oldest copy still cached (BlockHashToBlockMap)
        self._cached: dict[int, list[int]] = {}
        self._tables: dict[int, list[int]] = {}         # request id -> its block ids, in order
        self._num_keyed: dict[int, int] = {}            # request id -> leading blocks registered
        self.keyed_blocks: Mapping[int, int] = self._num_keyed   # (read-only, for the scheduler)
        self._content: dict[int, tuple[int, Sequence[int] | None]] = {}
        self._keys: dict[int, list[int]] = {}           # request id -> keys computed so far
        # hash_ids -> the chained keys of the blocks they name, as far as computed (a chain
        # depends on the ids alone: recurring prompts compute theirs once)
        self._chains: dict[Sequence[int], list[int]] = {}
        self.num_evicted = 0                            # cached blocks reused for other content
        # async scheduling: request id -> its tokens whose content is known (sampled and
        # delivered); blocks past them are not cached yet (limit_cache)
        self._limit: dict[int, int] = {}
        # (the same table, for the scheduler's launch and deliver loops: limit_cache written
        # out, a dict store or pop per request and step instead of a call)
        self.cache_limits = self._limit
        # request id -> tokens whose full blocks are to be cached before anything can see them
        # (``defer``: a fast-forwarded stretch's decodes)
        self._deferred: dict[int, int] = {}

    # -- content ---------------------------------------------------------------------------
    def register(self, request_id: int, num_prompt_tokens: int,
                 hash_ids: Sequence[int] | None) -> None:
        """Tell the cache what a request's prompt holds (before its first allocation)."""
        if request_id not in self._content:   # (a tuple: content chains are kept by it)
            self._content[request_id] = (num_prompt_tokens,
                                         None if hash_ids is None else tuple(hash_ids))

    def _keys_upto(self, request_id: int, n: int) -> list[int]:
        """The request's block keys, computed (once) at least up to block ``n``: block b's
        content is the source ids it overlaps while it lies inside the prompt and the ids
        (chained: ``_chain``); past that its content is the request's own (``_UNIQUE``)."""
        keys = self._keys.get(request_id)
        if keys is None:
            prompt, ids = self._content.get(request_id, (0, None))
            keys = []
            if ids:
                shared = min(prompt, len(ids) * self.source_block_size) // self.block_size
                if shared:
                    keys = self._chain(ids, shared)[:shared]
            self._keys[request_id] = keys
        if len(keys) < n:
            base = _UNIQUE + (request_id << 32)
            keys.extend(range(base + len(keys), base + n))
        return keys

    def _chain(self, ids: Sequence[int], n: int) -> list[int]:
        """The chained keys of the first ``n`` blocks whose content ``ids`` name: block b's
        key is ``hash((key of b - 1, the ids it overlaps))``."""
        chains = self._chains
        chain = chains.get(ids)
        if chain is None:
            if len(chains) >= _MEMO_MAX:
                chains.clear()
            chain = chains[ids] = []
        if len(chain) < n:
            bs, src = self.block_size, self.source_block_size
            parent = chain[-1] if chain else _ROOT
            for b in range(len(chain), n):
                parent = hash((parent, tuple(ids[b * bs // src: ((b + 1) * bs - 1) // src + 1])))
                chain.append(parent)
        return chain

    # -- queries ---------------------------------------------------------------------------
    def held(self, request_id: int) -> int:
        table = self._tables.get(request_id)
        return len(table) if table else 0

    def num_new_blocks(self, request_id: int, num_tokens: int) -> int:
        return max(0, self.blocks_for(num_tokens) - self.held(request_id))

    def cached_tokens(self, request_id: int, num_tokens: int) -> int:
        """Tokens at the start of a request (holding no blocks) already in the cache: whole
        blocks, never its last token (it is recomputed to sample the next one)."""
        limit = (num_tokens - 1) // self.block_size
        keys, cached = self._keys_upto(request_id, limit), self._cached
        n = 0
        while n < limit and keys[n] in cached:
            n += 1
        return n * self.block_size

    def can_hold(self, request_id: int, num_tokens: int, cached_tokens: int = 0) -> bool:
        """As the base class; a new request's ``cached_tokens`` share cached blocks, but a hit
        on a block in the free pool takes that block out of it, so it counts against the free
        blocks as a new one would (vLLM's ``get_num_blocks_to_allocate``: evictable hits)."""
        if request_id in self._tables or not cached_tokens:
            return self.num_new_blocks(request_id, num_tokens) <= self.num_free
        keys = self._keys_upto(request_id, cached_tokens // self.block_size)
        hits = [self._cached[keys[b]][0] for b in range(cached_tokens // self.block_size)]
        where = self._where
        from_pool = sum(1 for bid in hits if where[bid])
        return max(0, self.blocks_for(num_tokens) - len(hits)) + from_pool <= self.num_free

    def decode_views(self) -> tuple[Mapping[int, int], Mapping[int, int]]:
        """For a step's decodes (``Scheduler.decode_all``): per request, the blocks it holds
        and its leading blocks cached (read-only). A decode whose token needs no new block and
        fills none (its full blocks all cached already) would find :meth:`allocate` changes
        nothing, so it may skip the call. A stretch's deferred blocks (:meth:`defer`) are
        cached first: stepping had cached them as they filled, and the order in which
        requests cache blocks of their own content (keys no other request has) changes
        nothing another could see."""
        if self._deferred:
            for rid, n in self._deferred.items():
                self.cache_upto(rid, n)
            self._deferred.clear()
        return self._held, self.keyed_blocks

    # -- commands --------------------------------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int) -> int | None:
        table = self._tables.setdefault(request_id, [])
        need = self.blocks_for(num_tokens) - len(table)
        if need > self.num_free:
            if not table:
                del self._tables[request_id]
            return None
        for _ in range(max(0, need)):
            table.append(self._take())
        self._held[request_id] = len(table)   # the counting view (blocks_held)
        if self._deferred:                    # (covered by what this caches now)
            self._deferred.pop(request_id, None)
        self._register_full(request_id, table, num_tokens)
        return max(0, need)

    def allocate_cached(self, request_id: int, num_tokens: int, cached_tokens: int) -> int | None:
        """Allocate for a new request whose first ``cached_tokens`` (from :meth:`cached_tokens`)
        are cache hits: they share the cached blocks; the rest are new. All or nothing."""
        assert request_id not in self._tables and cached_tokens % self.block_size == 0
        keys = self._keys_upto(request_id, cached_tokens // self.block_size)
        hits = [self._cached[keys[b]][0] for b in range(cached_tokens // self.block_size)]
        where = self._where
        pooled = [bid for bid in hits if where[bid]]
        need = self.blocks_for(num_tokens) - len(hits)
        if len(pooled) + max(0, need) > self.num_free:
            return None
        return self.allocate_hits(request_id, num_tokens, hits, pooled)

    def allocate_all(self, requests: Iterable[tuple[int, int]]) -> int | None:
        """:meth:`allocate` each ``(request id, num_tokens)`` in order, all or nothing."""
        requests = list(requests)
        need = sum(self.num_new_blocks(rid, n) for rid, n in requests)
        if need > self.num_free:
            return None
        for rid, n in requests:
            self.allocate(rid, n)
        return need

    def grow_to(self, requests: list[tuple[int, int]], added: int | None = None) -> int | None:
        return self.allocate_all((rid, n * self.block_size) for rid, n in requests)

    def grow_decodes(self, request_ids: Sequence[int], num_tokens: Sequence[int]) -> bool:
        return self.allocate_all(
            (rid, n + 1) for rid, n in zip(request_ids, num_tokens)) is not None

    def free(self, request_id: int) -> int:
        """Release the request's blocks into the pool, tail first (evicted first): cached ones
        at the pool's tail, the others (no content worth keeping) at its head, to be reused
        first (vLLM's ``BlockPool.free_blocks``). A block another request holds too stays."""
        if self._deferred:
            n = self._deferred.pop(request_id, None)
            if n is not None:
                self.cache_upto(request_id, n)
        table = self._tables.pop(request_id, None)
        self._held.pop(request_id, None)
        nk = self._num_keyed.pop(request_id, 0)
        self._keys.pop(request_id, None)
        self._content.pop(request_id, None)
        if self._limit:
            self._limit.pop(request_id, None)
        if not table:
            return 0
        keyed, unkeyed = table[:nk], table[nk:]   # (cached content, or _DEAD; then none)
        extra = self._extra
        if extra:
            # held by others too (hits: keyed blocks): one holder less
            shared = extra.keys() & keyed
            if shared:
                for bid in shared:
                    e = extra[bid] - 1
                    if e:
                        extra[bid] = e
                    else:
                        del extra[bid]
                keyed = [b for b in keyed if b not in shared]
        # (the table's last block evicted first: a segment's last block is taken first)
        if keyed:                                 # to the tail
            self._segs.appendleft(self._segment(keyed))
        if unkeyed:                               # to the head, the last block at the very head
            self._segs.append(self._segment(unkeyed))
        self.num_free += len(keyed) + len(unkeyed)
        if self._entries > self._compact_at:
            self._tidy()
        return len(table)

    def release(self, request_id: int, num_tokens: int | None = None) -> int:
        """Free the blocks of a request that finished. Its own content (the blocks past the
        content its ``hash_ids`` name) can never be hit again: only the request itself hits it,
        after a preemption. So those blocks keep no key in the cache, only the mark that they
        hold content (``_DEAD``): freed to the pool's tail and counted as evicted when reused,
        exactly as with their keys. ``num_tokens``: the tokens it holds, whose full blocks are
        cached first (a fast-forwarded stretch caches the blocks its decodes fill only then)."""
        if self._deferred:
            n = self._deferred.pop(request_id, None)
            if num_tokens is None:
                num_tokens = n
        table = self._tables.get(request_id)
        if table is None and request_id not in self._content and request_id not in self._keys:
            return 0                       # (released already: by a stretch, at its end)
        if table:
            bs = self.block_size
            prompt, ids = self._content.get(request_id, (0, None))
            shared = min(prompt, len(ids) * self.source_block_size) // bs if ids else 0
            block_key = self._key
            if num_tokens is not None:
                start = self._num_keyed.get(request_id, 0)
                if start < shared:             # (content others may share: cached as ever)
                    self._register_full(request_id, table, min(num_tokens, shared * bs))
                    start = self._num_keyed.get(request_id, 0)
                full = min(num_tokens // bs, len(table))
                first = max(start, shared)
                if first < full:
                    for bid in table[first:full]:
                        block_key[bid] = _DEAD
                    self._num_keyed[request_id] = full   # (keyed blocks lead the table)
            keys = self._keys.get(request_id)
            if keys is not None and len(keys) > shared:   # its own content cached before
                cached = self._cached
                for key in keys[shared:]:
                    copies = cached.pop(key, None)
                    if copies:
                        for bid in copies:
                            block_key[bid] = _DEAD
        return self.free(request_id)

    def limit_cache(self, request_id: int, num_tokens: int | None) -> None:
        """Cache no block of the request past its first ``num_tokens`` tokens (None: no limit).
        With async scheduling a step is scheduled before the token it feeds has been
        sampled; vLLM caches a block only once its tokens are known (``allocate_slots`` caps
        at ``request.num_tokens``, which holds no output placeholders)."""
        if num_tokens is None:
            self._limit.pop(request_id, None)
        else:
            self._limit[request_id] = num_tokens

    def cache_upto(self, request_id: int, num_tokens: int) -> None:
        """Cache the request's blocks that its first ``num_tokens`` tokens fill (vLLM's
        AsyncScheduler, when a step's output is processed)."""
        table = self._tables.get(request_id)
        if table:
            self._register_full(request_id, table, num_tokens)

    # -- bulk verbs for fast-forward (sched/stretch.py) ----------------------------------------
    def extend(self, request_ids: Sequence[int]) -> None:
        """One new block each for ``request_ids``, taken from the pool's head in that order
        (what a decode step's ``allocate`` calls do for the decodes that start a block, with
        no block becoming full: a stretch registers the blocks its decodes fill with
        :meth:`cache_upto`, later). The blocks must be free (the caller checked)."""
        tables, held, block_key = self._tables, self._held, self._key
        cached, segs, where = self._cached, self._segs, self._where
        evicted = 0
        seg = segs[-1]
        serial = -seg[0]
        for rid in request_ids:
            while True:                             # (_take, inline)
                bid = seg.pop()
                if bid < 0:                         # the segment's mark: it is used up
                    segs.pop()
                    seg = segs[-1]
                    serial = -seg[0]
                elif where[bid] == serial:
                    break
            where[bid] = 0
            key = block_key[bid]
            if key is not None:
                if key != _DEAD:
                    copies = cached[key]
                    if len(copies) == 1:
                        del cached[key]
                    else:
                        copies.remove(bid)
                block_key[bid] = None
                evicted += 1
            table = tables[rid]
            table.append(bid)
            held[rid] = len(table)
        self.num_evicted += evicted
        self.num_free -= len(request_ids)

    def defer(self, request_id: int, num_tokens: int) -> None:
        """Cache the blocks the request's first ``num_tokens`` fill before anything could see
        them: at its next allocation, free or release. For blocks of its own content filled by
        a fast-forwarded stretch's decodes, which nobody can hit or evict while it holds them."""
        self._deferred[request_id] = num_tokens

    def pool_head(self, n: int) -> list[int]:
        """The first ``n`` blocks of the free pool: the next ones taken."""
        return list(islice(self._free_blocks(), n))

    def free_order(self) -> list[int]:
        """The free blocks in LRU order (vLLM's free-block queue; the first is taken next)."""
        return list(self._free_blocks())

    def _free_blocks(self) -> Iterator[int]:
        where = self._where
        for seg in reversed(self._segs):
            serial = -seg[0]
            for i in range(len(seg) - 1, 0, -1):
                bid = seg[i]
                if where[bid] == serial:
                    yield bid

    def _segment(self, blocks: list[int]) -> list[int]:
        """A new segment of ``blocks`` (in table order: the last is taken first), marked."""
        self._serial = serial = self._serial + 1
        where = self._where
        for bid in blocks:
            where[bid] = serial
        self._entries += len(blocks)
        seg = [-serial]
        seg += blocks
        return seg

    def _tidy(self) -> None:
        """Count the entries the segments still list (takes pop them); if the stale ones
        outnumber the blocks twice over, compact to one segment of the free blocks in pool
        order. Either way the next count is ``num_blocks`` entries later: amortised, a few
        steps per entry listed."""
        n = self.num_blocks
        self._entries = sum(map(len, self._segs))
        if self._entries > 3 * n + self._slack:
            self._compact()
        self._compact_at = self._entries + n + self._slack

    def _compact(self) -> None:
        """The free pool as one segment, in the same order, without stale entries."""
        order = self.free_order()
        order.reverse()
        self._segs = deque()
        self._entries = 0
        self._segs.append(self._segment(order))

    def lookup(self, request_id: int, num_tokens: int) -> tuple[list[int], list[int]]:
        """The blocks a new request would share (:meth:`cached_tokens`: one per cached block
        at its start), and of those the ones in the free pool (a hit takes them out of it)."""
        limit = (num_tokens - 1) // self.block_size
        keys = self._keys_upto(request_id, limit)
        found = list(map(self._cached.get, keys if len(keys) == limit else keys[:limit]))
        if None in found:
            del found[found.index(None):]
        hits: list[int] = list(map(_first, found))   # type: ignore[arg-type]
        where = self._where
        return hits, [bid for bid in hits if where[bid]]

    def allocate_hits(self, request_id: int, num_tokens: int, hits: list[int],
                      pooled: list[int]) -> int | None:
        """:meth:`allocate_cached` with the hits :meth:`lookup` found (this list becomes the
        request's table) and those of them in the pool, when nothing changed since: the caller
        has checked they and the new blocks fit."""
        where = self._where
        if len(pooled) < len(hits):        # hits on blocks in use: one holder more
            extra = self._extra
            for bid in hits:
                if not where[bid]:
                    extra[bid] = extra.get(bid, 0) + 1
        if pooled:                         # out of the pool (their entries go stale)
            for bid in pooled:
                where[bid] = 0
            self.num_free -= len(pooled)
        nh = len(hits)
        self._tables[request_id] = hits
        self._num_keyed[request_id] = nh
        bs = self.block_size
        need = -(-num_tokens // bs) - nh   # (allocate, written out)
        for _ in range(need):
            hits.append(self._take())
        self._held[request_id] = len(hits)
        if self._deferred:
            self._deferred.pop(request_id, None)
        if num_tokens // bs > nh:          # (blocks filled past the hits: cached now)
            self._register_full(request_id, hits, num_tokens)
        return max(0, need)

    def prompt_keys(self, request_id: int, num_tokens: int) -> list[int]:
        """The keys of the request's blocks that ``num_tokens`` fill."""
        return self._keys_upto(request_id, num_tokens // self.block_size)[
            :num_tokens // self.block_size]

    def swap_out(self, request_id: int) -> int | None:
        return None   # prefix caching preempts by recompute only (as vLLM v1)

    def swap_in(self, request_id: int) -> int | None:
        return None

    # -- internals -------------------------------------------------------------------------
    def _take(self) -> int:
        """A block from the pool's head (least recently freed); its cached content is lost."""
        segs, where = self._segs, self._where
        seg = segs[-1]
        while True:
            bid = seg.pop()
            if bid < 0:                    # the segment's mark: it is used up
                segs.pop()
                seg = segs[-1]
            elif where[bid] == -seg[0]:
                break
        where[bid] = 0
        self.num_free -= 1
        key = self._key[bid]
        if key is not None:
            if key != _DEAD:
                copies = self._cached[key]
                copies.remove(bid)
                if not copies:
                    del self._cached[key]
            self._key[bid] = None
            self.num_evicted += 1
        return bid

    def _register_full(self, request_id: int, table: list[int], num_tokens: int) -> None:
        """Cache the blocks that ``num_tokens`` fills (their KV is computed this step)."""
        if self._limit:
            limit = self._limit.get(request_id)
            if limit is not None and limit < num_tokens:
                num_tokens = limit
        full = min(num_tokens // self.block_size, len(table))
        start = self._num_keyed.get(request_id, 0)
        if full <= start:
            return
        keys, cached, block_key = self._keys_upto(request_id, full), self._cached, self._key
        for b in range(start, full):
            key, bid = keys[b], table[b]
            copies = cached.get(key)
            if copies is None:
                cached[key] = [bid]
            elif bid not in copies:    # a copy of cached content: cached too (see _cached)
                copies.append(bid)
            block_key[bid] = key
        self._num_keyed[request_id] = full
