"""KV transfer (I3, I4): chunks are checked against the reservation before a byte lands,
pages become WRITTEN with the request's tags only after the last chunk, and late or
malformed messages never touch the decode pool."""

from __future__ import annotations

from dataclasses import dataclass

import msgpack
import numpy as np
import pytest
import torch
import xxhash
import zmq
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.errors import IsolationError
from engine.kv.page_pool import PageLayout, PagePool
from engine.wire.page_tags import NO_WRITER, PageState, pack_tag
from engine.wire.protocol import ProtocolError, pack_header, unpack_header
from engine.workers.transfer.manifest import KVLayout, Reservation, page_checksum
from engine.workers.transfer.receive import TransferReceiver
from engine.workers.transfer.send import build_transfer

LAYOUT = PageLayout(num_layers=2, num_kv_heads=2, head_dim=8, page_size=4, dtype=torch.float32)
PAGE_BYTES = LAYOUT.bytes_per_page  # 1,024
SLOT, OTHER_SLOT = 5, 9


@dataclass
class Rig:
    prefill: PagePool
    decode: PagePool
    src: np.ndarray  # prefill pages holding the prompt
    res: Reservation
    rx: TransferReceiver
    clock: list  # rx's clock reads clock[0]


def _index(pages) -> torch.Tensor:
    return torch.from_numpy(np.asarray(pages, dtype=np.int64))


def _rig(tokens: int = 10, epoch: int = 7, request_id: str = "req-1", seed: int = 0, rig: Rig | None = None) -> Rig:
    """Two pools; prompt K/V random in the prefill pool; the decode pages reserved IN_FLIGHT.
    Decode pages are offset by another slot's grant so that page ids differ across pools."""
    if rig is None:
        prefill, decode = PagePool("prefill", 16, LAYOUT), PagePool("decode", 24, LAYOUT)
        decode.allocate(OTHER_SLOT, 3)
        decode.track_dirty = True
        clock = [0.0]
    else:
        prefill, decode, clock = rig.prefill, rig.decode, rig.clock
    slot = SLOT if rig is None else SLOT + 1
    n = prefill.pages_for_tokens(tokens)
    src = prefill.allocate(slot, n).pages
    gen = torch.Generator().manual_seed(seed)
    prefill.data[_index(src)] = torch.randn((n, *LAYOUT.page_shape), generator=gen)
    # the prefill forward pass stamps the prompt's token slots with the request's tag
    positions = np.arange(n * LAYOUT.page_size).reshape(n, LAYOUT.page_size)
    own = pack_tag(np.int64(slot), prefill.epoch[src].astype(np.int64))[:, None]
    prefill.token_writer[_index(src)] = torch.from_numpy(np.where(positions < tokens, own, NO_WRITER))
    grant = decode.allocate(slot, n + 2)  # the whole request: prompt + new tokens
    decode.set_state(slot, grant.pages[:n], PageState.IN_FLIGHT)
    res = Reservation(request_id, slot, epoch, tokens, grant.pages[:n], grant.epochs[:n])
    rx = rig.rx if rig is not None else TransferReceiver(decode, clock=lambda: clock[0])
    rx.expect(res)
    return Rig(prefill, decode, src, res, rx, clock)


def _messages(rig: Rig, chunk_bytes: int = 2 * PAGE_BYTES, **kw) -> list[list]:
    kw.setdefault("first_token", 42)
    return build_transfer(rig.prefill, rig.src, rig.res.to_wire(), chunk_bytes=chunk_bytes, sender="prefill-0", **kw)


def _feed(rig: Rig, messages) -> list:
    events = [rig.rx.on_message(m) for m in messages]
    return [e for e in events if e is not None]


def _forged(message: list, **changes) -> list:
    header = unpack_header(message[0])
    header.pop("v")
    header.update(changes)
    return [pack_header(header), *message[1:]]


def _meta(pool: PagePool, pages) -> dict:
    snap = pool.metadata_snapshot()
    return {k: v[np.asarray(pages)].tolist() for k, v in snap.items()}


def _assert_not_written(rig: Rig) -> None:
    meta = _meta(rig.decode, rig.res.pages)
    assert meta["writer"] == [NO_WRITER] * len(rig.res.pages)
    assert meta["filled"] == [0] * len(rig.res.pages)
    assert meta["state"] == [PageState.IN_FLIGHT] * len(rig.res.pages)


