"""The vLLM / SGLang KV-event decoder over every wire variant and every refusal, and the
Qt-free state it feeds: lineage roots, stable slots, removal, clearing, ranks, media."""

from __future__ import annotations

import json
import pickle

import msgpack
import pytest

from engine.adapters import kv_event_decode as decode_module
from engine.adapters.kv_event_decode import (
    AllBlocksCleared,
    Batch,
    BlockRemoved,
    BlockStored,
    KvEventError,
    decode_frames,
    decode_replay_frames,
    normalize_hash,
)
from engine.adapters.kv_event_state import KvEventState
from tests.kv_event_publisher import END_OF_REPLAY, VARIANTS, cleared, encode, removed, stored

SEQ = (41).to_bytes(8, "big")
EVENTS = [stored([1, 2], None, range(32)), stored([3], 2, range(32, 40), lora_id=7), removed([1]), cleared()]


def h(n: int) -> str:
    return f"{n:016x}"


def hb(n: int) -> str:
    return n.to_bytes(32, "big").hex()


def frames(payload: bytes) -> list[bytes]:
    return [b"kv-events", SEQ, payload]


# variant -> (hash form, medium, rank) as the decoder must normalize them
EXPECTED = {
    "vllm-array": (h, "GPU", 3), "vllm-bytes": (hb, "GPU", 3), "vllm-map": (hb, "GPU", 3),
    "vllm-extra": (h, "GPU", 3), "vllm-old": (h, None, None), "sglang": (h, None, 3),
    "sglang-salted": (h, "GPU", 3),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_wire_variant_decodes_to_the_same_normalized_events(variant):
    form, medium, rank = EXPECTED[variant]
    batch = decode_frames(frames(encode(EVENTS, variant, rank=3, ts=12.5)))
    assert (batch.seq, batch.ts, batch.dp_rank, batch.topic) == (41, 12.5, rank, b"kv-events")
    assert batch.events == [
        BlockStored([form(1), form(2)], None, list(range(32)), 16, None, medium),
        BlockStored([form(3)], form(2), list(range(32, 40)), 16, 7, medium),
        BlockRemoved([form(1)], medium),
        AllBlocksCleared(),
    ]


def test_int_hashes_are_the_unsigned_64_bit_value_in_16_hex_digits():
    assert normalize_hash(-1, "x") == normalize_hash(2**64 - 1, "x") == "ffffffffffffffff"
    assert normalize_hash(-(2**63), "x") == normalize_hash(2**63, "x") == "8000000000000000"
    assert normalize_hash(5, "x") == "0000000000000005"
    assert normalize_hash(b"\xab\xcd", "x") == "abcd"
    payload = msgpack.packb([0.0, [["BlockRemoved", [-1, 2**64 - 1]]]])
    assert decode_frames(frames(payload)).events == [BlockRemoved(["ffffffffffffffff"] * 2, None)]


def test_the_rank_field_follows_the_dialect_in_map_batches():
    sglang_map = msgpack.packb({"ts": 1.0, "events": [], "attn_dp_rank": 2})
    assert decode_frames(frames(sglang_map), "auto").dp_rank == 2
    assert decode_frames(frames(sglang_map), "sglang").dp_rank == 2
    assert decode_frames(frames(sglang_map), "vllm").dp_rank is None
    vllm_map = msgpack.packb({"ts": 1.0, "events": [], "data_parallel_rank": 1})
    assert decode_frames(frames(vllm_map), "vllm").dp_rank == 1


def test_replay_frames_decode_and_the_end_marker_is_none():
    batch = decode_replay_frames([(7).to_bytes(8, "big"), encode([cleared()], "sglang", rank=1)])
    assert isinstance(batch, Batch) and (batch.seq, batch.dp_rank, batch.events) == (7, 1, [AllBlocksCleared()])
    assert decode_replay_frames([END_OF_REPLAY, b""]) is None


def test_replay_frames_in_vllm_form_carry_the_topic_and_end_with_an_empty_one():
    # vLLM 0.26+ (PR #45177): (topic, seq, payload) per answer, (b"", END, b"") at the end
    batch = decode_replay_frames([b"kv@pod@model", (7).to_bytes(8, "big"), encode([cleared()], "vllm-map", rank=1)])
    assert (batch.seq, batch.dp_rank, batch.topic, batch.events) == (7, 1, b"kv@pod@model", [AllBlocksCleared()])
    assert decode_replay_frames([b"", END_OF_REPLAY, b""]) is None
    with pytest.raises(KvEventError, match=r"replay frame 1: sequence number must be 8 bytes") as bad:
        decode_replay_frames([b"kv", b"\x00\x07", b""])
    assert bad.value.seq is None
    with pytest.raises(KvEventError, match=r"replay frame 2: payload is not msgpack") as bad:
        decode_replay_frames([b"", SEQ, b"\xc1"])
    assert bad.value.seq == int.from_bytes(SEQ, "big")


def _bad_event(event) -> bytes:
    """A batch whose event 0 is fine and event 1 is `event`."""
    return msgpack.packb([1.0, [["AllBlocksCleared"], event], 0])


REFUSALS = [
    ([b"t", SEQ], "3 frames expected (topic, seq, payload), got 2"),
    ([b"t", b"\x00\x01", b""], "frame 1: sequence number must be 8 bytes big-endian, got 2 bytes"),
    (frames(b"\xc1 not msgpack"), "frame 2: payload is not msgpack (FormatError"),
    (frames(pickle.dumps({"x": 1})), "frame 2: payload is not msgpack ("),
    (frames(msgpack.packb(5)), "batch: 5 is int; expected an array or map"),
    (frames(msgpack.packb([1.0])), "batch: array of at least 2 fields (ts, events[, rank]) expected, got 1"),
    (frames(msgpack.packb({"ts": 1.0})), "batch: map lacks events"),
    (frames(msgpack.packb(["noon", []])), "batch: ts 'noon' is str; expected a number"),
    (frames(msgpack.packb([1.0, {"a": 1}])), "batch: events {'a': 1} is dict; expected an array"),
    (frames(msgpack.packb([1.0, [], -1])), "batch: rank: -1 is outside 0..2147483647"),
    (frames(_bad_event(["Foo", [1]])), "event 1: unknown tag 'Foo'; known: BlockStored, BlockRemoved, "
                                       "AllBlocksCleared"),
    (frames(_bad_event([])), "event 1: empty array; expected a tag"),
    (frames(_bad_event(7)), "event 1: 7 is int; expected a tagged array or map"),
    (frames(_bad_event({"block_hashes": [1]})), "event 1: map without a 'type' tag; keys: ['block_hashes']"),
    (frames(_bad_event({"type": "BlockStored", "block_hashes": [1], "token_ids": []})),
     "event 1: BlockStored map lacks block_size"),
    (frames(_bad_event(["BlockStored", [1], None, [1, 2]])),
     "event 1: BlockStored needs at least 5 fields (block_hashes, parent_block_hash, token_ids, block_size, "
     "lora_id), got 3"),
    (frames(_bad_event(["BlockRemoved", [1, "abc"]])),
     "event 1: block_hashes[1]: hash 'abc' is str; expected int or bytes"),
    (frames(_bad_event(["BlockRemoved", [True]])), "event 1: block_hashes[0]: hash True is bool"),
    (frames(_bad_event(["BlockRemoved", [b""]])), "event 1: block_hashes[0]: hash of 0 bytes; expected 1 to 64"),
    (frames(_bad_event(["BlockRemoved", 5])), "event 1: block_hashes 5 is int; expected an array"),
    (frames(_bad_event(["BlockRemoved", [1], 5])), "event 1: medium 5 is int; expected a name"),
    (frames(_bad_event(["BlockStored", [1], "p", [], 16, None])),
     "event 1: parent_block_hash: hash 'p' is str"),
    (frames(_bad_event(["BlockStored", [1], None, [1, 2, "x"], 16, None])),
     "event 1: token_ids[2] 'x' is str; expected an integer"),
    (frames(_bad_event(["BlockStored", [1], None, [], 0, None])), "event 1: block_size: 0 is outside 1..1048576"),
    (frames(_bad_event(["BlockStored", [1], None, [], 16, "lora"])), "event 1: lora_id: 'lora' is str"),
]


@pytest.mark.parametrize("bad, message", REFUSALS, ids=[m[:40] for _, m in REFUSALS])
def test_every_refusal_names_the_position_and_the_value(bad, message):
    with pytest.raises(KvEventError) as caught:
        decode_frames(bad)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)
    seq_readable = len(bad) == 3 and len(bad[1]) == 8
    assert caught.value.seq == (41 if seq_readable else None)


