"""The bundle writer and reader on a synthetic snapshot: round trip, atomic write, and every
kind of damage refused or flagged with a message that names it."""

from __future__ import annotations

import json
import os
import zipfile

import numpy as np
import pytest

from gui.snapshot import bundle
from gui.snapshot.bundle import SnapshotError, read_bundle, write_bundle
from gui.snapshot.collect import PRIVACY, SCHEMA, STATE_SCHEMA, Snapshot


def _pages(n: int, owners: dict[int, int]) -> dict[str, np.ndarray]:
    owner = np.full(n, -1, np.int32)
    state = np.zeros(n, np.uint8)
    for page, slot in owners.items():
        owner[page], state[page] = slot, 3
    return {"owner": owner, "epoch": np.arange(n, dtype=np.int64), "writer": np.full(n, -1, np.int64),
            "filled": np.where(owner >= 0, 16, 0).astype(np.int32), "state": state}


def make_snapshot() -> Snapshot:
    t0 = 1_796_000_000.0
    request = {"request_id": "r1", "slot": 1, "tenant": "acme", "phase": "finished", "prompt_len": 20,
               "prompt_hash": "ab" * 8, "max_new_tokens": 4, "tokens": 4, "decode_worker": "decode-0",
               "prefill_worker": "prefill-0", "ttft_s": 0.01, "finish_reason": "length", "error": None,
               "arrival": t0 + 1, "events": [
                   {"event": "admitted", "time": t0 + 1}, {"event": "reserve_sent", "time": t0 + 1.1, "worker": "decode-0"},
                   {"event": "prefill_sent", "time": t0 + 1.2, "worker": "prefill-0"},
                   {"event": "prefilled", "time": t0 + 1.3, "worker": "prefill-0"},
                   {"event": "transfer_done", "time": t0 + 1.4, "worker": "decode-0"},
                   {"event": "finished", "time": t0 + 1.6}]}
    state = {
        "schema": STATE_SCHEMA, "window": {"since": t0, "until": t0 + 10},
        "engine": {"version": "0.1.0", "hostname": "box", "control": "tcp://127.0.0.1:5650"},
        "workers": [{"name": "decode-0", "role": "decode", "state": "ready", "pool": {"name": "decode-0"}}],
        "pools": [{"name": "decode-0", "role": "decode", "pages": 64, "page_size": 16, "worker": "decode-0"}],
        "requests": [request], "alerts": [], "capacity": [],
        "scope": {"pairs": [], "reads": 0}, "prompt_log": [], "counters": {"admitted": 1}, "engine_events": [],
    }
    manifest = {"schema": SCHEMA, "app_version": "0.1.0", "engine_version": "0.1.0", "model": "tiny",
                "architecture": "LlamaForCausalLM", "hostnames": {"exporter": "me", "engine": "box"},
                "endpoint": "tcp://127.0.0.1:5650", "created_utc": "2026-12-02T00:00:00.000000Z",
                "created_unix": t0 + 10, "engine_monotonic": 5.0, "engine_uptime_s": 10.0,
                "window": dict(state["window"]), "config": {"engine": {"page_size": 16}}, "privacy": PRIVACY}
    telemetry = [{"topic": "metrics", "seq": 1, "time": t0 + 2, "tokens_per_s": 10.0, "queue_depth": 0,
                  "running": 1, "pools": {"decode-0": {"used_pages": 2, "pages": 64}}},
                 {"topic": "pages/decode-0", "time": t0 + 3, "kind": "delta", "bulk": {"index": 2}}]
    return Snapshot(manifest, state, {"decode-0": _pages(64, {3: 1, 4: 1})}, telemetry)


def _rewrite(src, dst, change) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for info in zin.infolist():
            data = change(info.filename, zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)


