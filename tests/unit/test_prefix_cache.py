"""Prefix caching: the block pool by hand, the scheduler with hits, and a Mooncake replay whose
hit rate matches an independent infinite-cache count."""

from __future__ import annotations

from pathlib import Path

import pytest

import simserve
from simserve.config import parse_scenario
from simserve.errors import ConfigError
from simserve.kv.prefix import _DEAD, ANON, ANON_DEAD, PrefixBlockManager, _unstale
from simserve.sched import POLICIES, Request, SchedulerLimits, Status
from simserve.workload import build_workload
from simserve.workload.spec import RequestSpec
from tests.helpers import step, tokens

# shipped with the repository (scenarios/traces/make_samples.py): multi-turn sessions over shared
# system prompts, in Mooncake's format
TRACE = (Path(__file__).resolve().parents[2] / "scenarios" / "traces"
         / "mooncake_prefix_sample.jsonl")


def pool(num_blocks: int = 8) -> PrefixBlockManager:
    # engine blocks of 4 tokens; one source id per 8 tokens (two engine blocks per id)
    return PrefixBlockManager(num_blocks, block_size=4, source_block_size=8)


def test_hits_take_whole_cached_blocks_but_never_the_last_token():
    bm = pool()
    bm.register(0, 16, (1, 2))
    assert bm.cached_tokens(0, 16) == 0 and bm.allocate(0, 16) == 4
    # a request with the same 16 prompt tokens hits 3 blocks, not 4: its last token must be
    # recomputed to sample ((16 - 1) // 4 = 3 blocks = 12 tokens)
    bm.register(1, 16, (1, 2))
    assert bm.cached_tokens(1, 16) == 12
    # a longer prompt sharing both source blocks hits all 4 (17 - 1) // 4 = 4
    bm.register(2, 17, (1, 2, 3))
    assert bm.cached_tokens(2, 17) == 16
    # same second id but a different first one: the chain differs from block 0 on
    bm.register(3, 16, (9, 2))
    assert bm.cached_tokens(3, 16) == 0
    # no hash ids: content unique to the request, no hits
    bm.register(4, 16, None)
    assert bm.cached_tokens(4, 16) == 0


def test_shared_blocks_are_counted_once_and_freed_tail_first_into_an_lru_pool():
    bm = pool(num_blocks=6)
    bm.register(0, 16, (1, 2))
    bm.allocate(0, 16)                        # 4 blocks, all full: cached
    bm.register(1, 16, (1, 2))
    hit = bm.cached_tokens(1, 16)             # 12 tokens = 3 shared blocks
    assert bm.allocate_cached(1, 16, hit) == 1 and bm.num_free == 1
    assert bm.held(1) == 4                    # 3 shared + 1 new
    bm.free(1)                                # the shared blocks are still held by request 0
    assert bm.num_free == 2
    bm.free(0)                                # all 6 free, 5 of them still cached
    assert bm.num_free == 6
    # Request 1's own 4th block holds the same content as request 0's block 3 and is cached
    # too (vLLM does not de-duplicate). Pool, head first: the never-used block, request 1's
    # 4th block, then request 0's blocks in reverse order 3, 2, 1, 0 — tails are evicted first.
    # Taking 4 blocks evicts both copies of block 3's content and request 0's block 2; blocks
    # 0 and 1 still hit.
    bm.register(2, 16, None)
    bm.allocate(2, 16)
    assert bm.num_evicted == 3
    bm.register(3, 16, (1, 2))
    assert bm.cached_tokens(3, 16) == 8


def test_duplicate_content_is_cached_and_the_oldest_copy_is_hit():
    # (vLLM's BlockHashToBlockMap keeps every block of one content; a hit takes the oldest.)
    # A (ids 1, 2) is admitted with a 4-token chunk; B, with the same prompt, hits A's one
    # full block and computes its block 1 itself; A then computes its own block 1: two copies.
    bm = pool(num_blocks=8)
    bm.register(0, 16, (1, 2))
    bm.allocate(0, 4)                                   # A: block 0 full, cached
    bm.register(1, 16, (1, 2))
    assert bm.cached_tokens(1, 16) == 4
    bm.allocate_cached(1, 8, 4)                         # B: A's block 0 + its own block 1
    bm.allocate(0, 8)                                   # A: its own block 1, the same content
    b1, a1 = bm._tables[1][1], bm._tables[0][1]
    assert b1 != a1 and bm._key[b1] == bm._key[a1] is not None   # both cached
    bm.free(1)                                          # B's copy goes to the pool (cached)
    bm.register(2, 16, (1, 2))
    assert bm.cached_tokens(2, 16) == 8                 # both blocks still hit
    bm.allocate_cached(2, 9, 8)
    assert bm._tables[2][:2] == [bm._tables[0][0], b1]  # the oldest copy: B's, from the pool
    assert bm.num_free == 8 - 2 - 1 - 1                 # A's 2, C's 3rd, and B's copy taken