def _assert_landed(rig: Rig) -> None:
    assert torch.equal(rig.decode.data[_index(rig.res.pages)], rig.prefill.data[_index(rig.src)])
    meta = _meta(rig.decode, rig.res.pages)
    assert meta["writer"] == pack_tag(np.int64(rig.res.slot), rig.res.page_epochs).tolist()
    ps = LAYOUT.page_size
    assert meta["filled"] == [min(ps, rig.res.tokens - j * ps) for j in range(len(rig.res.pages))]
    assert meta["state"] == [PageState.WRITTEN] * len(rig.res.pages)
    # I1's per-slot tags: the prompt's slots are the request's for the decode epoch, the rest nobody's
    tags = rig.decode.token_writer[_index(rig.res.pages)].numpy()
    positions = np.arange(tags.size).reshape(tags.shape)
    own = pack_tag(np.int64(rig.res.slot), rig.res.page_epochs)[:, None]
    assert np.array_equal(tags, np.where(positions < rig.res.tokens, own, NO_WRITER))


# ---- complete transfers ------------------------------------------------------------------

@pytest.mark.parametrize("transport", ["tcp", "inproc"])
def test_transfer_over_zeromq_lands_byte_identical_with_tags_filled_and_state(transport):
    rig = _rig(tokens=10)  # 3 pages, the last holding 2 tokens
    rig.decode.take_dirty()
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    try:
        if transport == "tcp":
            port = pull.bind_to_random_port("tcp://127.0.0.1")
            push.connect(f"tcp://127.0.0.1:{port}")
        else:
            pull.bind("inproc://kv")
            push.connect("inproc://kv")
        messages = _messages(rig)
        assert len(messages) == 2
        for frames in messages:
            push.send_multipart(frames, copy=False)
        events = []
        for _ in messages:
            assert pull.poll(5000), "chunk did not arrive"
            event = rig.rx.on_message(pull.recv_multipart(copy=False))
            events.append(event)
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
    assert events[0] is None
    assert events[1].kind == "complete" and events[1].first_token == 42 and events[1].sender == "prefill-0"
    assert events[1].pages == rig.res.pages.tolist()
    _assert_landed(rig)
    assert set(rig.res.pages.tolist()) <= set(rig.decode.take_dirty().tolist())
    rest = rig.decode.owner == SLOT
    rest[rig.res.pages] = False  # the pages reserved for new tokens stay RESERVED and unwritten
    assert (rig.decode.state[rest] == PageState.RESERVED).all() and rest.sum() == 2
    assert rig.rx.pending() == [] and rig.rx.counts["complete"] == 1


@pytest.mark.parametrize("chunk_bytes, chunks", [(1, 5), (PAGE_BYTES, 5), (3 * PAGE_BYTES - 1, 3), (1 << 20, 1)])
def test_chunk_sizes_split_pages_and_all_land(chunk_bytes, chunks):
    rig = _rig(tokens=17)  # 5 pages, the last holding one token
    messages = _messages(rig, chunk_bytes=chunk_bytes)
    assert len(messages) == chunks
    assert [unpack_header(m[0])["count"] for m in messages] == [len(m) - 2 for m in messages]  # + tags
    events = _feed(rig, messages)
    assert [e.kind for e in events] == ["complete"]
    _assert_landed(rig)


def test_checksums_are_xxh3_of_the_page_bytes():
    rig = _rig(tokens=8)
    header = unpack_header(_messages(rig)[0][0])
    rows = rig.prefill.data[_index(rig.src)].numpy()
    assert header["checksums"] == [page_checksum(rows[j].tobytes()) for j in range(2)]
    assert header["checksums"][0] == xxhash.xxh3_64_intdigest(rows[0].tobytes())
    assert header["layout"] == KVLayout.of(rig.decode).to_wire() == {
        "dtype": "float32", "page_shape": [2, 2, 4, 2, 8], "bytes_per_page": PAGE_BYTES}
    msgpack.packb(header)