def test_round_trip_is_exact_and_verified(tmp_path):
    snap = make_snapshot()
    path = write_bundle(snap, tmp_path / "out" / "s.zip")
    opened = read_bundle(path)
    assert opened.verified, opened.warnings
    assert opened.state == json.loads(json.dumps(snap.state))
    assert all(np.array_equal(opened.pages["decode-0"][k], v) for k, v in snap.pages["decode-0"].items())
    assert opened.pages["decode-0"]["owner"].dtype == np.int32
    assert opened.events == snap.telemetry
    assert set(opened.images) == {"pagemap-decode-0.png"}
    assert {f["name"] for f in opened.manifest["files"]} == {
        "state.json", "pages.npz", "pagemap-decode-0.png", "metrics.csv", "events.jsonl", "trace.json", "report.html"}
    assert os.listdir(tmp_path / "out") == ["s.zip"]


def test_a_failed_export_leaves_nothing_under_the_name(tmp_path, monkeypatch):
    write_bundle(make_snapshot(), tmp_path / "s.zip")
    before = (tmp_path / "s.zip").read_bytes()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(bundle.zipfile.ZipFile, "writestr", broken)
    with pytest.raises(OSError, match="disk full"):
        write_bundle(make_snapshot(), tmp_path / "s.zip")
    assert (tmp_path / "s.zip").read_bytes() == before  # the old bundle is untouched
    assert os.listdir(tmp_path) == ["s.zip"]  # no temporary file left behind


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 3]), "not a readable zip file"),
    (lambda p: p.write_bytes(b""), "not a readable zip file"),
    (lambda p: p.unlink(), "no such file"),
])
def test_an_unreadable_bundle_raises_a_clear_error(tmp_path, damage, message):
    path = write_bundle(make_snapshot(), tmp_path / "s.zip")
    damage(path)
    with pytest.raises(SnapshotError, match=message):
        read_bundle(path)


@pytest.mark.parametrize("change, message", [
    (lambda name, data: None if name == "manifest.json" else data, "has no manifest.json"),
    (lambda name, data: b"{not json" if name == "manifest.json" else data, "manifest.json is not valid JSON"),
    (lambda name, data: b"[1, 2]" if name == "manifest.json" else data, "must hold a JSON object"),
    (lambda name, data: data.replace(SCHEMA.encode(), b"other/9") if name == "manifest.json" else data,
     "is not 'pagewarden.snapshot/1'"),
    (lambda name, data: b"\xff\xfe" if name == "state.json" else data, "state.json is not valid JSON"),
])
def test_a_bundle_without_a_usable_manifest_or_state_is_refused(tmp_path, change, message):
    path = write_bundle(make_snapshot(), tmp_path / "s.zip")
    _rewrite(path, tmp_path / "bad.zip", change)
    with pytest.raises(SnapshotError, match=message):
        read_bundle(tmp_path / "bad.zip")


def test_edits_missing_and_extra_files_are_warnings_naming_them(tmp_path):
    path = write_bundle(make_snapshot(), tmp_path / "s.zip")

    def change(name, data):
        if name == "trace.json":
            return None
        if name == "metrics.csv":
            return data + b"1,2,3\n"
        return data

    _rewrite(path, tmp_path / "bad.zip", change)
    with zipfile.ZipFile(tmp_path / "bad.zip", "a") as zf:
        zf.writestr("extra.bin", b"?")
    opened = read_bundle(tmp_path / "bad.zip")
    assert not opened.verified
    text = "\n".join(opened.warnings)
    assert "metrics.csv does not match its sha256" in text
    assert "trace.json is listed in the manifest but missing" in text
    assert "extra.bin is in the bundle but not in the manifest" in text
    assert opened.pages and opened.state["requests"]  # the rest is still shown


def test_schema_problems_and_damaged_pages_are_warnings(tmp_path):
    snap = make_snapshot()
    snap.pages["decode-0"]["filled"] = snap.pages["decode-0"]["filled"][:10]
    path = write_bundle(snap, tmp_path / "s.zip")

    def change(name, data):
        if name != "state.json":
            return data
        state = json.loads(data)
        state["requests"] = "not a list"
        return json.dumps(state).encode()

    _rewrite(path, tmp_path / "schema.zip", change)
    opened = read_bundle(tmp_path / "schema.zip")
    text = "\n".join(opened.warnings)
    assert "state.json: requests" in text or "state.json: $.requests" in text or "['requests']" in text, text
    assert "pool decode-0 has arrays" in text and opened.pages == {}

    path = write_bundle(make_snapshot(), tmp_path / "t.zip")
    _rewrite(path, tmp_path / "npz.zip", lambda name, data: data[:40] if name == "pages.npz" else data)
    opened = read_bundle(tmp_path / "npz.zip")
    assert opened.pages == {} and any("pages.npz cannot be read" in w for w in opened.warnings)