def test_freed_blocks_without_cached_content_are_reused_first():
    # vLLM's BlockPool.free_blocks: cached blocks go to the free queue's tail (LRU), blocks
    # with nothing cached to its head, so they are taken before any cached content is evicted
    bm = pool(num_blocks=6)
    bm.register(0, 6, None)
    bm.allocate(0, 6)                        # 2 blocks: block 0 full (cached), block 1 partial
    assert bm.keyed_blocks[0] == 1
    bm.free(0)                               # preempted: block 0 keeps its content, at the tail
    order = bm.free_order()
    assert order[0] == ANON and order[-1] >= 0 and bm._key[order[-1]] is not None
    bm.register(1, 4, None)
    bm.allocate(1, 4)                        # takes block 1 from the head: nothing evicted
    assert bm.num_evicted == 0
    bm.register(0, 7, None)                  # request 0 again (6 tokens + 1 generated)
    assert bm.cached_tokens(0, 7) == 4       # its own block 0, still cached


def test_a_finished_requests_own_blocks_go_to_the_tail_holding_dead_content():
    # blocks past the content hash_ids name are the request's own: once it finished nobody can
    # hit them, but they are evicted (and counted) as cached blocks, after the blocks without
    # content and before its shared ones
    bm = pool(num_blocks=8)
    bm.register(0, 12, (1,))                 # ids cover 8 tokens: blocks 0, 1 shared, 2 own
    bm.allocate(0, 14)                       # 4 blocks: 0-2 full, 3 partial
    bm.release(0, 14)
    order = bm.free_order()
    assert order[:5] == [ANON] * 5 and order[5] == ANON_DEAD
    assert [bm._key[b] is not None for b in order[6:]] == [True, True]
    bm.register(1, 20, None)
    bm.allocate(1, 20)                       # 5 blocks without content, then the dead one
    assert bm.num_evicted == 0
    bm.allocate(1, 24)
    assert bm.num_evicted == 1
    bm.register(2, 9, (1, 5))
    assert bm.cached_tokens(2, 9) == 8       # the shared blocks still hit
    bm.check()


def make_v1(num_blocks: int = 100, budget: int = 100):
    limits = SchedulerLimits(max_num_seqs=8, max_num_batched_tokens=budget,
                             enable_chunked_prefill=True)
    return POLICIES["vllm_v1"](limits, PrefixBlockManager(num_blocks, 4, source_block_size=8))


def test_v1_admits_with_its_cached_prefix_already_computed():
    s = make_v1()
    a = Request(RequestSpec(0, 0.0, 20, 2, (5, 6, 7)))
    b = Request(RequestSpec(1, 0.0, 18, 2, (5, 6, 8)))
    s.add(a)
    assert tokens(step(s)) == {0: 20}
    s.add(b)
    # B shares source blocks 5, 6 = tokens 0-15 = 4 engine blocks with A (then differs)
    p = step(s)
    assert tokens(p) == {0: 1, 1: 2} and p.prefill_ctx == (16,)
    assert b.num_cached_tokens == 16
    # a request whose whole prompt is cached still recomputes its last token: the cache hit
    # stops at (16 - 1) // 4 = 3 blocks, so the last block's 4 tokens are computed
    c = Request(RequestSpec(2, 0.0, 16, 1, (5, 6)))
    s.add(c)
    p = step(s)
    assert tokens(p)[2] == 4 and c.num_cached_tokens == 12 and c.status is Status.FINISHED


