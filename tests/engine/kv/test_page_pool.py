"""PagePool: all-or-nothing allocation, owner-checked free, scrub policies, tags."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.errors import IsolationError, PoolExhausted
from engine.kv.page_pool import PageLayout, PagePool
from engine.kv.page_table import PageTable, block_tables
from engine.wire.page_tags import FREE_OWNER, NO_WRITER, PageState, pack_tag, unpack_tag

LAYOUT = PageLayout(num_layers=2, num_kv_heads=2, head_dim=4, page_size=4, dtype=torch.float32)


def _pool(pages=16, policy="zero") -> PagePool:
    return PagePool("decode", pages, LAYOUT, scrub_policy=policy)


def _state(pool: PagePool):
    return (pool.free_pages, pool.metadata_snapshot(), pool.data.clone())


def _assert_same(pool: PagePool, before) -> None:
    free, meta, data = before
    assert pool.free_pages == free
    for key, arr in pool.metadata_snapshot().items():
        np.testing.assert_array_equal(arr, meta[key], err_msg=key)
    assert torch.equal(pool.data.nan_to_num(7.0), data.nan_to_num(7.0))


def test_allocate_grants_distinct_reserved_pages_with_new_epochs():
    pool = _pool()
    grant = pool.allocate(slot=3, n=5)
    assert len(set(grant.pages.tolist())) == 5
    assert (pool.owner[grant.pages] == 3).all()
    assert (pool.state[grant.pages] == PageState.RESERVED).all()
    assert (grant.epochs == 1).all() and pool.free_pages == 11
    pool.free(3, grant.pages)
    again = pool.allocate(slot=4, n=16)
    assert (pool.epoch[grant.pages] == 2).all() and pool.free_pages == 0
    assert sorted(again.pages.tolist()) == list(range(16))


def test_exhausted_pool_raises_and_allocates_nothing():
    pool = _pool()
    pool.allocate(1, 10)
    before = _state(pool)
    with pytest.raises(PoolExhausted, match="pool 'decode' has 6 free pages of 16; request slot 2 asked for 7"):
        pool.allocate(2, 7)
    _assert_same(pool, before)


@pytest.mark.parametrize(
    "pages, fragment",
    [
        ("other", "it is owned by slot 2"),
        ("free", "it is already free"),
        ("twice", "it is listed twice"),
        ("range", "pool 'decode' has pages 0..15"),
    ],
)
def test_bad_free_raises_isolation_error_and_changes_nothing(pages, fragment):
    pool = _pool()
    mine = pool.allocate(1, 3).pages
    theirs = pool.allocate(2, 3).pages
    pool.data[mine.astype(np.int64)] = 5.0
    target = {
        "other": [mine[0], theirs[0]],
        "free": [mine[0], 15],
        "twice": [mine[0], mine[0]],
        "range": [mine[0], 99],
    }[pages]
    before = _state(pool)
    with pytest.raises(IsolationError, match=fragment):
        pool.free(1, target)
    _assert_same(pool, before)


def test_double_free_is_refused():
    pool = _pool()
    pages = pool.allocate(1, 2).pages
    pool.free(1, pages)
    with pytest.raises(IsolationError, match="already free"):
        pool.free(1, pages)


@pytest.mark.parametrize("policy", ["zero", "poison", "none"])
def test_scrub_policy_applies_to_freed_pages_only(policy):
    pool = _pool(policy=policy)
    freed = pool.allocate(1, 3).pages
    kept = pool.allocate(2, 3).pages
    pool.data.fill_(5.0)
    pool.free(1, freed)
    freed_data, kept_data = pool.data[freed.astype(np.int64)], pool.data[kept.astype(np.int64)]
    assert (kept_data == 5.0).all()
    if policy == "zero":
        assert (freed_data == 0).all()
    elif policy == "poison":
        assert freed_data.isnan().all()
    else:
        assert (freed_data == 5.0).all()
    assert pool.scrubbed_pages == (0 if policy == "none" else 3)


def test_quarantined_pages_are_scrubbed_even_without_a_scrub_policy():
    pool = _pool(policy="none")
    pages = pool.allocate(1, 3).pages
    pool.data.fill_(5.0)
    pool.set_state(1, pages[:1], PageState.QUARANTINED)
    pool.free(1, pages)
    assert (pool.data[int(pages[0])] == 0).all()
    assert (pool.data[pages[1:].astype(np.int64)] == 5.0).all()


def test_allocation_resets_filled_but_keeps_the_last_writer():
    pool = _pool()
    pages = pool.allocate(1, 2).pages
    idx = torch.from_numpy(pages.astype(np.int64))
    tag = pack_tag(1, 1)
    pool.writer[idx] = tag
    pool.filled[idx] = 4
    pool.free(1, pages)
    grant = pool.allocate(2, 16)
    assert (pool.filled == 0).all()
    assert (pool.writer[idx] == tag).all()  # forensics: who wrote it last
    table = PageTable.from_grant(2, 4, grant)
    assert tag not in table.expected_tags()  # and that tag can never match a new epoch


def test_tags_pack_and_unpack():
    assert unpack_tag(pack_tag(7, 9)) == (7, 9)
    assert unpack_tag(NO_WRITER) is None
    tags = pack_tag(np.int64(5), np.array([1, 2, 2**32 + 3]))
    assert [unpack_tag(t) for t in tags] == [(5, 1), (5, 2), (5, 3)]


def test_page_table_slots_and_block_tables():
    pool = _pool()
    pool.allocate(9, 3)
    grant = pool.allocate(1, 3)
    table = PageTable.from_grant(1, 4, grant)
    positions = np.array([0, 3, 4, 11])
    slots = table.slot_mapping(positions)
    assert slots.tolist() == [grant.pages[0] * 4, grant.pages[0] * 4 + 3, grant.pages[1] * 4, grant.pages[2] * 4 + 3]
    with pytest.raises(IndexError, match="position 12 is past its 12 reserved tokens"):
        table.slot_mapping(np.array([12]))
    short = PageTable.from_grant(2, 4, pool.allocate(2, 1))
    pages, tags = block_tables([table, short])
    assert pages.shape == (2, 3) and tags[1, 1:].tolist() == [-1, -1]
    assert tags[0].tolist() == table.expected_tags().tolist()


class PoolMachine(RuleBasedStateMachine):
    """Random allocate/free sequences keep the books straight and never reuse a tag."""

    def __init__(self):
        super().__init__()
        self.pool = PagePool("decode", 12, PageLayout(1, 1, 1, 2, torch.float32))
        self.held: dict[int, list[int]] = {}
        self.next_slot = 1
        self.seen_tags: set[tuple[int, int]] = set()

    @rule(n=st.integers(0, 14))
    def allocate(self, n):
        slot, self.next_slot = self.next_slot, self.next_slot + 1
        if n > self.pool.free_pages:
            with pytest.raises(PoolExhausted):
                self.pool.allocate(slot, n)
            return
        grant = self.pool.allocate(slot, n)
        self.held[slot] = grant.pages.tolist()
        # A (page, tag) pair names one allocation: it must never come back.
        tags = PageTable.from_grant(slot, 2, grant).expected_tags().tolist()
        for page_tag in zip(grant.pages.tolist(), tags):
            assert page_tag not in self.seen_tags
            self.seen_tags.add(page_tag)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data):
        slot = data.draw(st.sampled_from(sorted(self.held)))
        self.pool.free(slot, self.held.pop(slot))

    @precondition(lambda self: len(self.held) >= 2)
    @rule(data=st.data())
    def free_someone_elses(self, data):
        a, b = data.draw(st.permutations(sorted(self.held)))[:2]
        if self.held[b]:
            with pytest.raises(IsolationError):
                self.pool.free(a, self.held[b][:1])

    @invariant()
    def books_balance(self):
        owned = [p for pages in self.held.values() for p in pages]
        assert len(owned) == len(set(owned))
        assert self.pool.free_pages + len(owned) == self.pool.num_pages
        free = set(range(self.pool.num_pages)) - set(owned)
        assert all(self.pool.owner[p] == FREE_OWNER and self.pool.state[p] == PageState.FREE for p in free)
        for slot, pages in self.held.items():
            assert all(self.pool.owner[p] == slot for p in pages)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_pages_for_tokens_rounds_up():
    pool = _pool()
    assert [pool.pages_for_tokens(n) for n in (1, 4, 5, 64)] == [1, 1, 2, 16]
    assert pool.capacity_tokens == 64 and math.ceil(65 / 4) == 17
