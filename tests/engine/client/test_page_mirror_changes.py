"""PageMirror collects the pages changed since its reader last took them (issue 13)."""

from __future__ import annotations

import numpy as np

from engine.client import PageMirror
from engine.wire.protocol import pack, unpack

N = 64


def meta(n: int = N) -> dict[str, np.ndarray]:
    return {"owner": np.full(n, -1, np.int32), "epoch": np.zeros(n, np.int64), "writer": np.full(n, -1, np.int64),
            "filled": np.zeros(n, np.int32), "state": np.zeros(n, np.uint8)}


def send(mirror: PageMirror, kind: str, seq: int, arrays: dict, index=None, n: int = N) -> bool:
    header = {"topic": "pages/p", "pool": "p", "role": "decode", "kind": kind, "seq": seq, "num_pages": n,
              "page_size": 16}
    if index is not None:
        index = np.asarray(index, np.int32)
        arrays = {"index": index, **{k: v[index] for k, v in arrays.items()}}
    return mirror.apply(unpack(pack(header, arrays)))


def test_two_deltas_between_takes_give_their_union():
    mirror, truth = PageMirror(), meta()
    send(mirror, "keyframe", 1, truth)
    pool = mirror.pools["p"]
    assert pool.take_changes() is None  # a new pool: everything
    truth["owner"][[5, 6]] = 1
    send(mirror, "delta", 2, truth, [5, 6])
    truth["owner"][[6, 9]] = 2
    send(mirror, "delta", 3, truth, [9, 6])
    assert pool.changed.tolist() == [9, 6]  # the last message only
    assert pool.take_changes().tolist() == [5, 6, 9]
    assert pool.take_changes().tolist() == []  # taken


def test_a_resync_keyframe_of_the_same_pool_adds_what_differs_and_keeps_the_object():
    mirror, truth = PageMirror(), meta()
    send(mirror, "keyframe", 1, truth)
    pool = mirror.pools["p"]
    pool.take_changes()
    truth["state"][3] = 3
    send(mirror, "delta", 2, truth, [3])
    truth["owner"][[7, 8]] = 4
    assert not send(mirror, "delta", 4, truth, [7, 8])  # seq 3 was lost: stale
    truth["filled"][20] = 16
    assert send(mirror, "keyframe", 5, truth)
    assert mirror.pools["p"] is pool and not pool.stale and pool.seq == 5
    assert pool.take_changes().tolist() == [3, 7, 8, 20]
    for key, value in truth.items():
        assert (pool.arrays[key] == value).all(), key


def test_a_keyframe_of_another_size_is_a_new_pool_with_every_page_changed():
    mirror = PageMirror()
    send(mirror, "keyframe", 1, meta())
    old = mirror.pools["p"]
    old.take_changes()
    send(mirror, "keyframe", 2, meta(128), n=128)
    assert mirror.pools["p"] is not old and mirror.pools["p"].take_changes() is None


def test_an_unread_pool_keeps_at_most_its_pages_pending():
    mirror, truth = PageMirror(), meta()
    send(mirror, "keyframe", 1, truth)
    pool = mirror.pools["p"]
    pool.take_changes()
    for seq in range(2, 200):
        page = seq % 10
        truth["epoch"][page] = seq
        send(mirror, "delta", seq, truth, [page])
    assert pool._pending_count <= 2 * N
    assert pool.take_changes().tolist() == list(range(10))
