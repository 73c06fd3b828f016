"""The limits inside a bundle (gui/snapshot/bundle_limits.py): each refused with a SnapshotError
naming the member, the value and the limit before anything past it is inflated or parsed;
damage short of a limit stays a warning. The bombs at full size, measured in a child process,
are in test_snapshot_bundle.py."""

from __future__ import annotations

import io
import json
import tracemalloc
import zipfile

import numpy as np
import pytest

from gui.snapshot import bundle, bundle_limits, first_crossing
from gui.snapshot.bundle import SnapshotError, _pages, read_bundle, write_bundle
from gui.snapshot.bundle_limits import ReadBudget, parsed_cost, read_npz
from tests.gui.snapshot.bundle_bombs import npy_header, replace_member
from tests.gui.snapshot.test_snapshot_bundle import _pages as page_arrays
from tests.gui.snapshot.test_snapshot_bundle import make_snapshot


@pytest.fixture(scope="module")
def valid_bundle(tmp_path_factory):
    return write_bundle(make_snapshot(), tmp_path_factory.mktemp("valid") / "s.zip")


def _npz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


def _npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def test_the_limits_follow_what_the_engine_can_send():
    """Each limit is what an exporter could have received: change the engine, change these."""
    from engine.config import MAX_WORKERS_PER_ROLE, POOL_NAMES
    from engine.server.telemetry import RECENT_MESSAGES
    from engine.wire.protocol import MAX_CONTROL_FRAME, MAX_HEADER_BYTES, OPTIONAL_PAGE_FIELDS, PAGE_FIELDS

    widest = max(np.dtype(t).itemsize for t in (*PAGE_FIELDS.values(), *OPTIONAL_PAGE_FIELDS.values()))
    assert bundle_limits.MAX_PAGES == MAX_CONTROL_FRAME // widest == 8_388_608
    assert bundle_limits.MAX_ITEMSIZE == max(widest, np.dtype(np.float64).itemsize) == 8
    assert bundle_limits.MAX_POOLS == len(POOL_NAMES) * MAX_WORKERS_PER_ROLE == 128
    assert bundle_limits.MAX_NPZ_ARRAYS == 128 * 7
    assert bundle_limits.MAX_EVENT_LINES == RECENT_MESSAGES == 50_000
    assert bundle_limits.MAX_EVENT_LINE_BYTES == MAX_HEADER_BYTES
    assert bundle_limits.MAX_EVENTS_BYTES == 2 * MAX_CONTROL_FRAME


def test_a_real_bundle_reads_well_inside_every_limit(valid_bundle):
    budget = ReadBudget(valid_bundle)
    with zipfile.ZipFile(valid_bundle) as zf:
        arrays = read_npz(zf.read("pages.npz"), "pages.npz", budget)
    assert set(arrays) == {f"decode-0/{k}" for k in page_arrays(1, {})} and budget.used == 64 * 25
    assert read_bundle(valid_bundle).verified


# ---- arrays ---------------------------------------------------------------------------------

def test_a_header_declaring_more_pages_than_the_limit_is_refused_though_the_member_is_small():
    data = _npz({"decode-0/owner.npy": npy_header((bundle_limits.MAX_PAGES + 1,))})
    with pytest.raises(SnapshotError, match=r"pages.npz: decode-0/owner.npy declares shape \(8388609,\), "
                                            r"8,388,609 values \(limit 8,388,608 pages\); nothing of it was inflated"):
        _pages(data, [])


def test_a_pool_at_the_page_limit_reads_and_one_page_more_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_limits, "MAX_PAGES", 100)
    snap = make_snapshot()
    snap.pages["decode-0"] = page_arrays(100, {3: 1})
    assert read_bundle(write_bundle(snap, tmp_path / "at.zip")).pages["decode-0"]["owner"].size == 100
    snap.pages["decode-0"] = page_arrays(101, {3: 1})
    with pytest.raises(SnapshotError, match=r"pages.npz: decode-0/owner.npy declares shape \(101,\), 101 values "
                                            r"\(limit 100 pages\)"):
        read_bundle(write_bundle(snap, tmp_path / "past.zip"))