def test_a_preempted_request_recomputes_from_its_own_cached_blocks():
    # 4 blocks of 4, as test_v1_recompute_preemption_evicts_newest: B is preempted at step 3
    s = make_v1(num_blocks=4)
    a = Request(RequestSpec(0, 0.0, 7, 4))
    b = Request(RequestSpec(1, 0.0, 7, 4))
    s.add(a), s.add(b)
    step(s), step(s)
    assert step(s).num_preempted == 1 and b.status is Status.WAITING
    # B's 2 blocks went to the pool tail first (its block 1 ahead of block 0), and A's 3rd
    # block was taken from the head: B's tail. A decodes and finishes.
    step(s)
    # B (7 prompt + 2 generated = 9 tokens) finds its block 0 still cached (4 tokens): it
    # recomputes 5 tokens, not 9
    p = step(s)
    assert tokens(p) == {1: 5} and p.prefill_ctx == (4,)
    assert b.num_cached_tokens == 0  # the hit rate counts first admissions only


def test_prefix_caching_is_only_for_policies_that_model_it():
    raw = {"model": "tiny-llama-45m", "hardware": "H100-SXM",
           "engine": {"num_gpu_blocks": 64, "max_model_len": 512,
                      "enable_prefix_caching": True},
           "scheduler": {"policy": "orca"},
           "workload": {"arrival": "burst", "num_requests": 2,
                        "prompt": {"dist": "fixed", "value": 10},
                        "output": {"dist": "fixed", "value": 3}}}
    with pytest.raises(ConfigError, match=r"engine\.enable_prefix_caching: policy 'orca'"):
        parse_scenario(raw)
    raw["scheduler"]["policy"] = "sarathi"
    raw["engine"]["preemption_mode"] = "swap"
    with pytest.raises(ConfigError, match="recompute only"):
        parse_scenario(raw)


# -- Mooncake replay -------------------------------------------------------------------------------

BLOCK = 16
N = 410         # the whole sample
START_S = 0


def mooncake(num_gpu_blocks: int, budget: int) -> simserve.Scenario:
    return parse_scenario({
        "model": {"card": "tiny-llama-45m", "max_position_embeddings": 16384},
        "hardware": "H100-SXM",
        "engine": {"block_size": BLOCK, "num_gpu_blocks": num_gpu_blocks,
                   "max_num_batched_tokens": budget, "max_num_seqs": 1024,
                   "max_model_len": 16384, "enable_prefix_caching": True},
        "scheduler": {"policy": "vllm_v1"},
        "latency": {"model": "constant", "step_ms": 1},
        "workload": {"trace": str(TRACE), "format": "mooncake", "start_s": START_S,
                     "num_requests": N, "rate": 50},
    })