def test_pickled_arrays_are_never_loaded(tmp_path):
    path = write_bundle(make_snapshot(), tmp_path / "s.zip")
    import io

    evil = io.BytesIO()
    np.savez(evil, **{"decode-0/owner": np.array([object()], dtype=object)})
    _rewrite(path, tmp_path / "evil.zip", lambda name, data: evil.getvalue() if name == "pages.npz" else data)
    opened = read_bundle(tmp_path / "evil.zip")
    assert opened.pages == {} and any("pages.npz cannot be read" in w for w in opened.warnings)


def test_members_claiming_too_much_in_all_are_refused_before_inflating(tmp_path, monkeypatch):
    """Issue 14, item 9: four 1 GiB members (a 4.8 MB zip) took 23 s and 5.25 GB to read."""
    monkeypatch.setattr(bundle, "MAX_TOTAL_BYTES", 1 << 20)
    path = tmp_path / "bomb.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for i in range(4):
            zf.writestr(f"part{i}.bin", b"\0" * (300 << 10))
    with pytest.raises(SnapshotError, match=r"its members claim 1,228,800 bytes in all \(limit 1,048,576\)"):
        read_bundle(path)


@pytest.mark.parametrize("name", ["manifest.json", "state.json"])
def test_deeply_nested_json_is_a_snapshot_error(tmp_path, name):
    path = write_bundle(make_snapshot(), tmp_path / "s.zip")
    _rewrite(path, tmp_path / "bad.zip", lambda n, data: b"[" * 100_000 + b"]" * 100_000 if n == name else data)
    with pytest.raises(SnapshotError, match=f"{name} nests too deeply to read"):
        read_bundle(tmp_path / "bad.zip")


def test_a_deeply_nested_event_line_is_a_warning(tmp_path):
    path = write_bundle(make_snapshot(), tmp_path / "s.zip")
    _rewrite(path, tmp_path / "bad.zip",
             lambda n, data: data + b"[" * 100_000 + b"]" * 100_000 + b"\n" if n == "events.jsonl" else data)
    opened = read_bundle(tmp_path / "bad.zip")
    assert any("cannot be read as JSON; the rest is skipped" in w for w in opened.warnings)


def test_malformed_records_become_problems_never_exceptions(tmp_path):
    from gui.model.snapshot_state import state_from_snapshot

    def break_state(name, data):
        if name != "state.json":
            return data
        state = json.loads(data)
        state["requests"] = [{"request_id": "r1", "phase": 7, "tokens": "many", "pages": "x"}, "not a record",
                             {"request_id": ["a"], "prompt_len": {"x": 1}}]
        state["alerts"] = [{"id": 5, "severity": ["critical"], "state": None, "requests": 3}]
        state["workers"] = [{"name": 1, "state": {}, "pool": "not a map"}]
        state["pools"] = [{"name": "decode-0", "page_size": "abc"}]
        return json.dumps(state).encode()

    path = write_bundle(make_snapshot(), tmp_path / "s.zip")
    _rewrite(path, tmp_path / "bad.zip", break_state)
    state, problems = state_from_snapshot(read_bundle(tmp_path / "bad.zip"))
    assert problems and any("not a record" in p or "not an object" in p for p in problems)


# ---- bombs inside the bundle: the members' own contents ------------------------------------

_FAR_BELOW = 32 << 20  # what reading a bomb may add to the reader's peak memory (measured: 4-8 MB)


@pytest.fixture(scope="module")
def valid_bundle(tmp_path_factory):
    return write_bundle(make_snapshot(), tmp_path_factory.mktemp("valid") / "s.zip")