def test_two_transfers_interleaved_each_land_in_their_own_pages():
    a = _rig(tokens=9, epoch=1)
    b = _rig(tokens=6, epoch=2, request_id="req-2", seed=1, rig=a)
    ma, mb = _messages(a, chunk_bytes=PAGE_BYTES), _messages(b, chunk_bytes=PAGE_BYTES)
    events = _feed(a, [ma[0], mb[0], ma[1], mb[1], ma[2]])
    assert [(e.kind, e.request_id) for e in events] == [("complete", "req-2"), ("complete", "req-1")]
    _assert_landed(a)
    _assert_landed(b)


# ---- mismatches: nothing stamped, the request stops being expected ----------------------

def _corrupt_byte(messages):
    page = bytearray(messages[0][2])
    page[100] ^= 0x01
    messages[0][2] = bytes(page)
    return messages


def _other_dtype(rig):
    bf16 = PageLayout(LAYOUT.num_layers, LAYOUT.num_kv_heads, LAYOUT.head_dim, LAYOUT.page_size, torch.bfloat16)
    other = PagePool("prefill-bf16", 16, bf16)
    src = other.allocate(SLOT, len(rig.src)).pages
    return build_transfer(other, src, rig.res.to_wire(), first_token=1, chunk_bytes=2 * PAGE_BYTES)


def _pages_moved(rig):
    # the caller freed the pages without cancel() and they went to another request
    rig.decode.free(SLOT, rig.res.pages)
    rig.decode.allocate(OTHER_SLOT, rig.decode.free_pages)
    return _messages(rig)


MISMATCHES = {
    "epoch": (lambda r, m: [_forged(x, epoch=8) for x in m], "epoch 8 != reserved 7"),
    "token count": (lambda r, m: build_transfer(r.prefill, r.src[:2], r.res.to_wire(), first_token=1, tokens=5),
                    "token count 5 != reserved 10"),
    "page count": (lambda r, m: [_forged(x, pages=r.res.pages[:2].tolist()) for x in m], "page count 2 != reserved 3"),
    "page ids": (lambda r, m: [_forged(x, pages=[int(r.res.pages[0]), 0, int(r.res.pages[2])]) for x in m],
                 "page ids differ at index 1: 0 != reserved"),
    "page_epochs": (lambda r, m: [_forged(x, page_epochs=[9, 1, 1]) for x in m],
                    "page_epochs differ at index 0: 9 != reserved 1"),
    "layout dtype": (lambda r, m: _other_dtype(r), "layout dtype 'bfloat16' != 'float32'"),
    "checksum": (lambda r, m: _corrupt_byte(m), "checksum of page"),
    "tags corrupted": (lambda r, m: [m[0][:-1] + [bytes([bytes(m[0][-1])[0] ^ 1]) + bytes(m[0][-1])[1:]], m[1]],
                       "checksum of the token tags"),
    "missing frame": (lambda r, m: [m[0][:-2] + m[0][-1:], m[1]], "count 2 != page frames present 1"),
    "truncated frame": (lambda r, m: [[*m[0][:2], bytes(m[0][2])[:-1]], m[1]],
                        "is 1,023 bytes, bytes_per_page is 1,024"),
    "out of order": (lambda r, m: [m[1], m[0]], "chunk 1 != expected 0"),
    "duplicate chunk": (lambda r, m: [m[0], m[0], m[1]], "chunk 0 != expected 1"),
    "first": (lambda r, m: [m[0], _forged(m[1], first=1)], "first 1 != expected 2"),
    "last chunk short": (lambda r, m: [_forged(m[0], chunks=1)], "chunk 0 is the last of 1 but pages end at 2 of 3"),
    "checksum list": (lambda r, m: [_forged(m[0], checksums=[1])], "checksums has 1 entries for count 2"),
    "pages reallocated": (lambda r, m: _pages_moved(r), "is owner 9"),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatch_names_the_field_and_stamps_nothing(case):
    rig = _rig(tokens=10)
    mutate, expected = MISMATCHES[case]
    events = _feed(rig, mutate(rig, _messages(rig)))
    assert events and events[0].kind == "mismatch", events
    assert expected in events[0].detail and "req-1" in events[0].detail
    assert events[0].pages == rig.res.pages.tolist()  # what the caller scrubs and frees
    assert all(e.kind == "late" for e in events[1:]), events
    assert rig.rx.pending() == [] and rig.rx.counts["mismatch"] == 1
    if case != "pages reallocated":
        _assert_not_written(rig)
    else:
        assert (rig.decode.writer == NO_WRITER).all() and (rig.decode.data == 0).all()
    # the genuine transfer arriving afterwards is late and not written either
    assert {e.kind for e in _feed(rig, _messages(rig))} == {"late"}
    if case != "pages reallocated":
        _assert_not_written(rig)


def test_wrong_request_chunk_fails_that_request_and_leaves_the_other_pending():
    a = _rig(tokens=10, epoch=1)
    b = _rig(tokens=10, epoch=2, request_id="req-2", seed=1, rig=a)
    # a sender that mixed up reservations: request B's name and epoch on request A's pages
    forged = [_forged(m, request_id="req-2", epoch=2) for m in _messages(a)]
    events = _feed(a, forged)
    assert events[0].kind == "mismatch" and events[0].request_id == "req-2"
    assert "page ids differ at index 0" in events[0].detail
    assert a.rx.pending() == ["req-1"]
    _assert_not_written(b)
    assert [e.kind for e in _feed(a, _messages(a))] == ["complete"]
    _assert_landed(a)


# ---- late chunks (I4) -----------------------------------------------------------------

def test_cancelled_transfer_drops_late_chunks_even_after_pages_go_to_another_slot():
    rig = _rig(tokens=10)
    messages = _messages(rig, chunk_bytes=PAGE_BYTES)
    assert _feed(rig, messages[:1]) == []
    rig.rx.cancel("req-1")
    assert rig.rx.pending() == []
    rig.decode.free(SLOT, rig.res.pages)  # cancel returned: the pages are the caller's again
    grant = rig.decode.allocate(OTHER_SLOT, rig.decode.free_pages)
    assert set(rig.res.pages.tolist()) <= set(grant.pages.tolist())
    rig.decode.data[_index(rig.res.pages)] = 3.0  # the new owner's K/V
    before = rig.decode.metadata_snapshot()
    events = _feed(rig, messages[1:])
    assert [e.kind for e in events] == ["late", "late"]
    assert "dropped: it was cancelled" in events[0].detail
    assert events[0].pages == rig.res.pages.tolist() and events[0].sender == "prefill-0"
    assert (rig.decode.data[_index(rig.res.pages)] == 3.0).all()
    for key, value in rig.decode.metadata_snapshot().items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)
    assert rig.rx.counts["late"] == 2


