"""The seed papers' baselines as they were: Orca's reservation modes on a buddy allocator
(the vLLM paper's §6.1 definitions) and static batching's padding. Hand-checked."""

from __future__ import annotations

import pytest

from simserve.kv.buddy import BuddyBlockManager, pow2_at_least
from simserve.sched import SchedulerLimits
from simserve.sched.orca import Orca, OrcaParams
from simserve.kv.blocks import BlockManager
from tests.helpers import make_request, step


def test_pow2_at_least():
    assert [pow2_at_least(n) for n in (1, 2, 3, 25, 32, 33)] == [1, 2, 4, 32, 32, 64]


def test_buddy_rounds_up_splits_and_merges():
    # 12 blocks = aligned regions 8 @ 0 and 4 @ 8
    bm = BuddyBlockManager(12, block_size=4)
    assert bm.largest_free() == 8
    assert bm.allocate(1, 9) == 4          # 9 tokens = 3 blocks -> chunk of 4 from the 4 @ 8
    assert bm.num_free == 8 and bm.largest_free() == 8
    assert bm.allocate(1, 16) == 0         # within its chunk
    assert bm.allocate(1, 17) is None      # a chunk never grows
    assert bm.allocate(2, 4) == 1          # 1 block: splits 8 -> 4 + 2 + 1 + 1
    assert bm.largest_free() == 4 and bm.num_free == 7
    # 5 blocks -> a chunk of 8: 7 blocks free in all, but no region of 8 (external frag.)
    assert not bm.can_allocate(3, 20) and bm.allocate(3, 20) is None and bm.num_free == 7
    assert bm.free(2) == 1                 # merges back into 8 @ 0
    assert bm.largest_free() == 8 and bm.allocate(3, 20) == 8 and bm.num_free == 0
    assert bm.free(1) == 4 and bm.free(3) == 8 and bm.num_free == 12


def orca(mode: str, allocator: str = "buddy", blocks: int = 64, max_len: int = 64):
    limits = SchedulerLimits(max_num_seqs=16, max_num_batched_tokens=1000,
                             enable_chunked_prefill=False, max_model_len=max_len)
    return Orca(limits, BlockManager(blocks, 1), OrcaParams(reservation=mode,
                                                            allocator=allocator))


@pytest.mark.parametrize("mode, reserved", [("oracle", 10 + 25), ("pow2", 10 + 32),
                                            ("max", 64)])
def test_orca_reservations_are_the_vllm_papers(mode, reserved):
    # prompt 10, true output 25 ("if the true output length is 25, it reserves 32")
    s = orca(mode, allocator="paged")
    assert s.reservation(make_request(0, 10, 25)) == reserved
    s.add(make_request(0, 10, 25))
    step(s)
    assert s.blocks.num_used == reserved          # block size 1: blocks = tokens


def test_orca_pow2_never_exceeds_the_max_length_nor_goes_below_the_true_length():
    s = orca("pow2", allocator="paged", max_len=40)
    assert s.reservation(make_request(0, 10, 25)) == 40    # 42 capped at 40
    s = orca("max", allocator="paged", max_len=0)           # no max length: the true length
    assert s.reservation(make_request(0, 10, 25)) == 35


def test_orca_buddy_admits_fewer_than_the_free_blocks_allow():
    # 64 one-token blocks; each request prompt 10 + output 6 = 16 tokens
    # oracle: chunk 16 -> four fit; pow2: 10 + 8 = 18 -> chunk 32 -> two fit;
    # max (64): chunk 64 -> one fits
    for mode, fits in (("oracle", 4), ("pow2", 2), ("max", 1)):
        s = orca(mode)
        for i in range(6):
            s.add(make_request(i, 10, 6))
        step(s)
        assert len(s.running) == fits, mode
        assert s.blocks.num_used == 64 // fits * fits


def test_orca_buddy_replaces_the_pool_and_refuses_a_prefix_cache():
    s = orca("oracle")
    assert isinstance(s.blocks, BuddyBlockManager) and s.blocks.num_blocks == 64


def test_buddy_reservation_larger_than_any_region_takes_the_empty_pool():
    bm = BuddyBlockManager(12, block_size=1)          # regions 8 + 4
    assert bm.allocate(1, 2) == 2
    assert not bm.can_allocate(2, 10) and bm.allocate(2, 10) is None   # 16 > 8: pool not empty
    assert bm.free(1) == 2 and bm.largest_free() == 8
    assert bm.can_allocate(2, 10) and bm.allocate(2, 10) == 12 and bm.num_free == 0
    assert bm.free(2) == 12 and bm.largest_free() == 8 and bm.num_free == 12
