"""Every parser that takes outside input, with the errors it may raise: a fuzz target is a
function of bytes that returns normally or raises one of its documented errors. Anything
else (a KeyError, a RecursionError, a crash) is a finding. tests/fuzz/ runs each briefly
with hypothesis; bench/fuzz.py runs them for minutes and counts."""

from __future__ import annotations

import io
import json
import zipfile

import msgpack

from engine.adapters.kv_event_decode import KvEventError, decode_frames
from engine.config import load_config
from engine.errors import CheckpointError, ConfigError
from engine.http.completions import parse_json_body
from engine.http.openai_request import HttpError, parse_completion
from engine.model.config import model_config_from_dict
from engine.wire.protocol import ProtocolError, field_of, message_id, unpack
from tests.fuzz.kv_event_parsers import KV_TARGETS  # the replay decoder and the block state
from tests.fuzz.template_parsers import TEMPLATE_TARGETS  # the chat-template sandbox, in its render process


def control_message(data: bytes) -> None:
    """The control and bus decoder: one or more frames, then the fields an op reads."""
    frames = [data[i:i + 64] for i in range(0, len(data), 64)] or [b""]
    message_id(frames)
    try:
        msg = unpack(frames)
    except ProtocolError:
        return
    for name, kind in (("id", "int"), ("request_id", "str"), ("prompt_ids", "list[int]"), ("params", "map"),
                       ("max_new_tokens", "int"), ("temperature", "float"), ("apply", "bool")):
        try:
            field_of(msg, name, kind, default=None)
        except ProtocolError:
            pass


def msgpack_control_message(data: bytes) -> None:
    """Well-formed msgpack maps with random contents (reaches past the header checks)."""
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - not msgpack: the other target covers bytes
        return
    header = value if isinstance(value, dict) else {"v": 1, "op": "submit", "x": value}
    try:
        control_message(msgpack.packb({"v": 1, **{k: v for k, v in header.items() if isinstance(k, str)}},
                                      use_bin_type=True, default=str))
    except (TypeError, ValueError, OverflowError):  # could not be packed again: not a message
        return


def kv_events(data: bytes) -> None:
    """vLLM/SGLang KV-event frames: topic, sequence number, msgpack payload."""
    frames = [b"kv-events", data[:8], data[8:]]
    try:
        decode_frames(frames)
    except KvEventError:
        pass


def http_body(data: bytes) -> None:
    try:
        parse_completion(parse_json_body(data))
    except HttpError:
        pass


def toml_config(data: bytes) -> None:
    """A config file, read as `serve --config` reads it."""
    path = _scratch() / "fuzz.toml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError:
        pass


def config_json(data: bytes) -> None:
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError):
        return
    try:
        model_config_from_dict(raw)
    except CheckpointError:
        pass


def snapshot_bundle(data: bytes) -> None:
    """A zip holding manifest.json/state.json/events.jsonl built from the data."""
    from gui.model.snapshot_state import state_from_snapshot
    from gui.snapshot.bundle import SnapshotError, read_bundle

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        third = max(1, len(data) // 3)
        zf.writestr("manifest.json", b'{"schema": "pagewarden.snapshot/1", "files": [], "x": ' + data[:third] + b"}")
        zf.writestr("state.json", data[third:2 * third] or b"{}")
        zf.writestr("events.jsonl", data[2 * third:])
    path = _scratch() / "fuzz.zip"
    path.write_bytes(buf.getvalue())
    try:
        state_from_snapshot(read_bundle(path))
    except SnapshotError:
        pass


def snapshot_zip(data: bytes) -> None:
    """The bundle file itself (bench/fuzz.py mutates a real one; test_parsers_fuzz.py flips its bytes)."""
    _read_bundle_bytes(data)


def snapshot_jsonl(data: bytes) -> None:
    """events.jsonl of an otherwise valid bundle."""
    _read_bundle_bytes(_bundle_with(**{"events.jsonl": data}))


def snapshot_npz(data: bytes) -> None:
    """pages.npz and pages-first-crossing.npz (an npz is a zip of .npy members), read as a bundle's."""
    from gui.snapshot import first_crossing
    from gui.snapshot.bundle import SnapshotError, _pages

    try:
        _pages(data, [])
        first_crossing.from_npz(data, [])
    except SnapshotError:
        pass


def snapshot_npy(data: bytes) -> None:
    """One .npy member of pages.npz, among the pool's other arrays: its header and its data."""
    import numpy as np

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in ("epoch", "writer", "filled", "state"):
            zf.writestr(f"decode-0/{name}.npy", _npy(np.zeros(4, np.int64)))
        zf.writestr("decode-0/owner.npy", data)
        zf.writestr("decode-0/time.npy", data)
    snapshot_npz(buf.getvalue())


def _npy(array) -> bytes:
    import numpy as np

    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def seed_bundle(stored: bool = False) -> bytes:
    """A valid bundle (the synthetic snapshot of the bundle tests), deflated or stored."""
    global _SEED
    if _SEED is None:
        from gui.snapshot.bundle import write_bundle
        from tests.gui.snapshot.test_snapshot_bundle import make_snapshot

        _SEED = write_bundle(make_snapshot(), _scratch() / "seed.zip").read_bytes()
    if not stored:
        return _SEED
    with zipfile.ZipFile(io.BytesIO(_SEED)) as zf:
        return _bundle_with(**{info.filename: zf.read(info) for info in zf.infolist()})


def _bundle_with(**replaced: bytes) -> bytes:
    """The seed bundle with members replaced, stored (not deflated: quicker, and the bytes are the data)."""
    global _SEED_MEMBERS
    if _SEED_MEMBERS is None:
        with zipfile.ZipFile(io.BytesIO(seed_bundle())) as zf:
            _SEED_MEMBERS = {info.filename: zf.read(info) for info in zf.infolist()}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in {**_SEED_MEMBERS, **replaced}.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _read_bundle_bytes(data: bytes) -> None:
    from gui.model.snapshot_state import state_from_snapshot
    from gui.snapshot.bundle import SnapshotError, read_bundle

    path = _scratch() / "fuzz-bundle.zip"
    path.write_bytes(data)
    try:
        state_from_snapshot(read_bundle(path))
    except SnapshotError:
        pass


def _scratch():
    import pathlib
    import tempfile

    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = pathlib.Path(tempfile.mkdtemp(prefix="pagewarden-fuzz-"))
    return _SCRATCH


_SCRATCH = None
_SEED = None
_SEED_MEMBERS = None

TARGETS = {"control": control_message, "control-msgpack": msgpack_control_message, "kv-events": kv_events,
           "http-body": http_body, "toml-config": toml_config, "config-json": config_json,
           "snapshot": snapshot_bundle, "snapshot-zip": snapshot_zip, "snapshot-jsonl": snapshot_jsonl,
           "snapshot-npz": snapshot_npz, "snapshot-npy": snapshot_npy, **KV_TARGETS,
           **TEMPLATE_TARGETS}
