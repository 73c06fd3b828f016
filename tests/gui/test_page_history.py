"""PageHistory: every frame rebuilt equals the mirror as it was recorded, within its bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.client.page_mirror import PageMirror, PoolMirror
from engine.wire.protocol import PAGE_FIELDS
from gui.model.page_history import KEYFRAME_EVERY, PageHistory


def pool(name: str, pages: int) -> PoolMirror:
    arrays = {k: np.zeros(pages, dtype=t) for k, t in PAGE_FIELDS.items()}
    arrays["owner"][:] = -1
    return PoolMirror(name, name.split("-")[0], pages, 16, 0, arrays)


def owner_of(slot: int):
    return (f"req-{slot}", f"tenant-{slot % 3}")


def copy_of(mirror: PageMirror) -> dict:
    return {name: {k: v.copy() for k, v in p.arrays.items()} for name, p in mirror.pools.items()}


def assert_frame_equals(frame, expected: dict) -> None:
    assert set(frame.pools) == set(expected)
    for name, arrays in expected.items():
        for k in PAGE_FIELDS:
            np.testing.assert_array_equal(frame.pools[name].arrays[k], arrays[k], err_msg=f"{name}.{k}")


step = st.tuples(st.sampled_from(["write", "free", "add_pool", "drop_pool", "nothing"]),
                 st.integers(0, 10_000), st.integers(0, 40))


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=150), st.sampled_from([10**9, 20_000, 4_000]))
def test_every_frame_kept_rebuilds_exactly(steps, budget):
    """Random writes, frees, pools coming and going, and a budget that evicts: frame i is
    the mirror as it was when frame i was recorded; the first frame always rebuilds alone."""
    mirror = PageMirror()
    mirror.pools["prefill-0"] = pool("prefill-0", 83)
    history = PageHistory(window_s=1e9, interval_s=0.0, budget_bytes=budget)
    recorded: list[tuple[float, dict]] = []
    for t, (op, a, b) in enumerate(steps):
        names = sorted(mirror.pools)
        if op == "write" and names:
            p = mirror.pools[names[a % len(names)]]
            page = a % p.num_pages
            p.arrays["owner"][page], p.arrays["state"][page] = b, 2
            p.arrays["writer"][page], p.arrays["filled"][page] = a * 7 + b, b % 16
            p.arrays["epoch"][page] += 1
        elif op == "free" and names:
            p = mirror.pools[names[a % len(names)]]
            p.arrays["owner"][a % p.num_pages], p.arrays["state"][a % p.num_pages] = -1, 0
        elif op == "add_pool":
            mirror.pools[f"decode-{b % 3}"] = pool(f"decode-{b % 3}", 20 + b)
        elif op == "drop_pool" and len(names) > 1:
            del mirror.pools[names[a % len(names)]]
        if history.record(mirror, owner_of, float(t)):
            recorded.append((float(t), copy_of(mirror)))
    assert len(history) >= 1
    kept = recorded[len(recorded) - len(history):]  # the oldest went first
    assert history.times() == [t for t, _ in kept]
    for i, (_, expected) in enumerate(kept):
        assert_frame_equals(history.frame(i), expected)
    assert history.nbytes <= budget or len(history) == 1
    assert history.dropped == len(recorded) - len(history)


def test_only_changes_make_frames_and_the_interval_holds():
    mirror = PageMirror()
    mirror.pools["prefill-0"] = pool("prefill-0", 83)
    history = PageHistory(interval_s=0.5)
    assert history.record(mirror, owner_of, 100.0)
    assert not history.record(mirror, owner_of, 101.0)  # nothing changed
    mirror.pools["prefill-0"].arrays["owner"][5] = 3
    assert history.record(mirror, owner_of, 101.2)
    mirror.pools["prefill-0"].arrays["owner"][6] = 3
    assert not history.record(mirror, owner_of, 101.4)  # within the interval of the last frame
    assert history.record(mirror, owner_of, 101.8)
    assert history.times() == [100.0, 101.2, 101.8]


def test_owners_are_those_of_the_time():
    """A slot reused by a later request: the old frame names the request of its time."""
    mirror = PageMirror()
    mirror.pools["prefill-0"] = pool("prefill-0", 8)
    history = PageHistory(interval_s=0.0)
    mirror.pools["prefill-0"].arrays["owner"][2] = 7
    history.record(mirror, lambda s: ("leaker", "acme"), 1.0)
    mirror.pools["prefill-0"].arrays["owner"][3] = 9  # a change, and slot 7 now belongs to another
    history.record(mirror, lambda s: ("later", "globex"), 2.0)
    old, new = history.frame(0), history.frame(-1)
    assert old.request_of_slot(7) == "leaker" and old.tenant_of_slot(7) == "acme"
    assert new.request_of_slot(7) == "later" and new.request_of_slot(9) == "later"
    assert old.request_of_slot(9) is None


def test_the_window_drops_old_frames_and_keyframes_bound_rebuilds():
    mirror = PageMirror()
    mirror.pools["prefill-0"] = pool("prefill-0", 10_000)
    history = PageHistory(window_s=30.0, interval_s=0.0)
    for t in range(200):
        mirror.pools["prefill-0"].arrays["owner"][t] = t
        history.record(mirror, owner_of, float(t))
    assert history.times()[0] == 169.0 and len(history) == 31  # 169..199: within 30 s of the newest
    assert history.frame(0).pools["prefill-0"].arrays["owner"][169] == 169
    assert history.frame(0).pools["prefill-0"].arrays["owner"][170] == -1
    keys = sum(1 for f in history._frames if f.is_key())
    assert keys >= len(history) // KEYFRAME_EVERY
    assert history.index_at(168.5) is None and history.index_at(180.2) == 11
    with pytest.raises(IndexError, match="history frame 31 out of range: 31 frames kept"):
        history.frame(31)


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="budget_bytes > 0"):
        PageHistory(budget_bytes=0)