def test_sizes_are_bounded(monkeypatch):
    monkeypatch.setattr(decode_module, "MAX_PAYLOAD_BYTES", 100)
    with pytest.raises(KvEventError, match=r"frame 2: payload is 101 bytes; the limit is 100"):
        decode_frames(frames(b"\x90" * 101))
    monkeypatch.setattr(decode_module, "MAX_EVENTS", 3)
    with pytest.raises(KvEventError, match=r"batch: 4 events; the limit is 3"):
        decode_frames(frames(encode([cleared()] * 4, "vllm-array")))
    assert len(decode_frames(frames(encode([cleared()] * 3, "vllm-array"))).events) == 3


def test_hash_and_dialect_refusals():
    with pytest.raises(KvEventError, match=r"x: hash 18446744073709551616 does not fit 64 bits"):
        normalize_hash(2**64, "x")
    with pytest.raises(KvEventError, match=r"hash b'\\x01' is bytes, but the sglang dialect sends integer"):
        decode_frames(frames(encode([removed([b"\x01"])], "vllm-array")), "sglang")
    with pytest.raises(KvEventError, match=r"unknown dialect 'trt'; known: auto, vllm, sglang"):
        decode_frames(frames(encode([], "vllm-array")), "trt")
    with pytest.raises(KvEventError, match=r"replay: 3 frames \(topic, seq, payload\) or 2 \(seq, payload\) "
                                           r"expected, got 4"):
        decode_replay_frames([b"", b"", SEQ, b""])
    with pytest.raises(KvEventError, match=r"replay: end marker with a 1-byte payload"):
        decode_replay_frames([END_OF_REPLAY, b"x"])
    with pytest.raises(KvEventError, match=r"replay: end marker with a 1-byte payload"):
        decode_replay_frames([b"", END_OF_REPLAY, b"x"])


