"""A short fuzz of every outside-input parser in CI (bench/fuzz.py runs them for minutes).
Each target may only return or raise its documented error (tests/fuzz/parsers.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz import template_parsers
from tests.fuzz.parsers import TARGETS

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)



@pytest.fixture(scope="module", autouse=True)
def _render_processes():
    yield
    template_parsers.close()  # the chat-template target's render processes end with this module


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner,
                                                                                        max_size=6),
                           max_leaves=30)


@pytest.mark.parametrize("name", sorted(TARGETS))
@FUZZ
@given(data=st.binary(max_size=2048))
def test_random_bytes(name, data):
    TARGETS[name](data)


@pytest.mark.parametrize("name", ["http-body", "config-json", "snapshot", "snapshot-jsonl"])
@FUZZ
@given(value=json_values)
def test_random_json(name, value):
    TARGETS[name](json.dumps(value).encode())


@FUZZ
@given(lines=st.lists(json_values.map(json.dumps) | st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
                      max_size=20))
def test_random_event_lines(lines):
    """events.jsonl of JSON values and junk, a line each."""
    TARGETS["snapshot-jsonl"]("\n".join(lines).encode("utf-8", "surrogatepass"))


_DESCRS = ["<i4", "<i8", ">i8", "|u1", "<f8", "<f2", "|b1", "<c16", "|O", "<U4", "|S3", "|V8", "<M8[ns]",
           "[('a', '<i4')]", "'<i4'", "None", "'xyz'"]
_SHAPES = st.one_of(st.tuples(), st.tuples(st.integers(-2, 10)), st.tuples(st.integers(0, 2**70)),
                    st.tuples(st.integers(0, 10), st.integers(0, 2**40)), st.just("[4]"), st.just("'4'"))


@FUZZ
@given(descr=st.sampled_from(_DESCRS), fortran=st.sampled_from(["False", "True", "1"]), shape=_SHAPES,
       version=st.sampled_from([b"\x01\x00", b"\x02\x00", b"\x03\x00"]), data=st.binary(max_size=64),
       extra=st.integers(0, 40))
def test_random_npy_headers(descr, fortran, shape, version, data, extra):
    """.npy headers numpy could never write: odd dtypes, shapes, orders and format versions,
    with data too short, right, or too long for them."""
    descr = descr if descr.startswith(("[", "'", "N")) else repr(descr)
    text = f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, }}".encode()
    length = (len(text) + 1).to_bytes(2 if version == b"\x01\x00" else 4, "little")
    TARGETS["snapshot-npy"](b"\x93NUMPY" + version + length + text + b"\n" + data + bytes(extra * 8))


_SIGNATURES = [b"", b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06"]  # anywhere, local, central, end record


@FUZZ
@given(stored=st.booleans(), flips=st.lists(st.tuples(st.sampled_from(_SIGNATURES), st.integers(0, 1 << 30),
                                                      st.integers(0, 255)), min_size=1, max_size=8))
def test_mutated_bundles(stored, flips):
    """A real bundle with bytes changed: anywhere, or in a local header, a central directory
    entry or the end record (versions, flags, methods, sizes, name lengths)."""
    import re

    from tests.fuzz.parsers import seed_bundle

    seed = seed_bundle(stored)
    data = bytearray(seed)
    for signature, at, value in flips:
        if signature:
            starts = [m.start() for m in re.finditer(re.escape(signature), seed)] or [0]
            at = starts[at % len(starts)] + at % 46
        data[at % len(data)] = value
    TARGETS["snapshot-zip"](bytes(data))


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


@FUZZ
@given(pieces=st.lists(st.sampled_from(template_parsers.FRAGMENTS), max_size=40))
def test_random_chat_templates(pieces):
    """Templates made of the pieces real and hostile templates are made of, rendered in the
    render process as serving renders them."""
    TARGETS["chat-template"]("".join(pieces).encode())
