"""KvEventMap (Qt-free): a KvEventState as page-map arrays, one pool per rank and medium,
blocks at their stable slots with their lineage as owner; the event rate; hover text."""

from __future__ import annotations

import numpy as np
import pytest

from engine.adapters.kv_event_decode import AllBlocksCleared, Batch, BlockRemoved, BlockStored
from engine.adapters.kv_event_state import KvEventState
from gui.model import kv_event_map
from gui.model.kv_event_map import EventRate, KvEventMap, slots_for
from gui.model.page_colors import FREE, FREE_OWNER, WRITTEN


def h(n: int) -> str:
    return f"{n:016x}"


def store(hashes, parent=None, medium="GPU") -> BlockStored:
    return BlockStored([h(n) for n in hashes], None if parent is None else h(parent), list(range(16 * len(hashes))),
                       16, None, medium)


def feed(state: KvEventState, *events, rank: int = 0) -> None:
    state.apply(Batch(seq=state.batches, ts=0.0, dp_rank=rank, events=list(events)), f"tcp://127.0.0.1:{5557 + rank}")


@pytest.fixture(autouse=True)
def rebuild_every_time(monkeypatch):
    monkeypatch.setattr(kv_event_map, "BUILD_SHARE_INVERSE", 1)


def test_blocks_sit_at_their_slots_with_their_lineage_as_owner():
    state, model = KvEventState(), KvEventMap()
    feed(state, store([1, 2, 3]), store([4, 5], parent=3), store([9, 10]))
    assert model.update(state) and not model.update(state)  # nothing new: no rebuild
    pool = model.pools["rank 0 · GPU"]
    owner, flags = pool.mirror.arrays["owner"], pool.mirror.arrays["state"]
    assert pool.num_slots == 64 and (pool.blocks, pool.lineages, pool.tokens) == (7, 2, 112)
    assert owner[:5].tolist() == [model.lineage_of(h(1))] * 5 and owner[5:7].tolist() == [model.lineage_of(h(9))] * 2
    assert model.lineage_of(h(1)) != model.lineage_of(h(9))
    assert (owner[7:] == FREE_OWNER).all() and (flags[:7] == WRITTEN).all() and (flags[7:] == FREE).all()
    assert model.block_at("rank 0 · GPU", 4).hash == h(5) and model.block_at("rank 0 · GPU", 7) is None
    with pytest.raises(IndexError):
        model.block_at("rank 0 · GPU", 64)


def test_changed_slots_are_named_and_the_pool_only_grows():
    state, model = KvEventState(), KvEventMap()
    feed(state, store(range(1, 11)))
    model.update(state)
    mirror = model.pools["rank 0 · GPU"].mirror
    seq = mirror.seq
    feed(state, BlockRemoved([h(3), h(4)], "GPU"))
    model.update(state)
    assert model.pools["rank 0 · GPU"].mirror is mirror and mirror.seq == seq + 1
    assert mirror.changed.tolist() == [2, 3]
    feed(state, store(range(100, 200)))  # 108 blocks: the pool grows to 128
    model.update(state)
    assert model.pools["rank 0 · GPU"].num_slots == 128 == slots_for(108)
    feed(state, BlockRemoved([h(n) for n in range(100, 200)], "GPU"))
    model.update(state)
    assert model.pools["rank 0 · GPU"].num_slots == 128 and model.occupied("rank 0 · GPU") == 8


