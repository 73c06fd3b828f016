"""The optional `refs` page array (how many live requests hold a page: engines that share
pages, such as vLLM's prefix cache) on the wire and in the PageMirror."""

from __future__ import annotations

import numpy as np
import pytest

from engine.client.page_mirror import PageMirror
from engine.wire.protocol import (
    OPTIONAL_PAGE_FIELDS,
    PAGE_FIELDS,
    ProtocolError,
    check_page_arrays,
    pack,
    page_arrays,
    unpack,
)

FREE, RESERVED, WRITTEN = 0, 1, 3
N = 8


def meta(refs: np.ndarray | None = None) -> dict[str, np.ndarray]:
    m = {"owner": np.array([1, 1, 2, -1, -1, 3, -1, -1], np.int32), "epoch": np.ones(N, np.int64),
         "writer": np.full(N, -1, np.int64), "filled": np.full(N, 16, np.int32),
         "state": np.array([WRITTEN, WRITTEN, WRITTEN, FREE, FREE, RESERVED, FREE, FREE], np.uint8)}
    if refs is not None:
        m["refs"] = refs
    return m


def keyframe(m: dict, seq: int = 1, pool: str = "vllm"):
    header = {"topic": f"pages/{pool}", "pool": pool, "role": "vllm", "kind": "keyframe", "seq": seq,
              "num_pages": N, "page_size": 16}
    return unpack(pack(header, page_arrays(m)))


def delta(m: dict, index, seq: int, pool: str = "vllm"):
    header = {"topic": f"pages/{pool}", "pool": pool, "kind": "delta", "seq": seq}
    return unpack(pack(header, page_arrays(m, np.asarray(index))))


REFS = np.array([3, 2, 1, 0, 0, 1, 0, 0], np.int32)


def test_refs_is_declared_once_as_an_optional_int32_page_field():
    assert OPTIONAL_PAGE_FIELDS == {"refs": np.int32}
    assert "refs" not in PAGE_FIELDS
    assert set(page_arrays(meta())) == set(PAGE_FIELDS)  # our engine sends no refs
    sent = page_arrays(meta(REFS), np.array([0, 2]))
    assert sent["refs"].dtype == np.int32 and sent["refs"].tolist() == [3, 1]


def test_a_keyframe_with_refs_is_kept_and_gives_the_holders():
    mirror = PageMirror()
    assert mirror.apply(keyframe(meta(REFS)))
    pool = mirror.pools["vllm"]
    assert pool.has_refs
    np.testing.assert_array_equal(pool.holders(), REFS)
    assert pool.holders(1) == 2
    assert pool.shared_pages().tolist() == [0, 1]


def test_a_delta_updates_refs():
    mirror = PageMirror()
    mirror.apply(keyframe(meta(REFS)))
    m = meta(REFS.copy())
    m["refs"][[1, 2]] = [1, 4]
    assert mirror.apply(delta(m, [1, 2], seq=2))
    pool = mirror.pools["vllm"]
    assert pool.holders().tolist() == [3, 1, 4, 0, 0, 1, 0, 0]
    assert pool.shared_pages().tolist() == [0, 2]
    # a delta that leaves refs out: those pages fall back to 1 if held, else 0
    assert mirror.apply(delta(meta(), [0, 3], seq=3))
    assert pool.holders().tolist() == [1, 1, 4, 0, 0, 1, 0, 0]


def test_a_pool_without_refs_has_one_holder_per_page_in_use():
    mirror = PageMirror()
    mirror.apply(keyframe(meta(), pool="decode-0"))
    pool = mirror.pools["decode-0"]
    assert not pool.has_refs and "refs" not in pool.arrays
    assert pool.holders().tolist() == [1, 1, 1, 0, 0, 1, 0, 0]
    assert pool.holders().dtype == np.int32
    assert pool.shared_pages().tolist() == []
    # refs that start with a delta: the other pages keep the default
    m = meta(REFS)
    assert mirror.apply(delta(m, [0], seq=2, pool="decode-0"))
    assert pool.holders().tolist() == [3, 1, 1, 0, 0, 1, 0, 0]


def test_a_resync_keyframe_that_changes_only_refs_marks_those_pages_changed():
    mirror = PageMirror()
    mirror.apply(keyframe(meta(REFS)))
    pool = mirror.pools["vllm"]
    pool.take_changes()
    refs = REFS.copy()
    refs[5] = 2
    mirror.apply(keyframe(meta(refs), seq=9))
    assert pool.take_changes().tolist() == [5]
    mirror.apply(keyframe(meta(), seq=10))  # refs gone: page 0 and 1 now count 1 holder
    assert not pool.has_refs and pool.take_changes().tolist() == [0, 1, 5]


@pytest.mark.parametrize("refs, message", [
    (np.zeros(N, np.int64), "'refs' must be 1-D int32, got 1-D int64"),
    (np.zeros(N, np.uint8), "'refs' must be 1-D int32"),
    (np.zeros((N, 1), np.int32), "'refs' must be 1-D int32, got 2-D"),
    (np.zeros(N - 1, np.int32), "'refs' has 7 entries"),
    (np.full(N, -1, np.int32), "'refs' holds a negative count"),
])
def test_a_bad_refs_array_is_refused_naming_it(refs, message):
    header = {"topic": "pages/vllm", "pool": "vllm", "kind": "keyframe", "seq": 1, "num_pages": N, "page_size": 16}
    msg = unpack(pack(header, {**page_arrays(meta()), "refs": refs}))
    with pytest.raises(ProtocolError, match=message.replace("(", r"\(")):
        check_page_arrays(msg, N)
    with pytest.raises(ProtocolError, match="refs"):
        PageMirror().apply(msg)


def test_a_bad_refs_in_a_delta_is_refused():
    mirror = PageMirror()
    mirror.apply(keyframe(meta(REFS)))
    header = {"topic": "pages/vllm", "pool": "vllm", "kind": "delta", "seq": 2}
    msg = unpack(pack(header, {**page_arrays(meta(), np.array([0, 1])), "refs": np.array([1.0, 2.0])}))
    with pytest.raises(ProtocolError, match="'refs'"):
        mirror.apply(msg)