# --- state ---------------------------------------------------------------------------------

def apply(state: KvEventState, events: list[dict], rank: int | None = 0, seq: int = 0, endpoint: str = "tcp://e:1",
          variant: str = "vllm-array") -> None:
    batch = decode_frames([b"", seq.to_bytes(8, "big"), encode(events, variant, rank=rank or 0)])
    batch.dp_rank = rank
    state.apply(batch, endpoint)


def test_a_chain_of_blocks_shares_its_lineage_root_across_events():
    state = KvEventState()
    apply(state, [stored([1, 2, 3], None, range(48))])
    apply(state, [stored([4], 3, range(48, 64)), stored([10], None, range(16)), stored([20], 99, range(16))])
    assert {state.find(0, h(n)).root for n in (1, 2, 3, 4)} == {h(1)}
    assert state.find(0, h(4)).parent == h(3) and state.find(0, h(1)).parent is None
    assert state.find(0, h(10)).root == h(10)
    assert state.find(0, h(20)).root == h(20)  # its parent was never seen: it roots its own lineage
    apply(state, [removed([1])])
    apply(state, [stored([5], 4, range(64, 80))])
    assert state.find(0, h(1)) is None and state.find(0, h(5)).root == h(1)


def test_slots_are_stable_and_freed_slots_are_reused_lowest_first():
    state = KvEventState()
    apply(state, [stored([1, 2, 3, 4], None, range(64))])
    assert [state.find(0, h(n)).slot for n in (1, 2, 3, 4)] == [0, 1, 2, 3]
    apply(state, [removed([3, 1])])
    apply(state, [stored([1], None, range(16))])  # re-stored after removal: a new block, lowest free slot
    apply(state, [stored([5, 6], 4, range(32))])
    assert {n: state.find(0, h(n)).slot for n in (1, 2, 4, 5, 6)} == {1: 0, 2: 1, 4: 3, 5: 2, 6: 4}
    apply(state, [stored([2], 1, range(16))])  # still held: keeps its slot
    assert state.find(0, h(2)).slot == 1


