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

The pool is kept as vLLM's queue would be, but cheaply. Only blocks another request could hit
carry an identity: a request's leading blocks whose content its ``hash_ids`` name, and hits.
Its other blocks (past that content, or all of them without ``hash_ids``: content only the
request itself could hit, after a preemption) are *anonymous*, counted, not named: taking one
from a run of anonymous free blocks is a subtraction, and a finished request's go back as one
run. The pool is a deque of *segments*: blocks with identities one free put there (a request's
keyed blocks, in table order), with a per-block mark naming the segment a free block is in
(``_where``; 0 while held), or a run of anonymous blocks (``[count, dead]``: dead when they
hold content nobody can hit, counted as evicted when reused). A free appends a segment and
marks its blocks; a hit only unmarks; a take pops from the head segment, passing over blocks
whose mark names another segment (hit, or freed again since), or counts a run down. A
preempted request's anonymous blocks holding content are given identities and keys when it
frees them (it may hit them when it comes back). Only blocks two or more requests hold carry a
count (``_extra``). Segments are compacted when their stale entries outgrow the cache.

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
from collections.abc import Iterable, Mapping, Sequence
from itertools import islice
from operator import itemgetter

from simserve.kv.blocks import BlockManager
from simserve.workload.spec import SOURCE_BLOCK_SIZE

_ROOT = 0                 # parent key of block 0
# Keys of blocks whose content no other request has: ``_UNIQUE + (request id << 32) + block``,
# outside the range of Python's hash() (a key's only job is to be equal exactly when content
# is, and a chained hash of ("request", id) would be unique too, only dearer)
_UNIQUE = 1 << 64
_MEMO_MAX = 1 << 16       # content chains remembered (by hash_ids), cleared when full
# The key of a free block whose content only a finished request had: a copy of its own content
# cached at a preemption (``release``; its anonymous blocks go back as a dead run). Nobody can
# hit it, but it held content all the same (counted when evicted). hash() never returns -1,
# and _UNIQUE keys are larger, so it is no key of any content.
_DEAD = -1
_first = itemgetter(0)
# how free_order() shows anonymous free blocks: without content, and with content nobody can hit
ANON, ANON_DEAD = -1, -2


def _unstale(seg: list[int], where: list[int]) -> bool:
    """Drop the stale entries at the head end of the segment ``seg`` (whose last entry is
    stale: its block was hit, or freed again since) in one go, scanning its marks at C speed
    (a segment whose blocks were all hit holds only stale entries): False if none is live."""
    if -seg[0] not in map(where.__getitem__, islice(seg, 1, None)):
        return False                   # (usually: a segment whose blocks were all hit)
    marks = list(map(where.__getitem__, islice(seg, 1, None)))
    marks.reverse()
    try:
        j = marks.index(-seg[0])
    except ValueError:
        return False
    del seg[len(seg) - j:]
    return True