def test_ranks_and_media_get_their_own_maps_in_order_and_a_cleared_rank_keeps_an_empty_one():
    state, model = KvEventState(), KvEventMap()
    feed(state, store([1, 2], medium="CPU"), store([1, 2], medium="GPU"), rank=0)
    feed(state, store([1], medium=None), rank=1)
    model.update(state)
    assert list(model.pools) == ["rank 0 · GPU", "rank 0 · CPU", "rank 1 · unspecified"]
    assert len({model.pools[name].mirror.arrays["owner"][0] for name in model.pools}) == 1  # one prefix, one id
    feed(state, AllBlocksCleared(), rank=0)
    model.update(state)
    assert list(model.pools) == ["rank 0 · GPU", "rank 0 · CPU", "rank 1 · unspecified"]
    assert model.occupied("rank 0 · GPU") == model.occupied("rank 0 · CPU") == 0
    assert model.pools["rank 0 · GPU"].endpoints == ["tcp://127.0.0.1:5557"]


def test_a_lineage_that_is_gone_is_forgotten_and_comes_back_with_a_new_id():
    state, model = KvEventState(), KvEventMap()
    feed(state, store([1, 2]))
    model.update(state)
    first = model.lineage_of(h(1))
    feed(state, BlockRemoved([h(1), h(2)], "GPU"))
    model.update(state)
    assert model.lineage_of(h(1)) is None and not model.lineage_blocks
    feed(state, store([1]))
    model.update(state)
    assert model.lineage_of(h(1)) not in (None, first)  # ids are never reused: colours stay honest


def test_hover_text_names_hash_parent_tokens_medium_and_root():
    state, model = KvEventState(), KvEventMap()
    feed(state, store([1, 2, 3]))
    model.update(state)
    text = model.describe("rank 0 · GPU", 2)
    for part in ("rank 0 · GPU · slot 2 (row 0, col 2)", f"hash {h(3)}", f"parent {h(2)}", "16 tokens",
                 "medium GPU", f"root {h(1)} · lineage of 3 blocks held"):
        assert part in text, (part, text)
    assert "parent none" in model.describe("rank 0 · GPU", 0) and f"root {h(1)} (this block)" in \
        model.describe("rank 0 · GPU", 0)
    assert model.describe("rank 0 · GPU", 10).endswith("\nfree")


def test_a_large_state_is_rebuilt_less_often_and_the_change_is_picked_up_later(monkeypatch):
    monkeypatch.setattr(kv_event_map, "BUILD_SHARE_INVERSE", 10**9)  # any rebuild blocks the next for long
    state, model = KvEventState(), KvEventMap()
    feed(state, store([1]))
    assert model.update(state)
    feed(state, store([2]))
    assert not model.update(state) and model.occupied("rank 0 · GPU") == 1
    model._build_after = 0.0  # time has passed
    assert model.update(state) and model.occupied("rank 0 · GPU") == 2


def test_the_event_rate_spans_the_window():
    rate = EventRate(window_s=3.0)
    assert rate.per_second() == 0.0
    for second in range(11):
        rate.add(float(second), 100 * second)
    assert rate.per_second() == pytest.approx(100.0)
    assert rate.samples[0][0] == 7.0  # one sample at the window's start is kept
    rate.add(11.0, 1000)  # nothing new in the last second
    assert rate.samples[0][0] == 8.0 and rate.per_second() == pytest.approx(200 / 3)


def test_status_text_counts_events_gaps_replays_and_refusals():
    state, model = KvEventState(), KvEventMap()
    feed(state, store([1, 2]))
    state.record_gap("tcp://127.0.0.1:5557", 3, 5, filled=True)
    state.record_replay(2, complete=True)
    state.record_refusal("tcp://127.0.0.1:5557", "payload is not msgpack")
    model.update(state, now=0.0)
    text = model.status_text(state, ["tcp://127.0.0.1:5557"])
    assert text.startswith("tcp://127.0.0.1:5557 · ") and "1 events" in text
    assert "gaps 1 (0 unfilled) · replays 1 (0 failed) · refused 1" in text
    details = model.health_details(state, ["tcp://127.0.0.1:5557"])
    assert "expected seq 3, got 5 (filled by replay)" in details and "payload is not msgpack" in details
    assert np.count_nonzero(model.pools["rank 0 · GPU"].mirror.arrays["state"] == WRITTEN) == 2