def test_chunk_for_an_unknown_request_is_late_and_touches_nothing():
    rig = _rig(tokens=10)
    data, meta = rig.decode.data.clone(), rig.decode.metadata_snapshot()
    events = _feed(rig, [_forged(m, request_id="never-reserved") for m in _messages(rig)])
    assert [e.kind for e in events] == ["late", "late"]
    assert "no transfer is expected" in events[0].detail
    assert torch.equal(rig.decode.data, data)
    for key, value in rig.decode.metadata_snapshot().items():
        np.testing.assert_array_equal(value, meta[key], err_msg=key)
    assert rig.rx.pending() == ["req-1"]


def test_stale_epoch_after_re_reservation_is_late_and_the_new_transfer_completes():
    rig = _rig(tokens=10, epoch=7)
    stale = _messages(rig)
    rig.rx.cancel("req-1")
    again = Reservation("req-1", rig.res.slot, 8, rig.res.tokens, rig.res.pages, rig.res.page_epochs)
    rig.rx.expect(again)
    rig.res = again
    events = _feed(rig, [stale[0], *_messages(rig)])
    assert [e.kind for e in events] == ["late", "complete"]
    assert "epoch 7 is older than the pending reservation's 8" in events[0].detail
    _assert_landed(rig)


# ---- garbage ---------------------------------------------------------------------------

GARBAGE = ["random bytes", "empty list", "not a list", "bad msgpack", "header not a map", "wrong version",
           "other op", "request id not a string", "tokens not an int", "layout not a map", "page frame not bytes",
           "extension type"]