def infinite_cache_hit_rate(specs) -> float:
    """Arrival order, unbounded cache: a full block hits if a request before had the same
    512-token ids up to and including the last one it overlaps (never the last prompt token).
    Equal id prefixes are numbered as they are first seen (no hashing, unlike the simulator)."""
    prefix_number: dict = {}
    seen: set = set()
    hits = total = 0
    for r in sorted(specs, key=lambda r: (r.arrival_s, r.request_id)):
        p, ids = r.num_prompt_tokens, r.hash_ids
        prefix, number = [], 0          # prefix[j]: the number of ids[: j + 1]
        for x in ids:
            number = prefix_number.setdefault((number, x), len(prefix_number) + 1)
            prefix.append(number)
        keys = []                       # block b's content: (b, the prefix through its last id)
        for b in range(p // BLOCK):
            last = ((b + 1) * BLOCK - 1) // 512
            if last >= len(ids):
                break
            keys.append((b, prefix[last]))
        n = 0
        while n < min((p - 1) // BLOCK, len(keys)) and keys[n] in seen:
            n += 1
        hits += n * BLOCK
        total += p
        seen.update(keys)
    return hits / total


def test_mooncake_hit_rate_matches_an_infinite_cache_and_drops_when_tight():
    specs = build_workload(mooncake(2, 8192).workload, 0, Path("."))
    expected = infinite_cache_hit_rate(specs)
    longest = max(r.num_prompt_tokens + r.num_output_tokens for r in specs)
    assert 0.3 < expected < 0.9
    # unbounded: room for every request at once (nothing is ever evicted), whole prompts in
    # one step, admitted in arrival order: exactly the count above
    room = sum(-(-(r.num_prompt_tokens + r.num_output_tokens) // BLOCK) for r in specs)
    big = simserve.run(mooncake(num_gpu_blocks=room + 1, budget=longest)).summary  # + null block
    assert big["completed"] == N
    assert big["prefix_cache_hit_rate"] == pytest.approx(expected, abs=0.01)
    assert big["prefix_cache_query_tokens"] == sum(r.num_prompt_tokens for r in specs)
    # tight: just over the longest request: cached blocks are evicted before they are reused
    tight = simserve.run(mooncake(num_gpu_blocks=2 * longest // BLOCK, budget=8192)).summary
    assert tight["completed"] == N
    assert tight["prefix_cache_hit_rate"] < expected - 0.05


class PlainPool:
    """vLLM's block pool as plainly as it can be kept: every block has an identity, the free
    queue is a list (head first), a hit takes a free block out of it, a free puts the request's
    blocks with cached content at the tail and the others at the head, each tail first."""

    def __init__(self, num_blocks: int, block_size: int, keys):
        self.bs, self.keys = block_size, keys             # keys(rid, n): its first n keys
        self.queue = list(range(num_blocks))
        self.key: list = [None] * num_blocks
        self.cached: dict = {}                             # key -> blocks, oldest first
        self.tables: dict = {}
        self.holders: dict = {}
        self.keyed: dict = {}
        self.evicted = 0

    def take(self) -> int:
        bid = self.queue.pop(0)
        key = self.key[bid]
        if key is not None:
            if key != _DEAD:
                self.cached[key].remove(bid)
                if not self.cached[key]:
                    del self.cached[key]
            self.key[bid] = None
            self.evicted += 1
        self.holders[bid] = 1
        return bid

    def cached_tokens(self, rid: int, n: int) -> int:
        limit = (n - 1) // self.bs
        keys, hit = self.keys(rid, limit), 0
        while hit < limit and keys[hit] in self.cached:
            hit += 1
        return hit * self.bs

    def allocate(self, rid: int, n: int, hit: int = 0) -> None:
        if rid not in self.tables:
            table = self.tables[rid] = [self.cached[k][0] for k in self.keys(rid, hit // self.bs)]
            for bid in table:
                if bid in self.queue:
                    self.queue.remove(bid)
                self.holders[bid] = self.holders.get(bid, 0) + 1
            self.keyed[rid] = len(table)
        table = self.tables[rid]
        while len(table) < -(-n // self.bs):
            table.append(self.take())
        self.register(rid, n)

    def register(self, rid: int, n: int) -> None:
        table, start = self.tables[rid], self.keyed[rid]
        full = min(n // self.bs, len(table))
        for b, key in enumerate(self.keys(rid, full)[start:full], start):
            copies = self.cached.setdefault(key, [])
            if table[b] not in copies:
                copies.append(table[b])
            self.key[table[b]] = key
        self.keyed[rid] = max(start, full)

    def free(self, rid: int, shared: int, finished: bool, n: int | None = None) -> None:
        if finished:
            if n is not None:
                self.register(rid, n)
            for key in self.keys(rid, len(self.tables[rid]) + 64)[shared:]:
                for bid in self.cached.pop(key, ()):
                    self.key[bid] = _DEAD
        table, nk = self.tables.pop(rid), self.keyed.pop(rid)
        freed = []
        for bid in table:
            self.holders[bid] -= 1
            if not self.holders[bid]:
                freed.append(bid)
        keyed = [b for b in table[:nk] if b in freed]
        self.queue = ([b for b in reversed(table[nk:]) if b in freed] + self.queue
                      + keyed[::-1])

    def kinds(self) -> list:
        return [self.key[b] for b in self.queue]


@pytest.mark.parametrize("slack", [4096, 0])
def test_the_pool_keeps_vllms_queue_through_hits_frees_preemptions_and_compaction(slack):
    """Random traffic through the manager and through PlainPool side by side: equal hits,
    free and evicted counts, and the same free queue (what each free block holds, in order),
    with the manager's segments and anonymous runs compacted as they grow (slack 0: soon) and
    here at random moments too."""
    import random

    rng = random.Random(7)
    bm = pool(num_blocks=40)
    bm._slack = slack
    bm._compact_at = 0
    names = pool(num_blocks=1)                # (the keys: the same chains, kept apart)

    def keys(rid, n):
        return list(names._keys_upto(rid, n)[:n])

    plain = PlainPool(40, bm.block_size, keys)
    live: dict[int, list] = {}                # rid -> [prompt, ids, tokens held]
    waiting: list[int] = []                   # preempted, to come back
    gone: dict[int, list] = {}
    seen = {"own hits": 0}                    # returning requests hitting their own content

    def kinds():
        out = []
        for b in bm.free_order():
            if b == ANON:
                out.append(None)
            elif b == ANON_DEAD:
                out.append(_DEAD)
            else:
                out.append(bm._key[b])
        return out

    def admit(rid, prompt, ids, n):
        for m in (bm, names):
            m.register(rid, prompt, ids)
        hit = bm.cached_tokens(rid, n)
        assert hit == plain.cached_tokens(rid, n)
        seen["own hits"] += hit > names._shared.get(rid, 0) * bm.block_size
        if not bm.can_hold(rid, n, hit):
            return False
        # the stretch's way (lookup, memoised by hash_ids), checked against the keys
        found, pooled = bm.lookup(rid, n)
        assert found == [bm._cached[k][0] for k in keys(rid, hit // bm.block_size)]
        assert pooled == [b for b in found if bm.free_order().count(b)]
        if rng.random() < 0.5:
            assert bm.hit_blocks(rid, n) == found
            got = bm.allocate_hits(rid, n, bm.hit_blocks(rid, n))
        else:
            got = bm.allocate_cached(rid, n, hit) if hit else bm.allocate(rid, n)
        assert got is not None
        plain.allocate(rid, n, hit)
        live[rid] = [prompt, ids, n]
        return True

    for rid in range(1500):
        op = rng.random()
        if op < 0.1 and live:                 # a request ends: finished, or preempted
            victim = rng.choice(sorted(live))
            prompt, ids, n = live.pop(victim)
            shared = names._shared.get(victim, 0)
            if rng.random() < 0.5:
                bm.release(victim, n)
                plain.free(victim, shared, True, n)
            else:
                bm.free(victim)
                plain.free(victim, shared, False)
                waiting.append(victim)
                gone[victim] = [prompt, ids, n]
            names._drop(victim, False)
        elif op < 0.2 and waiting:            # a preempted request comes back
            victim = waiting.pop(0)
            prompt, ids, n = gone.pop(victim)
            if not admit(victim, prompt, ids, n):
                names._drop(victim, False)
                bm.release(victim)            # (gives up: its own cached content is dead)
                plain.free(victim, 0, True) if victim in plain.tables else None
        elif op < 0.6 and live:               # decodes: a token each, some starting a block
            grow = [r for r in sorted(live) if rng.random() < 0.5]
            new = [r for r in grow if live[r][2] % bm.block_size == 0]
            if len(new) > bm.num_free:
                continue
            if rng.random() < 0.5 and new:    # (a stretch's bulk take)
                bm.take_anonymous(len(new))
                for r in new:
                    bm.hand_over(r, 1)
                    plain.tables[r].append(plain.take())
                for r in grow:
                    live[r][2] += 1
                    bm.cache_upto(r, live[r][2])
                    plain.register(r, live[r][2])
            else:
                for r in grow:
                    live[r][2] += 1
                    assert bm.allocate(r, live[r][2]) is not None
                    plain.allocate(r, live[r][2])
        else:                                 # a new request
            prompt = rng.choice([9, 13, 16, 21, 24])
            ids = (rng.randrange(3), rng.randrange(2), rng.randrange(2)) \
                if rng.random() < 0.8 else None
            if not admit(rid, prompt, ids, prompt):
                names._drop(rid, False)
        assert kinds() == plain.kinds()
        assert bm.num_free == len(plain.queue) and bm.num_evicted == plain.evicted
        assert dict(bm.blocks_held) == {r: len(t) for r, t in plain.tables.items()}
        assert dict(bm.keyed_blocks) == plain.keyed
        bm.check()
        if rng.random() < 0.05:
            bm._compact()
            assert kinds() == plain.kinds()
            bm.check()
    assert bm.num_evicted > 20 and seen["own hits"] > 5


def test_a_take_drops_a_segments_stale_entries_at_once():
    # a segment [-serial, blocks...] whose last entries are stale (their blocks hit, or freed
    # again into another segment) loses them in one go; one with nothing live is reported
    where = [0] * 8
    seg = [-3, 1, 2, 3, 4, 5]
    where[1] = where[3] = 3                  # blocks 1 and 3 still free in this segment
    where[5] = 4                             # block 5 freed again since: in segment 4
    assert _unstale(seg, where) and seg == [-3, 1, 2, 3]
    where[1] = where[3] = 0                  # both hit
    assert not _unstale(seg, where)
    # through the manager: a block taken after its segment's tail blocks were hit is the
    # segment's live one, and pool_head agrees
    bm = pool(num_blocks=6)
    bm.register(0, 12, (1, 2))
    bm.allocate(0, 12)                       # blocks 0-2, all full: cached, with identities
    bm.free(0)                               # pool: 3 blocks without content, then 2, 1, 0
    bm._where[2] = 0                         # (as if block 2 had been hit)
    bm.num_free -= 1
    assert bm.pool_head(5) == [1, 0]
    bm.register(1, 16, None)
    bm.allocate(1, 16)                       # 4 anonymous: 3 runs, then block 1 (evicted)
    assert bm.free_order() == [0] and bm.num_evicted == 1


def test_lookups_memo_follows_an_eviction_that_caches_nothing():
    # lookup remembers a prompt's hits by its hash_ids; taking a cached block off the pool
    # changes them even when the taker caches nothing (here: async, its tokens not yet known)
    bm = pool(num_blocks=4)
    bm.register(0, 16, (1, 2))
    bm.allocate(0, 16)
    bm.release(0, 16)                        # the pool: its 4 cached blocks, block 3 first
    bm.register(1, 16, (1, 2))
    assert len(bm.lookup(1, 16)[0]) == 3
    bm.register(2, 16, (7, 8))
    bm.limit_cache(2, 0)
    bm.allocate(2, 8)                        # 2 blocks off the head: blocks 3 and 2 evicted
    assert bm.num_evicted == 2 and bm.keyed_blocks.get(2, 0) == 0
    assert len(bm.lookup(1, 16)[0]) == 2 == bm.cached_tokens(1, 16) // 4
    bm.check()


def test_a_hit_on_a_segments_last_block_leaves_its_other_blocks_free():
    # C computed its own copy of A's block 0 (C0) and block 1 (C1); both freed, C's as one
    # segment [C0, C1]. D hits the oldest copies: A's block 0 and C1, so C's segment is not
    # all hit (C0, a younger copy, stays free in it)
    bm = pool(num_blocks=8)
    bm.register(0, 16, (1, 2))
    bm.allocate(0, 4)
    a0 = bm._tables[0][0]
    bm.register(2, 16, (1, 2))
    bm.allocate(2, 8)
    c0, c1 = bm._tables[2]
    bm.free(0)
    bm.free(2)
    bm.register(3, 16, (1, 2))
    found, pooled = bm.lookup(3, 9)
    assert found == pooled == [a0, c1]
    bm.allocate_hits(3, 9, found)
    assert bm.free_order().count(c0) == 1 and bm.num_free == 8 - 3
    bm.check()


def test_a_block_another_request_holds_stays_held_wherever_it_is_in_the_table():
    # A computed its own copy of C's block 0 (A0) and block 1 (A1); B hits the oldest copies:
    # C's block 0 and A1. When A is freed, A0 goes to the pool and A1 stays (B holds it): the
    # block shared is not A's leading one
    bm = pool(num_blocks=8)
    bm.register(0, 16, (1, 2))
    bm.allocate(0, 4)
    bm.register(1, 16, (1, 2))
    bm.allocate(1, 8)
    a0, a1 = bm._tables[1]
    bm.free(0)
    bm.register(2, 16, (1, 2))
    assert bm.allocate_cached(2, 9, 8) == 1 and bm._tables[2][1] == a1
    bm.free(1)
    order = bm.free_order()
    assert a0 in order and a1 not in order and bm.num_free == 8 - 3
    bm.check()


def test_a_finished_requests_uncached_shared_block_goes_to_the_head():
    # a cache limit (async scheduling) left request 1's block 3 unregistered although full;
    # released, it holds no content: to the pool's head, not among its cached blocks
    bm = pool(num_blocks=8)
    bm.register(2, 9, (7,))
    bm.allocate(2, 9)
    bm.register(1, 16, (5, 6))
    bm.limit_cache(1, 13)
    bm.allocate(1, 16)
    bm.release(2, 9)
    bm.release(1, 16)
    order = bm.free_order()
    held = [b != ANON and b >= 0 and bm._key[b] is not None or b == ANON_DEAD for b in order]
    assert held == [False] * 3 + [True] * 5
    bm.check()
