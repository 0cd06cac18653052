"""Prefix caching: the block pool by hand, the scheduler with hits, and a Mooncake replay whose
hit rate matches an independent infinite-cache count."""

from __future__ import annotations

from pathlib import Path

import pytest

import simserve
from simserve.config import parse_scenario
from simserve.errors import ConfigError
from simserve.kv.prefix import PrefixBlockManager
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
    bm.allocate(0, 6)                        # blocks 0, 1: block 0 full (cached), 1 partial
    assert [bm._key[b] is not None for b in bm._tables[0]] == [True, False]
    bm.free(0)
    assert bm.free_order()[0] == 1 and bm.free_order()[-1] == 0
    bm.register(1, 4, None)
    bm.allocate(1, 4)                        # takes block 1: nothing evicted
    assert bm._tables[1] == [1] and bm.num_evicted == 0


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
    specs = build_workload(mooncake(2, 1).workload, 0, Path("."))
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


@pytest.mark.parametrize("slack", [4096, 0])
def test_free_pool_order_matches_a_plain_lru_queue_through_hits_frees_and_compaction(slack):
    """The pool as vLLM's free-block queue, kept by hand here as a list: a take pops the head,
    a hit takes a free block out, a free appends a request's blocks tail first (those with no
    cached content to the head instead, the last at the very head). The manager keeps it as
    segments with stale entries, counted and compacted as they grow (slack 0: soon) and here
    at random moments too."""
    import random

    rng = random.Random(7)
    bm = pool(num_blocks=40)
    bm._slack = slack
    bm._compact_at = 0
    queue = list(range(40))                   # head first
    holders: dict[int, int] = {}
    live: list[int] = []
    for rid in range(400):
        prompt = rng.choice([9, 13, 16, 21, 24])
        bm.register(rid, prompt, (rng.randrange(3), rng.randrange(2), rng.randrange(2)))
        cached = bm.cached_tokens(rid, prompt)
        if not bm.can_hold(rid, prompt + 4, cached):
            victim = live.pop(0)
            table = list(bm._tables[victim])
            bm.release(victim, prompt) if rng.random() < 0.5 else bm.free(victim)
            freed = []
            for bid in reversed(table):
                holders[bid] -= 1
                if not holders[bid]:
                    freed.append(bid)
            heads = [b for b in freed if bm._key[b] is None]
            queue += [b for b in freed if b not in heads]
            queue[:0] = heads
            continue
        got = bm.allocate_cached(rid, prompt, cached) if cached else bm.allocate(rid, prompt)
        assert got is not None
        table = bm._tables[rid]
        for i, bid in enumerate(table):
            if i < cached // bm.block_size:   # a hit: out of the queue if it was free
                if bid in queue:
                    queue.remove(bid)
            else:                             # new: the queue's head
                assert queue.pop(0) == bid
            holders[bid] = holders.get(bid, 0) + 1
        live.append(rid)
        if rng.random() < 0.3 and bm.num_free:     # a decode starting a block
            bm.extend([rid])
            assert queue.pop(0) == bm._tables[rid][-1]
            holders[bm._tables[rid][-1]] = 1
        assert bm.free_order() == queue and bm.num_free == len(queue)
        assert bm.pool_head(3) == queue[:3]
        if rng.random() < 0.05:
            bm._compact()
            assert len(bm._segs) == 1 and bm.free_order() == queue