def _bad_frames(rig: Rig) -> dict[str, list]:
    good = _messages(rig)[0]
    return {
        "random bytes": [b"\x93\xff\x00garbage", b"x" * 512],
        "empty list": [],
        "not a list": None,
        "bad msgpack": [b"\xc1\xc1\xc1"],
        "header not a map": [msgpack.packb([1, 2, 3])],
        "wrong version": [msgpack.packb({**unpack_header(good[0]), "v": 99}), *good[1:]],
        "other op": [pack_header({"op": "ping"})],
        "request id not a string": [_forged(good, request_id=3)[0], *good[1:]],
        "tokens not an int": _forged(good, tokens="ten"),
        "layout not a map": _forged(good, layout=[1]),
        "page frame not bytes": [good[0], "text", 7],
        "extension type": [msgpack.packb({"v": 1, "op": "kv_chunk", "x": msgpack.ExtType(1, b"")})],
    }


@pytest.mark.parametrize("case", GARBAGE)
def test_garbage_is_reported_never_raised_and_the_transfer_still_completes(case):
    rig = _rig(tokens=10)
    cases = _bad_frames(rig)
    assert sorted(cases) == sorted(GARBAGE)
    event = rig.rx.on_message(cases[case])
    assert event.kind == "garbage", event
    assert event.request_id in (None, "req-1")
    _assert_not_written(rig)
    assert (rig.decode.data == 0).all()
    assert rig.rx.pending() == ["req-1"]
    assert [e.kind for e in _feed(rig, _messages(rig))] == ["complete"]
    assert rig.rx.counts == {"complete": 1, "mismatch": 0, "late": 0, "garbage": 1, "timeout": 0}


_FIELDS = ["op", "request_id", "epoch", "tokens", "pages", "page_epochs", "layout", "first_token",
           "chunk", "chunks", "first", "count", "checksums", "v", "sender"]
_ints = st.integers(-2**63, 2**64 - 1)  # what msgpack can carry
_values = st.one_of(st.none(), st.booleans(), _ints, st.floats(), st.text(max_size=8),
                    st.binary(max_size=8), st.lists(st.integers(-3, 30), max_size=6),
                    st.dictionaries(st.text(max_size=6), _ints, max_size=3))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_messages_never_raise_and_write_only_whole_verified_transfers(data):
    rig = _rig(tokens=10)
    messages = _messages(rig, chunk_bytes=PAGE_BYTES)
    stream = []
    for message in messages:
        action = data.draw(st.sampled_from(["keep"] * 4 + ["field", "drop frame", "flip", "random", "skip"]))
        if action == "field":
            message = _forged(message, **{data.draw(st.sampled_from(_FIELDS)): data.draw(_values)})
        elif action == "drop frame":
            message = message[:-1]
        elif action == "flip":
            page = bytearray(message[1])
            page[data.draw(st.integers(0, PAGE_BYTES - 1))] ^= 0xFF
            message = [message[0], bytes(page)]
        elif action == "random":
            message = data.draw(st.lists(st.binary(max_size=600), max_size=4))
        elif action == "skip":
            continue
        stream.append(message)
    events = _feed(rig, stream)  # must not raise
    assert all(e.kind in ("complete", "mismatch", "late", "garbage") for e in events)
    event(f"outcome: {sorted({e.kind for e in events})}")
    if any(e.kind == "complete" for e in events):
        _assert_landed(rig)
    else:
        _assert_not_written(rig)
    assert sum(rig.rx.counts.values()) == len(events)


_frame = st.one_of(st.binary(max_size=64), st.none(), _ints, st.text(max_size=8),
                  st.builds(lambda d: msgpack.packb({"v": 1, "op": "kv_chunk", **d}),
                            st.dictionaries(st.sampled_from(_FIELDS), _values, max_size=8)))


@settings(max_examples=300, deadline=None)
@given(frames=st.one_of(st.lists(_frame, max_size=5), _frame))
def test_random_frame_lists_are_garbage_or_late_never_exceptions(frames):
    rig = _rig(tokens=10)
    event = rig.rx.on_message(frames)
    assert event.kind in ("garbage", "late", "mismatch"), event
    _assert_not_written(rig)
    assert (rig.decode.data == 0).all()


# ---- timeouts --------------------------------------------------------------------------