def test_an_array_declaring_3_gib_is_refused_from_its_header_not_inflated(valid_bundle, tmp_path):
    """The finding: a 0.07 MB bundle whose pages.npz held one 3 GiB array took 3.2 GB (peak
    RSS increase) and 12-30 s to read; it is refused before a byte of the array is inflated."""
    from tests.gui.snapshot.bundle_bombs import npz_bomb, reading_cost

    bomb = npz_bomb(valid_bundle, tmp_path / "bomb.zip", gib=3)
    assert bomb.stat().st_size < 1 << 20
    cost = reading_cost(bomb)
    assert cost["outcome"].startswith("SnapshotError: "), cost
    assert ("pages.npz: decode-0/owner.npy declares 3,221,225,600 bytes inflated (limit 67,118,864: "
            "8,388,608 pages of 8-byte values); nothing of it was inflated") in cost["outcome"]
    assert cost["peak_increase_bytes"] < _FAR_BELOW, cost  # the array alone is 3,221 MB


def test_an_events_jsonl_of_21_million_lines_stops_at_the_line_limit(valid_bundle, tmp_path):
    """The finding: 60 MiB of `{}` lines (a 0.12 MB bundle) made 21 M dicts, 2.8 GB and 35-76 s;
    the reader stops at line 50,001 of the stream, never holding the member whole."""
    from tests.gui.snapshot.bundle_bombs import events_bomb, reading_cost

    bomb = events_bomb(valid_bundle, tmp_path / "bomb.zip", mib=60)
    assert bomb.stat().st_size < 1 << 20
    cost = reading_cost(bomb)
    assert cost["outcome"].endswith("events.jsonl has more than 50,000 lines (limit 50,000); "
                                    "nothing past line 50,000 was parsed"), cost
    assert cost["peak_increase_bytes"] < _FAR_BELOW, cost  # the member alone is 63 MB inflated, 2.8 GB parsed


def test_a_damaged_deflate_stream_is_a_warning_not_a_crash(valid_bundle, tmp_path):
    """zlib.error escaped read_bundle (and the app, which shows only SnapshotError)."""
    raw = bytearray(valid_bundle.read_bytes())
    with zipfile.ZipFile(valid_bundle) as zf:
        info = zf.getinfo("metrics.csv")
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    raw[start:start + 8] = b"\xff" * 8  # the first deflate block: a reserved block type
    (tmp_path / "bad.zip").write_bytes(bytes(raw))
    opened = read_bundle(tmp_path / "bad.zip")
    assert any(w.startswith("metrics.csv cannot be read") for w in opened.warnings), opened.warnings
    assert opened.state["requests"] and opened.pages


@pytest.mark.parametrize("field, offset, value", [("compression method 99", 10, 99), ("encrypted flag", 8, 1)])
def test_a_member_that_zipfile_will_not_open_is_a_warning_or_a_clear_error(valid_bundle, tmp_path, field, offset,
                                                                           value):
    """NotImplementedError and RuntimeError escaped read_bundle."""
    import struct

    def changed(member: str):
        raw = bytearray(valid_bundle.read_bytes())
        with zipfile.ZipFile(valid_bundle) as zf:
            names = [info.filename for info in zf.infolist()]
        at = -1
        for _ in range(names.index(member) + 1):  # the member's entry in the central directory
            at = raw.find(b"PK\x01\x02", at + 1)
        raw[at + offset:at + offset + 2] = struct.pack("<H", value)
        path = tmp_path / f"{member}.zip"
        path.write_bytes(bytes(raw))
        return path

    opened = read_bundle(changed("events.jsonl"))
    assert opened.events == [] and any(w.startswith("events.jsonl cannot be read") for w in opened.warnings)
    with pytest.raises(SnapshotError, match="state.json cannot be read"):
        read_bundle(changed("state.json"))


def test_a_zip_that_zipfile_will_not_open_is_a_clear_error(valid_bundle, tmp_path):
    """A central directory naming a version needed to extract past 6.3 raised NotImplementedError."""
    import struct

    raw = bytearray(valid_bundle.read_bytes())
    at = raw.find(b"PK\x01\x02")
    raw[at + 6:at + 8] = struct.pack("<H", 99)
    (tmp_path / "bad.zip").write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match=r"is not a readable zip file \(zip file version 9.9\)"):
        read_bundle(tmp_path / "bad.zip")
