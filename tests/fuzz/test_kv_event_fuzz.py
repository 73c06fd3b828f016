"""A short fuzz of the KV-event watcher's parsers beyond test_parsers_fuzz.py's random bytes
(bench/fuzz.py runs them for minutes): batches with the right skeleton and anything in its
places (wrong types, huge and negative numbers, short and long hashes, unknown tags, missing
and extra fields), so that the fuzz reaches the event checks behind msgpack's. Each target
may only return or raise its documented error (tests/fuzz/parsers.py)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.kv_event_parsers import KV_TARGETS
from tests.fuzz.parsers import kv_events

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
TARGETS = {"kv-events": kv_events, **KV_TARGETS}

anything = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=8)
            | st.binary(max_size=72))
hashes = st.lists(st.integers(-2**63, 2**64 - 1) | st.binary(max_size=72) | anything, max_size=6)
tags = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Foo", ""])
FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium")
fields = st.tuples(hashes | anything, anything, st.lists(st.integers(0, 2**32), max_size=40) | anything,
                   st.integers(-1, 2**21) | anything, anything, st.text(max_size=70) | anything)
array_events = st.builds(lambda tag, values, keep, extra: [tag, *values[:keep], *extra], tags, fields,
                         st.integers(0, 6), st.lists(anything, max_size=3))
map_events = st.builds(lambda tag, values, keep: {"type": tag, **dict(list(zip(FIELDS, values))[:keep])},
                       tags, fields, st.integers(0, 6))
events = st.lists(array_events | map_events | anything, max_size=6)
batches = (st.builds(lambda ts, evs, rank, keep: [ts, evs, rank][:keep], st.floats() | anything, events,
                     st.integers(-1, 2**32) | anything, st.integers(1, 3))
           | st.builds(lambda ts, evs, rank: {"ts": ts, "events": evs, "data_parallel_rank": rank},
                       st.floats() | anything, events, st.integers(-1, 2**32) | anything))


def as_input(name: str, seq: int, payload: bytes) -> bytes:
    frame = seq.to_bytes(8, "big") + payload
    return b"\x01" + frame if name == "kv-replay" else frame  # the replay target's first byte picks vLLM's form


@pytest.mark.parametrize("name", sorted(TARGETS))
@FUZZ
@given(batch=batches, seq=st.integers(0, 2**64 - 1))
def test_batches_with_anything_in_their_fields(name, batch, seq):
    TARGETS[name](as_input(name, seq, msgpack.packb(batch, use_bin_type=True)))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_known_hostile_payloads(name):
    """Shapes that cost the most per byte, nesting past msgpack's depth, headers claiming more
    than the payload holds: each is refused with KvEventError."""
    for payload in (b"\x91" * 1100 + b"\xc0", b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                    b"\x92\xcb" + bytes(8) + b"\xdc\xff\xff" + b"\x90" * 65535,
                    msgpack.packb([1.0, [["BlockRemoved", list(range(70_000))]], 0])):
        TARGETS[name](as_input(name, 3, payload))