def test_expire_reports_transfers_that_never_started_or_stalled():
    rig = _rig(tokens=10, epoch=1)
    other = _rig(tokens=6, epoch=2, request_id="req-2", seed=1, rig=rig)
    assert rig.rx.expire(now=5.0, timeout_s=10.0) == []
    rig.clock[0] = 8.0
    assert _feed(rig, _messages(other, chunk_bytes=PAGE_BYTES)[:1]) == []  # req-2 started at t=8 (one of its 2 chunks)
    events = rig.rx.expire(now=10.5, timeout_s=10.0)
    assert [(e.kind, e.request_id) for e in events] == [("timeout", "req-1")]
    assert "after the reservation" in events[0].detail and events[0].pages == rig.res.pages.tolist()
    later = rig.rx.expire(now=18.5, timeout_s=10.0)
    assert [(e.kind, e.request_id) for e in later] == [("timeout", "req-2")]
    assert "got 1 of 2 chunks" in later[0].detail
    assert rig.rx.pending() == [] and rig.rx.counts["timeout"] == 2
    assert {e.kind for e in _feed(rig, _messages(rig))} == {"late"}
    _assert_not_written(rig)


# ---- the receiver's CUDA path, taken on CPU ----------------------------------------------

def test_staged_write_path_used_off_cpu_lands_the_same_bytes():
    rig = _rig(tokens=10)
    rig.rx._rows = None  # what a receiver on a CUDA pool does: one host->device copy per chunk
    assert [e.kind for e in _feed(rig, _messages(rig))] == ["complete"]
    _assert_landed(rig)


# ---- reservations and arguments ---------------------------------------------------------

def test_reservation_round_trips_through_msgpack():
    rig = _rig(tokens=10)
    wire = msgpack.unpackb(msgpack.packb(rig.res.to_wire()))
    back = Reservation.from_wire(wire)
    assert back.to_wire() == rig.res.to_wire()
    assert back.pages.dtype == np.int32 and back.page_epochs.dtype == np.int64


@pytest.mark.parametrize("change, message", [
    ({"request_id": 5}, "field 'request_id' must be str"),
    ({"request_id": ""}, "field 'request_id' is empty"),
    ({"slot": -1}, "field 'slot' = -1 is below the minimum 0"),
    ({"epoch": "x"}, "field 'epoch' must be int"),
    ({"tokens": 0}, "field 'tokens' = 0 is below the minimum 1"),
    ({"pages": []}, "field 'pages' is empty"),
    ({"pages": [1, 1, 2]}, "field 'pages' lists a page twice"),
    ({"page_epochs": [1]}, "field 'page_epochs' has 1 items for 3 pages"),
    ({"pages": None}, "field 'pages' is required"),
])
def test_reservation_from_wire_names_the_bad_field(change, message):
    wire = {**_rig(tokens=10).res.to_wire(), **change}
    with pytest.raises(ProtocolError, match=message):
        Reservation.from_wire(wire)


def test_build_transfer_refuses_inconsistent_arguments():
    rig = _rig(tokens=10)
    with pytest.raises(ValueError, match="2 source pages for 10 tokens, 3 needed"):
        build_transfer(rig.prefill, rig.src[:2], rig.res.to_wire(), first_token=1)
    with pytest.raises(ValueError, match="11 tokens cannot fill a reservation of 10"):
        build_transfer(rig.prefill, rig.src, rig.res.to_wire(), first_token=1, tokens=11)
    with pytest.raises(ProtocolError, match="field 'tokens'"):
        build_transfer(rig.prefill, rig.src, {**rig.res.to_wire(), "tokens": "10"}, first_token=1)


def test_expect_refuses_pages_that_are_not_the_slots_in_flight_pages():
    rig = _rig(tokens=10)
    with pytest.raises(ValueError, match="already expected"):
        rig.rx.expect(rig.res)
    spare = rig.decode.allocate(SLOT, 3)  # RESERVED, not IN_FLIGHT
    with pytest.raises(IsolationError, match="IN_FLIGHT"):
        rig.rx.expect(Reservation("req-2", SLOT, 8, 10, spare.pages, spare.epochs))
    rig.decode.set_state(SLOT, spare.pages, PageState.IN_FLIGHT)
    with pytest.raises(IsolationError, match="needs owner 6"):
        rig.rx.expect(Reservation("req-2", SLOT + 1, 8, 10, spare.pages, spare.epochs))
    with pytest.raises(ValueError, match="3 pages / 3 epochs for 13 tokens; 4 needed"):
        rig.rx.expect(Reservation("req-2", SLOT, 8, 13, spare.pages, spare.epochs))
    assert rig.rx.pending() == ["req-1"]