def test_an_npz_of_more_arrays_than_the_limit_is_refused():
    data = _npz({f"p{i}/owner.npy": _npy(np.zeros(1, np.int32)) for i in range(bundle_limits.MAX_NPZ_ARRAYS + 1)})
    with pytest.raises(SnapshotError, match=r"pages.npz holds 897 arrays \(limit 896: 128 pools of 7\)"):
        _pages(data, [])


def test_arrays_charge_the_budget_per_member_and_in_all():
    data = _npz({f"decode-0/{k}.npy": _npy(v) for k, v in page_arrays(1000, {}).items()})
    with pytest.raises(SnapshotError, match=r"pages.npz: its arrays, declaring 25,\d+ bytes in all, would bring what "
                                            r"is inflated of it to 25,\d+ bytes \(limit 20,000 per member\)"):
        _pages(data, [], ReadBudget("s.zip", per_member=20_000, total=1 << 30))
    budget = ReadBudget("s.zip", per_member=1 << 30, total=30_000)
    budget.charge("state.json", 10_000, "parsing it")
    with pytest.raises(SnapshotError, match=r"\(limit 30,000 in all\)"):
        _pages(data, [], budget)


@pytest.mark.parametrize("array, why", [
    (np.array([object()], dtype=object), "a pickled or structured array is never loaded"),
    (np.zeros(4, np.complex128), "not a flat array of numbers"),
    (np.zeros(4, [("a", "<i4")]), "not a flat array of numbers"),
    (np.zeros((2, 3), np.int32), "not a flat array of numbers"),
    (np.array(["abcd"]), "not a flat array of numbers"),
])
def test_arrays_that_are_not_flat_numbers_are_warnings(array, why):
    warnings: list[str] = []
    assert _pages(_npz({"decode-0/owner.npy": _npy(array)}), warnings) == {}
    assert len(warnings) == 1 and "pages.npz cannot be read" in warnings[0] and why in warnings[0], warnings


def test_scalar_page_fields_leave_their_pool_out_instead_of_crashing():
    """len() of a 0-d array raised TypeError out of read_bundle."""
    arrays = {f"decode-0/{k}.npy": _npy(v[0]) for k, v in page_arrays(4, {}).items()}
    warnings: list[str] = []
    assert _pages(_npz(arrays), warnings) == {}
    assert warnings == [("pages.npz: pool decode-0 has arrays ['epoch', 'filled', 'owner', 'state', 'writer'] of "
                         "lengths [1]; it is left out")]
    frame = {**arrays, "decode-0/time.npy": _npy(np.zeros(2))}
    assert first_crossing.from_npz(_npz(frame), warnings) == {}
    assert "decode-0/time holds 2 values, not one time" in warnings[-1]


@pytest.mark.parametrize("payload, message", [
    (npy_header((10,)) + bytes(80), "holds 208 bytes but its header declares 168"),
    (b"\x93NUMPY\x03\x00" + bytes(120), ".npy format 3.0 is not read"),
    (b"not an npy at all", "the magic string is not correct"),
])
def test_an_npy_that_disagrees_with_its_header_is_a_warning(payload, message):
    warnings: list[str] = []
    assert _pages(_npz({"decode-0/owner.npy": payload}), warnings) == {}
    assert len(warnings) == 1 and message in warnings[0], warnings


def test_an_npy_header_longer_than_the_limit_is_refused_unread():
    """numpy would read a header of up to 4 GiB (format 2.0) before checking its length."""
    for version, field in ((b"\x01\x00", b"\xff\xff"), (b"\x02\x00", b"\xff\xff\xff\xff")):
        with pytest.raises(SnapshotError, match=r"pages.npz: decode-0/owner.npy declares a .npy header of "
                                                r"(65,535|4,294,967,295) bytes \(limit 10,000\); it was not read"):
            _pages(_npz({"decode-0/owner.npy": b"\x93NUMPY" + version + field + b" " * 200}), [])


