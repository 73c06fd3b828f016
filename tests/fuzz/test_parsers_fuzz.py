"""A short fuzz of every outside-input parser in CI (bench/fuzz.py runs them for minutes).
Each target may only return or raise its documented error (tests/fuzz/parsers.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.parsers import TARGETS

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                                        max_size=6),
                           max_leaves=30)


@pytest.mark.parametrize("name", sorted(TARGETS))
@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes(name, data):
    TARGETS[name](data)


@pytest.mark.parametrize("name", ["http-body", "config-json", "snapshot"])
@FUZZ
@given(value=json_values)
def test_random_json(name, value):
    TARGETS[name](json.dumps(value).encode())


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_known_hostile_inputs(name):
    """What the adversarial pass used: deep nesting, huge numbers, wrong types."""
    for data in (b"[" * 100_000 + b"]" * 100_000, b"9" * 5000, b'{"a": ' * 5000 + b"1" + b"}" * 5000,
                 json.dumps({"hidden_size": "abc", "num_attention_heads": 0, "rope_parameters": "yes"}).encode(),
                 json.dumps([1, 2, 3]).encode(), b"\x00" * 64, b"\xff" * 64):
        TARGETS[name](data)


def test_regressions_found_by_bench_fuzz():
    """bench/fuzz.py found these (first run, 5 s per target): a KV event with a deeply nested
    unknown tag raised RecursionError from its error message; a TOML config nested thousands
    deep, or with a 5,000-digit integer, raised RecursionError / ValueError, not ConfigError."""
    import msgpack
    import pytest

    from engine.adapters.kv_event_decode import KvEventError, decode_frames
    from tests.fuzz.parsers import toml_config

    # [1.0, [[<a list nested 1,020 deep>, 1, 2]], None], by hand: msgpack packs at most 512 deep and
    # unpacks at most ~1,024; repr() fails from ~1,000
    payload = b"\x93" + msgpack.packb(1.0) + b"\x91\x93" + b"\x91" * 1020 + b"\xc0" + b"\x01\x02\xc0"
    with pytest.raises(KvEventError, match="nested too deeply to show"):
        decode_frames([b"kv-events", (0).to_bytes(8, "big"), payload])
    toml_config(b"a = " + b"[" * 100_000)  # ConfigError inside: returns
    toml_config(b"a = " + b"9" * 5000)
