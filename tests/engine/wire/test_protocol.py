"""The wire protocol: round trips, and a clear ProtocolError for everything malformed."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.wire.protocol import (
    PAGE_FIELDS,
    VERSION,
    Message,
    ProtocolError,
    check_page_arrays,
    field_of,
    pack,
    page_arrays,
    unpack,
)


def test_round_trip_with_arrays_of_every_wire_dtype():
    arrays = {
        "u1": np.arange(5, dtype=np.uint8), "i4": np.arange(6, dtype=np.int32).reshape(2, 3),
        "i8": np.array([-1, 2**40], dtype=np.int64), "f4": np.array([1.5], dtype=np.float32),
        "f8": np.zeros((0,), dtype=np.float64), "be": np.arange(3, dtype=">i8"),
    }
    msg = unpack(pack({"op": "x", "n": 3}, arrays))
    assert msg.header == {"v": VERSION, "op": "x", "n": 3}
    for name, arr in arrays.items():
        np.testing.assert_array_equal(msg.arrays[name], arr)
        assert msg.arrays[name].dtype.byteorder in "<|="
    assert not msg.arrays["i4"].flags.writeable  # views of the received frames


@pytest.mark.parametrize(
    "frames, fragment",
    [
        ([], "empty message"),
        ([b"\xc1"], "not valid msgpack"),
        ([msgpack.packb([1, 2])], "header must be a map"),
        ([msgpack.packb({"op": "x"})], "schema version None is not supported"),
        ([msgpack.packb({"v": 2, "op": "x"})], "schema version 2 is not supported"),
        ([msgpack.packb({"v": 1})], "needs a string 'op' or 'topic'"),
        ([msgpack.packb({"v": 1, "op": "x", "e": msgpack.ExtType(1, b"")})], "extension type 1 is not allowed"),
        ([msgpack.packb({"v": 1, "op": "x", "arrays": [["a", "i4", [2]]]})], "describes 1 array frame(s) but 0"),
        ([msgpack.packb({"v": 1, "op": "x", "arrays": [["a", "i4", [2]]]}), b"123"], "3 bytes for shape [2]"),
        ([msgpack.packb({"v": 1, "op": "x", "arrays": [["a", "O", [1]]]}), b"x"], "bad array spec"),
        ([msgpack.packb({"v": 1, "op": "x", "arrays": [["a", "i4", [-1]]]}), b""], "bad array spec"),
        ([msgpack.packb({"v": 1, "op": "x", "arrays": "nope"})], "'arrays' must be a list"),
    ],
)
def test_malformed_messages_are_refused_with_a_reason(frames, fragment):
    with pytest.raises(ProtocolError) as err:
        unpack(frames)
    assert fragment in str(err.value)


def test_field_of_checks_types_and_ranges():
    msg = Message({"n": 3, "b": True, "s": "x", "l": [1, 2], "f": 1.5, "bad_l": [1, "2"]})
    assert field_of(msg, "n", "int", low=0, high=5) == 3
    assert field_of(msg, "missing", "int", default=7) == 7
    assert field_of(msg, "f", "float") == 1.5 and field_of(msg, "n", "float") == 3
    with pytest.raises(ProtocolError, match="field 'missing' is required"):
        field_of(msg, "missing", "int")
    with pytest.raises(ProtocolError, match="field 'b' must be int, got True"):
        field_of(msg, "b", "int")
    with pytest.raises(ProtocolError, match="field 'bad_l' must be list\\[int\\]"):
        field_of(msg, "bad_l", "list[int]")
    with pytest.raises(ProtocolError, match="field 'n' = 3 is above the maximum 2"):
        field_of(msg, "n", "int", high=2)
    with pytest.raises(ProtocolError, match="field 'l' has 2 items, more than 1"):
        field_of(msg, "l", "list[int]", max_len=1)


def test_page_arrays_are_typed_and_checked():
    meta = {"owner": np.array([1, -1]), "epoch": np.array([3, 0]), "writer": np.array([7, -1]),
            "filled": np.array([16, 0]), "state": np.array([3, 0])}
    full = unpack(pack({"op": "pages"}, page_arrays(meta)))
    check_page_arrays(full, 2)
    assert {k: full.arrays[k].dtype for k in PAGE_FIELDS} == {k: np.dtype(v) for k, v in PAGE_FIELDS.items()}
    delta = unpack(pack({"op": "pages"}, page_arrays(meta, np.array([1]))))
    check_page_arrays(delta, 2)
    with pytest.raises(ProtocolError, match="page index outside 0..0"):
        check_page_arrays(delta, 1)
    with pytest.raises(ProtocolError, match="lacks a 1-D int32 array 'owner'"):
        check_page_arrays(unpack(pack({"op": "pages"}, {**page_arrays(meta), "owner": np.zeros(2)})))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), min_size=0, max_size=4))
def test_random_frames_never_raise_anything_but_protocol_error(frames):
    try:
        unpack(frames)
    except ProtocolError:
        pass


def test_message_id_is_found_in_headers_that_do_not_unpack():
    from engine.wire.protocol import message_id

    assert message_id([msgpack.packb({"v": 1, "op": "x", "id": 7}), b"extra"]) == 7
    assert message_id([msgpack.packb({"big": "y" * 100_000, "nested": {"a": [1, 2]}, "id": "abc"})]) == "abc"
    for frames in ([], [b""], [b"\xc1garbage"], [msgpack.packb([1, 2])], [msgpack.packb({"id": True})],
                   [msgpack.packb({"id": 1.5})], [msgpack.packb({"id": "x" * 65})],
                   [msgpack.packb({f"k{i}": i for i in range(100)} | {"id": 3})]):  # id past the first 64 keys
        assert message_id(frames) is None, frames