def test_removal_counts_unknown_hashes_and_token_counts_follow_block_size():
    state = KvEventState()
    apply(state, [stored([1, 2], None, range(24))])
    assert (state.find(0, h(1)).tokens, state.find(0, h(2)).tokens) == (16, 8)
    apply(state, [removed([2, 77])])
    summary = state.summary()
    assert summary["ranks"]["0"]["blocks"] == 1 and summary["unknown_removals"] == 1
    assert summary["events"] == {"BlockStored": 1, "BlockRemoved": 1, "AllBlocksCleared": 0}


def test_all_blocks_cleared_empties_only_its_rank_and_ranks_are_separate():
    state = KvEventState()
    apply(state, [stored([1, 2], None, range(32))], rank=0)
    apply(state, [stored([1], None, range(16)), stored([9], None, range(16))], rank=1, endpoint="tcp://e:2")
    assert state.find(1, h(9)).slot == 1 and state.find(0, h(2)).slot == 1
    apply(state, [cleared()], rank=1, endpoint="tcp://e:2")
    assert state.find(1, h(1)) is None and state.find(0, h(1)) is not None
    apply(state, [stored([3], None, range(16))], rank=1, endpoint="tcp://e:2")
    assert state.find(1, h(3)).slot == 0  # clearing freed every slot
    ranks = state.summary()["ranks"]
    assert ranks["0"]["blocks"] == 2 and ranks["1"]["blocks"] == 1
    assert ranks["1"]["endpoints"] == ["tcp://e:2"]


def test_media_are_separate_pools_and_a_batch_without_rank_is_rank_0():
    state = KvEventState()
    apply(state, [stored([1, 2], None, range(32)), stored([1], None, range(16), medium="CPU")], rank=None)
    apply(state, [removed([1])], rank=None)  # the GPU copy only
    assert state.find(0, h(1), "GPU").medium == "CPU"  # falls back to the copy that is still held
    apply(state, [stored([7], None, range(16))], variant="vllm-old", rank=None)
    summary = state.summary()
    assert summary["ranks"]["0"]["by_medium"] == {"CPU": 1, "GPU": 1, "unspecified": 1}
    assert summary["ranks"]["0"]["blocks"] == 3


def test_summary_is_json_and_keeps_the_stream_health():
    state = KvEventState()
    apply(state, [stored([1], None, range(16))], seq=4)
    for i in range(7):
        state.record_refusal("tcp://e:1", f"bad {i}", seq=5 + i)
    state.record_gap("tcp://e:1", 12, 15, filled=False)
    state.record_replay(2, complete=True)
    state.record_duplicate()
    state.record_restart("tcp://e:9")
    summary = json.loads(json.dumps(state.summary()))
    assert summary["refused"] == 7 and summary["recent_refusals"][-1] == "tcp://e:1: bad 6"
    assert len(summary["recent_refusals"]) == 5
    assert summary["last_seq"] == {"tcp://e:1": 11}
    assert (summary["gaps"], summary["gaps_unfilled"], summary["replays"], summary["replayed_batches"]) == (1, 1, 1, 2)
    assert summary["recent_gaps"] == [{"endpoint": "tcp://e:1", "expected": 12, "got": 15, "filled": False}]
    assert (summary["duplicates"], summary["restarts"], summary["batches"]) == (1, 1, 1)
