"""The KV-event watcher's parsers as fuzz targets (tests/fuzz/parsers.py says what a target
is): the live frame decoder is parsers.kv_events; these add the replay answer decoder and the
state a decoded batch is applied to, with its block bound."""

from __future__ import annotations

import msgpack

from engine.adapters.kv_event_decode import KvEventError, decode_frames, decode_replay_frames
from engine.adapters.kv_event_state import KvEventState

STATE_BOUND = 64  # blocks: small, so that the fuzz reaches the bound's refusal


def kv_replay(data: bytes) -> None:
    """A replay answer as the watcher's DEALER reads it: vLLM's 3 frames (topic, seq, payload)
    when the first byte is odd, SGLang's 2 (seq, payload) otherwise."""
    body = data[1:]
    frames = [b"kv-events", body[:8], body[8:]] if data[:1] and data[0] & 1 else [body[:8], body[8:]]
    try:
        decode_replay_frames(frames)
    except KvEventError:
        pass


def kv_state(data: bytes) -> None:
    """A frame decoded, then applied twice (from two endpoints) to a state bounded at
    STATE_BOUND blocks and summarised: the bound refuses with KvEventError (BlockLimitError),
    nothing else may raise."""
    try:
        batch = decode_frames([b"kv-events", data[:8], data[8:]])
    except KvEventError:
        return
    state = KvEventState(max_blocks=STATE_BOUND)
    for endpoint in ("tcp://127.0.0.1:1", "tcp://127.0.0.1:2"):
        try:
            state.apply(batch, endpoint)
        except KvEventError:
            pass
    assert state.block_count() <= STATE_BOUND, state.summary()
    state.summary()


KV_TARGETS = {"kv-replay": kv_replay, "kv-state": kv_state}


def corpus() -> dict[str, list[bytes]]:
    """Valid inputs to mutate from (bench/fuzz.py): each engine's batch forms."""
    seq = (7).to_bytes(8, "big")
    arrays = msgpack.packb([1.7e9, [["BlockStored", [123, 456], None, [1, 2, 3, 4], 16, None, "GPU"],
                                    ["BlockRemoved", [123], "GPU"], ["AllBlocksCleared"]], 0])
    maps = msgpack.packb({"ts": 1.7e9, "events": [{"type": "BlockStored", "block_hashes": [b"\x01" * 32],
                                                   "parent_block_hash": None, "token_ids": list(range(16)),
                                                   "block_size": 16, "lora_id": None, "medium": "GPU",
                                                   "lora_name": None, "extra_keys": [None], "group_idx": 0}],
                          "data_parallel_rank": 0}, use_bin_type=True)
    return {"kv-replay": [b"\x01" + seq + arrays, b"\x00" + seq + maps, b"\x00" + (-1).to_bytes(8, "big", signed=True)],
            "kv-state": [seq + arrays, seq + maps]}