def test_an_npy_that_inflates_short_of_its_declared_size_is_a_warning():
    """The zip declares the size the header implies, the data stops short: nothing hangs."""
    import struct

    data = bytearray(_npz({"decode-0/owner.npy": npy_header((10,)) + bytes(8)}))
    grown = struct.pack("<I", 128 + 40)
    data[22 + 0:26] = grown  # the local header's size (the member is the first)
    central = data.rfind(b"PK\x01\x02")
    data[central + 24:central + 28] = grown
    warnings: list[str] = []
    assert _pages(bytes(data), warnings) == {}
    assert len(warnings) == 1 and "pages.npz cannot be read" in warnings[0], warnings


def test_an_array_is_read_from_its_stream_never_inflated_whole(monkeypatch):
    """Only what the header declares is read, in chunks, into the array itself."""
    reads: list[int] = []
    real = zipfile.ZipExtFile.read

    def spy(self, n=-1):
        reads.append(n)
        return real(self, n)

    monkeypatch.setattr(zipfile.ZipExtFile, "read", spy)
    monkeypatch.setattr(bundle_limits, "_CHUNK", 1000)
    arrays = _pages(_npz({f"decode-0/{k}.npy": _npy(v) for k, v in page_arrays(1000, {}).items()}), [])
    assert arrays["decode-0"]["epoch"].tolist() == list(range(1000))
    assert reads and all(0 < n <= 1000 for n in reads), reads


# ---- events.jsonl ---------------------------------------------------------------------------

def _events_bundle(valid_bundle, tmp_path, data: bytes):
    return replace_member(valid_bundle, tmp_path / "events.zip", "events.jsonl", data)


def test_events_jsonl_is_streamed_never_read_whole(valid_bundle, monkeypatch):
    whole: list[str] = []
    real = zipfile.ZipFile.read

    def spy(self, name, pwd=None):
        whole.append(getattr(name, "filename", name))
        return real(self, name, pwd)

    monkeypatch.setattr(zipfile.ZipFile, "read", spy)
    opened = read_bundle(valid_bundle)
    assert opened.verified and len(opened.events) == 2  # the sha256 is of the stream
    assert "events.jsonl" not in whole and "state.json" in whole


def test_more_lines_than_the_limit_are_refused_at_the_first_line_past_it(valid_bundle, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_limits, "MAX_EVENT_LINES", 10)
    assert len(read_bundle(_events_bundle(valid_bundle, tmp_path, b"{}\n" * 10)).events) == 10
    with pytest.raises(SnapshotError, match=r"events.jsonl has more than 10 lines \(limit 10\); nothing past line 10 "
                                            r"was parsed"):
        read_bundle(_events_bundle(valid_bundle, tmp_path, b"{}\n" * 11))


def test_a_line_longer_than_the_limit_is_refused_before_it_is_parsed(valid_bundle, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_limits, "MAX_EVENT_LINE_BYTES", 100)
    at = json.dumps({"topic": "x" * 74, "time": 1.0}).encode()
    assert len(at) == 100
    assert read_bundle(_events_bundle(valid_bundle, tmp_path, at + b"\n" + at)).events[1]["time"] == 1.0
    with pytest.raises(SnapshotError, match=r"events.jsonl: line 2 is longer than 100 bytes \(the limit\)"):
        read_bundle(_events_bundle(valid_bundle, tmp_path, at + b"\n" + at + b" \n{}\n"))


def test_an_events_jsonl_declaring_more_than_the_limit_is_refused_unread(valid_bundle, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_limits, "MAX_EVENTS_BYTES", 1000)
    with pytest.raises(SnapshotError, match=r"events.jsonl declares 1,002 bytes \(limit 1,000\); nothing of it "
                                            r"was read"):
        read_bundle(_events_bundle(valid_bundle, tmp_path, b"[]\n" * 334))