class PrefixBlockManager(BlockManager):
    """A :class:`BlockManager` whose blocks have keys, holder counts and an LRU pool; blocks
    that only their own request could ever hit are anonymous (see the module docstring)."""

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
        # pool's head (taken next), its left end the tail. A segment is either ``[-serial,
        # block, ...]`` (blocks with identities, its last block taken first; a block is free in
        # it while ``_where[block] == serial`` > 0, and 0 while held or anonymous) or an
        # anonymous run ``[count, dead]`` (count > 0; dead: 1 where they hold content, counted
        # as evicted when taken). At the start the pool is one run of blocks without content.
        self._where = [0] * num_blocks
        self._segs: deque[list[int]] = deque([[num_blocks, 0]] if num_blocks else [])
        self._serial = 1
        # the identities no block in use or in a segment has: one per anonymous block (held or
        # in a run); a block taken for a position that needs an identity gets one from here
        self._stash = list(range(num_blocks - 1, -1, -1))
        self._entries = 0                       # blocks listed in segments (stale ones too)
        self._open: dict[int, list[int]] = {}   # serial -> its segment, while in the deque
        self._compact_at = num_blocks + self._slack
        # block -> requests holding it beyond the first, for blocks two or more hold (hits on
        # blocks in use); a held block not in here has one holder
        self._extra: dict[int, int] = {}
        # key -> the blocks holding that content, oldest first: vLLM does not de-duplicate
        # (block tables are append-only), so two requests computing the same content each keep
        # a copy, and a hit takes the oldest copy still cached (BlockHashToBlockMap)
        self._cached: dict[int, list[int]] = {}
        # request id -> the identities of its leading blocks (those that hold content others
        # may share, and hits); its other blocks (``blocks_held`` counts them all) are anonymous
        self._tables: dict[int, list[int]] = {}
        self._num_keyed: dict[int, int] = {}            # request id -> leading blocks registered
        self.keyed_blocks: Mapping[int, int] = self._num_keyed   # (read-only, for the scheduler)
        self._content: dict[int, tuple[int, Sequence[int] | None]] = {}
        # request id -> its leading blocks whose content its hash_ids name (others may share)
        self._shared: dict[int, int] = {}
        self._keys: dict[int, list[int]] = {}           # request id -> keys computed so far
        # request id -> blocks of its own content cached when it was preempted (``_drop``):
        # their keys are in the cache until it finishes
        self._own: dict[int, int] = {}
        # hash_ids -> the chained keys of the blocks they name, as far as computed (a chain
        # depends on the ids alone: recurring prompts compute theirs once)
        self._chains: dict[Sequence[int], list[int]] = {}
        # lookup's memo: hash_ids -> (``_version`` then, the blocks looked up, the hits), and
        # the version, moved on whenever a shareable key's oldest cached copy changes (a key
        # cached first, or a copy evicted). A request's own keys are in no memo, so caching
        # them at a preemption or dropping them at its release does not move it.
        self._hit_memo: dict[Sequence[int] | None, tuple[int, int, tuple[int, ...]]] = {}
        self._version = 0
        self.num_evicted = 0                            # cached blocks reused for other content
        # async scheduling: request id -> its tokens whose content is known (sampled and
        # delivered); blocks past them are not cached yet (limit_cache)
        self._limit: dict[int, int] = {}
        # (the same table, for the scheduler's launch and deliver loops: limit_cache written
        # out, a dict store or pop per request and step instead of a call)
        self.cache_limits = self._limit

    # -- content ---------------------------------------------------------------------------
    def register(self, request_id: int, num_prompt_tokens: int,
                 hash_ids: Sequence[int] | None) -> None:
        """Tell the cache what a request's prompt holds (before its first allocation)."""
        if request_id not in self._content:   # (a tuple: content chains are kept by it)
            ids = None if hash_ids is None else tuple(hash_ids)
            self._content[request_id] = (num_prompt_tokens, ids)
            if ids:
                shared = min(num_prompt_tokens, len(ids) * self.source_block_size) \
                    // self.block_size
                if shared:
                    self._shared[request_id] = shared

    def _keys_upto(self, request_id: int, n: int) -> list[int]:
        """The request's block keys, computed (once) at least up to block ``n``: block b's
        content is the source ids it overlaps while it lies inside the prompt and the ids
        (chained: ``_chain``); past that its content is the request's own (``_UNIQUE``)."""
        keys = self._keys.get(request_id)
        if keys is None:
            shared = self._shared.get(request_id)
            keys = self._chain(self._content[request_id][1], shared)[:shared] if shared else []
            self._keys[request_id] = keys
        if len(keys) < n:
            base = _UNIQUE + (request_id << 32)
            keys.extend(range(base + len(keys), base + n))
        return keys

    def _chain(self, ids: Sequence[int] | None, n: int) -> list[int]:
        """The chained keys of the first ``n`` blocks whose content ``ids`` name: block b's
        key is ``hash((key of b - 1, the ids it overlaps))``."""
        assert ids is not None
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
    def cached_tokens(self, request_id: int, num_tokens: int) -> int:
        """Tokens at the start of a request (holding no blocks) already in the cache: whole
        blocks, never its last token (it is recomputed to sample the next one)."""
        if num_tokens <= self.block_size:
            return 0
        return len(self.hit_blocks(request_id, num_tokens)) * self.block_size

    def can_hold(self, request_id: int, num_tokens: int, cached_tokens: int = 0) -> bool:
        """As the base class; a new request's ``cached_tokens`` share cached blocks, but a hit
        on a block in the free pool takes that block out of it, so it counts against the free
        blocks as a new one would (vLLM's ``get_num_blocks_to_allocate``: evictable hits)."""
        if request_id in self._held or not cached_tokens:
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
        nothing, so it may skip the call."""
        return self._held, self.keyed_blocks

    # -- commands --------------------------------------------------------------------------
    def allocate(self, request_id: int, num_tokens: int) -> int | None:
        held = self._held
        h = held.get(request_id, 0)
        need = -(-num_tokens // self.block_size) - h
        if need > self.num_free:
            return None
        if need > 0:
            self._grow(request_id, h, need)
        elif request_id not in held:
            held[request_id] = h
        self._register_full(request_id, num_tokens)
        return max(0, need)

    def _grow(self, request_id: int, h: int, need: int, before: int = 0) -> None:
        """``need`` new blocks for the request holding ``h``: those at positions whose content
        others may share (``_shared``) with identities, the rest anonymous; ``before``
        anonymous blocks (other requests') taken off the pool's head first."""
        total = h + need
        ided = self._shared.get(request_id, 0) - h
        if ided > 0:
            if before:
                self.take_anonymous(before)
                before = 0
            if ided > need:
                ided = need
            table = self._tables.get(request_id)
            if table is None:
                table = self._tables[request_id] = []
            for _ in range(ided):
                table.append(self._take())
            need -= ided
        if need or before:
            self.take_anonymous(need + before)
        self._held[request_id] = total

    def allocate_cached(self, request_id: int, num_tokens: int, cached_tokens: int) -> int | None:
        """Allocate for a new request whose first ``cached_tokens`` (from :meth:`cached_tokens`)
        are cache hits: they share the cached blocks; the rest are new. All or nothing."""
        assert request_id not in self._held and cached_tokens % self.block_size == 0
        nb = cached_tokens // self.block_size
        hits = self.hit_blocks(request_id, num_tokens)
        if len(hits) > nb:
            del hits[nb:]
        elif len(hits) < nb:               # (counted for more tokens than it allocates)
            hits = self._find(self._keys_upto(request_id, nb), nb)
            assert len(hits) == nb, "allocate_cached: fewer blocks cached than counted"
        need = max(0, self.blocks_for(num_tokens) - nb)
        if nb + need > self.num_free:      # (unless it fits even if every hit is pooled)
            where = self._where
            if sum(1 for bid in hits if where[bid]) + need > self.num_free:
                return None
        return self.allocate_hits(request_id, num_tokens, hits)

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
        """:meth:`allocate_all` of ``num_tokens[j] + 1`` each, all or nothing; only the
        decodes that need a new block or fill one (to be cached) call :meth:`allocate`, in
        order (for the others it would change nothing)."""
        bs, held, keyed = self.block_size, self._held, self._num_keyed
        todo = [(rid, c + 1) for rid, c in zip(request_ids, num_tokens)
                if -(-(c + 1) // bs) > held.get(rid, 0) or (c + 1) // bs > keyed.get(rid, 0)]
        if todo:
            if sum(max(0, -(-n // bs) - held.get(rid, 0)) for rid, n in todo) > self.num_free:
                return False
            for rid, n in todo:
                self.allocate(rid, n)
        return True

    def free(self, request_id: int) -> int:
        """Release the request's blocks into the pool, tail first (evicted first): cached ones
        at the pool's tail, the others (no content worth keeping) at its head, to be reused
        first (vLLM's ``BlockPool.free_blocks``). A block another request holds too stays.
        Its anonymous blocks holding content are given identities and keys now: the request
        itself hits them if it comes back (a preemption)."""
        return self._drop(request_id, False)

    def release(self, request_id: int, num_tokens: int | None = None, grown: int = 0) -> int:
        """Free the blocks of a request that finished. Its own content (the blocks past the
        content its ``hash_ids`` name) can never be hit again: only the request itself hits it,
        after a preemption. So those blocks go to the pool's tail anonymous, marked as holding
        content (counted as evicted when reused), exactly where they would go with their keys;
        copies of its own content cached at a preemption lose their keys (``_DEAD``).
        ``num_tokens``: the tokens it holds, whose full blocks are cached first (a
        fast-forwarded stretch caches the blocks its decodes fill only then); ``grown``: the
        anonymous blocks :meth:`take_anonymous` took for it, credited first (:meth:`hand_over`)."""
        held = self._held
        h = held.get(request_id)
        if h is None:
            if request_id not in self._content and request_id not in self._keys:
                return 0                   # (released already: by a stretch, at its end)
        else:
            h += grown
            nk = self._num_keyed.get(request_id, 0)
            shared = self._shared.get(request_id, 0)
            if nk >= shared and h and not self._limit and not (
                    self._own and request_id in self._own):
                # the usual: the blocks others may share are cached, and the full blocks past
                # them hold its own content (none cached at a preemption): dead from now on
                if num_tokens is not None:
                    full = num_tokens // self.block_size
                    if full > h:
                        full = h
                    if full > nk:
                        nk = full
                del held[request_id]
                table = self._tables.pop(request_id, None)
                self._num_keyed.pop(request_id, None)
                self._keys.pop(request_id, None)
                self._content.pop(request_id, None)
                self._shared.pop(request_id, None)
                self._put_back(h, [] if table is None else table, shared, nk - shared)
                return h
            held[request_id] = h
        shared = self._shared.get(request_id, 0)
        if h and num_tokens is not None:
            nk = self._num_keyed.get(request_id, 0)
            if nk < shared:                # (content others may share: cached as ever)
                self._register_full(request_id, min(num_tokens, shared * self.block_size))
            full = min(num_tokens // self.block_size, h)
            # (its own content, past what others may share: no key needed)
            if full > max(self._num_keyed.get(request_id, 0), shared):
                self._num_keyed[request_id] = full
        top = self._own.pop(request_id, 0)
        if top > shared and h:             # its own content cached at a preemption
            cached, block_key = self._cached, self._key
            base = _UNIQUE + (request_id << 32)
            for key in range(base + shared, base + top):
                copies = cached.pop(key, None)
                if copies:
                    for bid in copies:
                        block_key[bid] = _DEAD
        return self._drop(request_id, True)

    def _drop(self, request_id: int, finished: bool) -> int:
        """Free the request's blocks (``free``; ``release`` when ``finished``): its keyed
        blocks with identities to the tail as a segment, its other blocks holding content to
        the tail just ahead of them (taken first) as a run, marked dead if ``finished``, or
        given identities and their keys if not; blocks without content to the head."""
        h = self._held.pop(request_id, 0)
        table = self._tables.pop(request_id, None)
        nk = self._num_keyed.pop(request_id, 0)
        self._keys.pop(request_id, None)
        self._content.pop(request_id, None)
        shared = self._shared.pop(request_id, 0)
        if self._limit:
            self._limit.pop(request_id, None)
        if not h:
            return 0
        if table is None:
            table = []
        dead = 0
        if finished:
            if nk > shared:
                dead, nk = nk - shared, shared
        elif nk > len(table):              # its own content, cached: identities and keys
            cached = self._cached
            base = _UNIQUE + (request_id << 32)
            stash, block_key = self._stash, self._key
            for b in range(len(table), nk):
                bid = stash.pop()
                key = base + b
                block_key[bid] = key
                copies = cached.get(key)
                if copies is None:
                    cached[key] = [bid]
                else:
                    copies.append(bid)
                table.append(bid)
            if nk > self._own.get(request_id, 0):
                self._own[request_id] = nk
        self._put_back(h, table, nk, dead)
        return h

    def _put_back(self, h: int, table: list[int], nk: int, dead: int) -> None:
        """The pool's side of ``_drop``: of the ``h`` blocks a request held, those of its
        ``table`` (identities) before ``nk`` to the tail as a segment (the blocks that others
        hold too only lose a holder), ``dead`` anonymous ones holding content nobody can hit
        to the tail just ahead of them, the rest (no content) to the head."""
        if len(table) > nk:                # identities no longer needed
            block_key = self._key
            rest = table[nk:]
            for bid in rest:
                block_key[bid] = None
            self._stash += rest
            del table[nk:]
        freed = table
        extra = self._extra
        if extra and table:
            # held by others too (hits: keyed blocks): one holder less
            both = extra.keys() & table
            if both:
                for bid in both:
                    e = extra[bid] - 1
                    if e:
                        extra[bid] = e
                    else:
                        del extra[bid]
                nb = len(both)         # (usually its leading blocks: a shared prefix)
                freed = table[nb:] if both.issuperset(table[:nb]) \
                    else [b for b in table if b not in both]
        segs = self._segs
        # (the table's last block evicted first: a segment's last block is taken first)
        if dead:                           # to the tail, ahead of its keyed blocks
            segs.appendleft([dead, 1])
        if freed:                          # a new segment, its blocks marked
            self._serial = serial = self._serial + 1
            where = self._where
            for bid in freed:
                where[bid] = serial
            self._entries += len(freed)
            seg = [-serial]
            seg += freed
            self._open[serial] = seg
            segs.appendleft(seg)
        fresh = h - nk - dead
        if fresh:                          # to the head
            head = segs[-1] if segs else None
            if head is not None and head[0] > 0 and not head[1]:
                head[0] += fresh
            else:
                segs.append([fresh, 0])
        self.num_free += len(freed) + dead + fresh
        if self._entries > self._compact_at:
            self._tidy()

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
        if self._held.get(request_id):
            self._register_full(request_id, num_tokens)

    # -- bulk verbs for fast-forward (sched/stretch.py) ----------------------------------------
    def hand_over(self, request_id: int, n: int, num_tokens: int | None = None) -> None:
        """Credit the request (holding blocks) with ``n`` anonymous blocks taken for it by
        :meth:`take_anonymous`, and cache the blocks its first ``num_tokens`` fill (a
        stretch's decodes fill only blocks of its own content: anonymous, counted)."""
        if n:
            self._held[request_id] += n
        if num_tokens is not None:
            self._register_full(request_id, num_tokens)

    def hand_over_all(self, grown: list[tuple[int, int, int]]) -> None:
        """:meth:`hand_over` each ``(request id, n, num_tokens)`` (a stretch's members running
        on when it is applied): as one call, since their blocks past the prompt's shared
        content are anonymous and only counted (the blocks with identities, if any, cached as
        :meth:`_register_full` does)."""
        held, num_keyed, tables, bs = self._held, self._num_keyed, self._tables, self.block_size
        limit = self._limit
        for rid, n, num_tokens in grown:
            h = held[rid] + n
            held[rid] = h
            start = num_keyed.get(rid, 0)
            full = num_tokens // bs
            if full > h:
                full = h
            if full <= start:
                continue
            table = tables.get(rid)
            if limit or (table is not None and start < len(table)):
                self._register_full(rid, num_tokens)
            else:                          # (anonymous blocks only: counted; stretches
                num_keyed[rid] = full      # run on this exact class, no subclass's override)

    def takes_any(self, n: int, blocks: list[int]) -> bool:
        """True if taking ``n`` blocks off the free pool's head would take one of ``blocks``
        (blocks with identities; those in use are never taken): none can be when a run of
        anonymous blocks at the head holds all ``n`` (the usual), or two such runs do, else
        :meth:`pool_head` tells."""
        if not n or not blocks:
            return False
        segs = self._segs
        head = segs[-1][0]
        if head >= n or (0 < head and len(segs) > 1 and segs[-2][0] >= n - head):
            return False
        found = self.pool_head(n)
        return bool(found) and not set(found).isdisjoint(blocks)

    def pool_head(self, n: int) -> list[int]:
        """The blocks with identities among the first ``n`` of the free pool (the next taken)."""
        out: list[int] = []
        where = self._where
        for seg in reversed(self._segs):
            if n <= 0:
                break
            head = seg[0]
            if head > 0:
                n -= head
                continue
            last = seg[-1]
            if last < 0 or (where[last] != -head and not _unstale(seg, where)):
                continue                   # (used up, or only stale entries: a take drops it)
            for i in range(len(seg) - 1, 0, -1):
                bid = seg[i]
                if where[bid] == -head:
                    out.append(bid)
                    n -= 1
                    if not n:
                        break
        return out

    def free_order(self) -> list[int]:
        """The free blocks in LRU order (vLLM's free-block queue; the first is taken next):
        blocks with identities by their id, anonymous ones as ``ANON`` (no content) or
        ``ANON_DEAD`` (content nobody can hit)."""
        out: list[int] = []
        where = self._where
        for seg in reversed(self._segs):
            head = seg[0]
            if head > 0:
                out += [ANON_DEAD if seg[1] else ANON] * head
                continue
            out += [bid for bid in reversed(seg) if bid >= 0 and where[bid] == -head]
        return out

    def _tidy(self) -> None:
        """Count the entries the segments still list (takes pop them); if the stale ones
        outnumber the blocks twice over, compact. Either way the next count is
        ``num_blocks`` entries later: amortised, a few steps per entry listed."""
        n = self.num_blocks
        self._entries = sum(map(len, self._segs))   # (a run counts 2)
        if self._entries > 3 * n + self._slack:
            self._compact()
        self._compact_at = self._entries + n + self._slack

    def _compact(self) -> None:
        """The free pool in the same order without stale entries or empty segments, and
        neighbouring runs of one kind merged."""
        where = self._where
        segs: deque[list[int]] = deque()
        entries = 0
        for seg in self._segs:             # (tail first)
            head = seg[0]
            if head > 0:
                if segs and segs[-1][0] > 0 and segs[-1][1] == seg[1]:
                    segs[-1][0] += head
                else:
                    segs.append(seg)
                continue
            live = [bid for bid in islice(seg, 1, None) if where[bid] == -head]
            if live:
                seg[1:] = live
                segs.append(seg)
                entries += len(live)
        self._segs = segs
        self._entries = entries
        self._open = {-seg[0]: seg for seg in segs if seg[0] < 0}

    def lookup(self, request_id: int, num_tokens: int) -> tuple[list[int], list[int]]:
        """The blocks a new request would share (:meth:`cached_tokens`: one per cached block
        at its start), and of those the ones in the free pool (a hit takes them out of it)."""
        hits = self.hit_blocks(request_id, num_tokens)
        where = self._where
        return hits, [bid for bid in hits if where[bid]]

    def hit_blocks(self, request_id: int, num_tokens: int) -> list[int]:
        """:meth:`lookup`'s first part: the blocks a new request would share (a new list)."""
        limit = (num_tokens - 1) // self.block_size
        if 0 < limit <= self._shared.get(request_id, 0):
            # a prompt whose content its ids name: the same blocks for every request with
            # those ids while no key's first copy changed (``_version``; recurring prompts)
            ids = self._content[request_id][1]
            memo = self._hit_memo.get(ids)
            if memo is not None and memo[0] == self._version and memo[1] == limit:
                hits = list(memo[2])
            else:
                hits = self._find(self._chain(ids, limit), limit)
                if len(self._hit_memo) >= _MEMO_MAX:
                    self._hit_memo.clear()
                self._hit_memo[ids] = (self._version, limit, tuple(hits))
        else:
            hits = self._find(self._keys_upto(request_id, limit), limit)
        return hits

    def _find(self, keys: list[int], limit: int) -> list[int]:
        """The oldest cached copy of each of the first ``limit`` keys, up to the first key
        not cached."""
        found = list(map(self._cached.get, keys if len(keys) == limit else keys[:limit]))
        if None in found:
            del found[found.index(None):]
        return list(map(_first, found))   # type: ignore[arg-type]

    def allocate_hits(self, request_id: int, num_tokens: int, hits: list[int],
                      before: int = 0) -> int | None:
        """:meth:`allocate_cached` with the hits :meth:`hit_blocks` found (this list becomes
        the request's table), when nothing changed since: the caller has checked they and the
        new blocks fit. In one pass, the hits in the pool leave it and those in use gain a
        holder. ``before``: anonymous blocks to take off the pool's head for others first (a
        stretch's decodes at the step, ``_CacheReplay``), none of them a hit; they are taken
        after the hits leave the pool, with its own new blocks (the same blocks, in the same
        order, as taking them first)."""
        if hits:
            where, extra = self._where, self._extra
            last = where[hits[-1]]         # (the segment of the last hit, if it is free)
            nu = 0
            for bid in hits:
                if where[bid]:             # in the pool: out of it (its entry goes stale)
                    where[bid] = 0
                else:                      # in use: one holder more
                    extra[bid] = extra.get(bid, 0) + 1
                    nu += 1
            if last:                       # all its blocks hit: a take drops it at once
                seg = self._open[last]
                n = len(seg) - 1
                if n <= len(hits) and seg[1] == hits[-n] and seg[1:] == hits[-n:]:
                    del seg[1:]
            self.num_free -= len(hits) - nu
        nh = len(hits)
        self._tables[request_id] = hits
        self._num_keyed[request_id] = nh
        bs = self.block_size
        need = -(-num_tokens // bs) - nh   # (allocate, written out)
        if need > 0:
            if self._shared.get(request_id, 0) > nh:
                self._grow(request_id, nh, need, before)
            else:                          # (``_grow``'s blocks all anonymous)
                self.take_anonymous(need + before)
                self._held[request_id] = nh + need
        else:
            self._held[request_id] = nh
            if before:
                self.take_anonymous(before)
        if num_tokens // bs > nh:          # (blocks filled past the hits: cached now)
            self._register_full(request_id, num_tokens)
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
        """A block from the pool's head (least recently freed), with an identity; its cached
        content is lost."""
        segs, where = self._segs, self._where
        seg = segs[-1]
        while True:
            head = seg[0]
            if head > 0:                   # an anonymous run: an identity from the stash
                if head == 1:
                    segs.pop()
                else:
                    seg[0] = head - 1
                if seg[1]:
                    self.num_evicted += 1
                self.num_free -= 1
                return self._stash.pop()
            bid = seg[-1]
            if bid < 0 or (where[bid] != -head and not _unstale(seg, where)):
                segs.pop()                 # used up, or only stale entries left
                del self._open[-head]
                seg = segs[-1]
            else:
                bid = seg.pop()
                break
        where[bid] = 0
        self.num_free -= 1
        key = self._key[bid]
        if key is not None:
            self._forget(bid, key)
            self.num_evicted += 1
        return bid

    def _forget(self, bid: int, key: int) -> None:
        """Block ``bid``, taken for other content, loses its cached content ``key``."""
        if key != _DEAD:
            copies = self._cached[key]
            copies.remove(bid)
            if not copies:
                del self._cached[key]
            self._version += 1
        self._key[bid] = None

    def take_anonymous(self, n: int) -> None:
        """Take ``n`` blocks off the pool's head for anonymous positions (past the prompts'
        shared content): runs are counted down, blocks with identities lose them (to the
        stash). A stretch's decodes take theirs so, the takes between two frees as one count,
        and the requests are credited with them later (:meth:`hand_over`); until then
        ``blocks_held`` does not count them (and :meth:`check` would fail). The blocks must be
        free (the caller checked)."""
        self.num_free -= n
        segs = self._segs
        seg = segs[-1]
        if seg[0] > n:                     # (the usual: a run at the head has them all)
            seg[0] -= n
            if seg[1]:
                self.num_evicted += n
            return
        where, block_key = self._where, self._key
        evicted = 0
        while n:
            seg = segs[-1]
            head = seg[0]
            if head > 0:
                if head <= n:
                    segs.pop()
                    n -= head
                    if seg[1]:
                        evicted += head
                else:
                    seg[0] = head - n
                    if seg[1]:
                        evicted += n
                    n = 0
                continue
            bid = seg[-1]
            if bid < 0 or (where[bid] != -head and not _unstale(seg, where)):
                segs.pop()                 # used up, or only stale entries left
                del self._open[-head]
                continue
            bid = seg.pop()
            where[bid] = 0
            key = block_key[bid]
            if key is not None:
                self._forget(bid, key)
                evicted += 1
            self._stash.append(bid)
            n -= 1
        self.num_evicted += evicted

    def _register_full(self, request_id: int, num_tokens: int) -> None:
        """Cache the blocks that ``num_tokens`` fills (their KV is computed this step): those
        with identities under their keys; anonymous ones are only counted (nobody else can
        hit them)."""
        if self._limit:
            limit = self._limit.get(request_id)
            if limit is not None and limit < num_tokens:
                num_tokens = limit
        full = min(num_tokens // self.block_size, self._held.get(request_id, 0))
        start = self._num_keyed.get(request_id, 0)
        if full <= start:
            return
        table = self._tables.get(request_id)
        if table is not None and start < len(table):
            top = min(full, len(table))
            keys, cached, block_key = self._keys_upto(request_id, top), self._cached, self._key
            for b in range(start, top):
                key, bid = keys[b], table[b]
                copies = cached.get(key)
                if copies is None:
                    cached[key] = [bid]
                    self._version += 1
                elif bid not in copies:    # a copy of cached content: cached too (see _cached)
                    copies.append(bid)
                block_key[bid] = key
        self._num_keyed[request_id] = full

    def check(self) -> None:
        """Assert the pool's invariants (for tests): the free blocks counted, one identity
        per anonymous block, identities held or free at most once."""
        where = self._where
        listed = [bid for seg in self._segs if seg[0] < 0
                  for bid in islice(seg, 1, None) if where[bid] == -seg[0]]
        runs = sum(seg[0] for seg in self._segs if seg[0] > 0)
        assert all(seg[0] != 0 for seg in self._segs)
        assert self._open == {-seg[0]: seg for seg in self._segs if seg[0] < 0}
        assert len(set(listed)) == len(listed) and self.num_free == len(listed) + runs
        held_ids = {bid for t in self._tables.values() for bid in t}
        anon_held = sum(h - len(self._tables.get(r, ())) for r, h in self._held.items())
        assert len(self._stash) == anon_held + runs
        assert not (held_ids & set(listed)) and not (set(self._stash) & (held_ids | set(listed)))
        assert all(len(self._tables.get(r, ())) <= h for r, h in self._held.items())
        holders: dict[int, int] = {}
        for table in self._tables.values():
            for bid in table:
                holders[bid] = holders.get(bid, 0) + 1
        assert self._extra == {bid: n - 1 for bid, n in holders.items() if n > 1}
        for ids, (version, limit, hits) in self._hit_memo.items():   # lookup's memo is true
            assert version != self._version or ids is None \
                or list(hits) == self._find(self._chain(ids, limit), limit)