def test_parsed_lines_are_charged_to_the_budget(valid_bundle, tmp_path, monkeypatch):
    """A line of 10,000 `{}`s: 30 KB of text, charged 2,010,099 bytes parsed (3 a byte, 96 a
    value); the total is met at the line that would pass it, before it is parsed."""
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", 5 << 20)
    line = b"[" + b",".join([b"{}"] * 10_000) + b"]\n"
    assert len(read_bundle(_events_bundle(valid_bundle, tmp_path, line * 2)).warnings) == 1  # its sha256
    with pytest.raises(SnapshotError, match=r"events.jsonl: line 3 \(about 2,010,099 bytes parsed\) would bring what "
                                            r"is inflated and parsed of the bundle to 6,\d{3},\d{3} bytes \(limit "
                                            r"5,242,880 in all\)"):
        read_bundle(_events_bundle(valid_bundle, tmp_path, line * 3))


def test_a_bad_line_ends_the_parsing_but_the_hash_covers_the_member(valid_bundle, tmp_path):
    opened = read_bundle(_events_bundle(valid_bundle, tmp_path, b'{"topic": "a", "time": 1}\n{oops\n{}\n'))
    assert len(opened.events) == 1
    assert "events.jsonl line 2 cannot be read as JSON; the rest is skipped" in opened.warnings
    assert "events.jsonl does not match its sha256 in the manifest: it was changed after export" in opened.warnings


# ---- JSON documents -------------------------------------------------------------------------

def test_a_state_json_that_would_parse_past_the_total_is_refused_before_parsing(valid_bundle, tmp_path, monkeypatch):
    """state.json of 300 KB whose 100,000 `{}` would take ~7 MB parsed; a 1 MiB total."""
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", 1 << 20)
    with zipfile.ZipFile(valid_bundle) as zf:
        state = json.loads(zf.read("state.json"))
    state["padding"] = [{}] * 100_000
    bomb = replace_member(valid_bundle, tmp_path / "state.zip", "state.json", json.dumps(state).encode())
    with pytest.raises(SnapshotError, match=r"state.json: parsing it \(about [\d,]+ bytes\) would bring what is "
                                            r"inflated and parsed of the bundle to [\d,]+ bytes \(limit 1,048,576 "
                                            r"in all\)"):
        read_bundle(bomb)


@pytest.mark.parametrize("text", [
    b"[" + b",".join([b"{}"] * 50_000) + b"]",
    b"[" + b",".join([b"[]"] * 50_000) + b"]",
    b"{" + b",".join(b'"%x":{}' % i for i in range(50_000)) + b"}",
    b"{" + b",".join(b'"%d":0' % i for i in range(50_000)) + b"}",
    b"[" + b",".join(b'"%x"' % i for i in range(50_000)) + b"]",
    b"[" + b",".join([b"1.5"] * 50_000) + b"]",
    b"[" * 500 + b"]" * 500,
    b'["' + "\u00e9\U0001f600".encode() * 50_000 + b'"]',
    b'["' + b"a" * 300_000 + "\U0001f600".encode() + b'"]',  # one wide character makes the string 4 bytes each
    b'["' + b"a" * 300_000 + b'\\ud83d\\ude00"]',
    b'["' + b"\\ud83d\\ude00" * 50_000 + b'"]',
    json.dumps([{"topic": "metrics", "seq": i, "time": 1.7e9 + i, "tokens_per_s": 12.5, "queue_depth": 0,
                 "pools": {"decode-0": {"used_pages": 2, "pages": 64}}} for i in range(2_000)]).encode(),
])
def test_parsed_cost_bounds_what_json_loads_takes(text):
    """PARSED_BYTES_PER_VALUE holds: the peak json.loads allocates, for the worst shapes found."""
    tracemalloc.start()
    try:
        value = json.loads(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert value is not None and peak <= parsed_cost(text), (peak, parsed_cost(text))
