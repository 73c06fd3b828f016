"""JSON Schemas (draft 2020-12) of an incident snapshot bundle's JSON files, and `validate`.

The shapes are those of docs/SNAPSHOT.md: `manifest.json`, `state.json`, and one line of
`events.jsonl`. Required top-level keys and their types are checked strictly; records
inside (workers, requests, events, alerts, ...) carry extra engine fields, so they allow
additional properties. Values the engine may not know yet are nullable.

Pure Python (no Qt): the collector checks what it writes, the reader what it opens, and
the tests check both.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from jsonschema import Draft202012Validator

from engine.wire.alert_kinds import SEVERITIES
from engine.wire.states import AlertState

MANIFEST_SCHEMA_ID = "pagewarden.snapshot/1"
STATE_SCHEMA_ID = "pagewarden.snapshot.state/1"

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NUM = {"type": "number"}
_BOOL = {"type": "boolean"}
_OPT_STR = {"type": ["string", "null"]}
_OPT_INT = {"type": ["integer", "null"]}
_OPT_NUM = {"type": ["number", "null"]}
_COUNT = {"type": "integer", "minimum": 0}


def _record(required: dict, optional: dict | None = None) -> dict:
    """An object with `required` keys (name -> schema), typed `optional` ones, and any others."""
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


_WINDOW = {**_record({"since": _NUM, "until": _NUM}), "additionalProperties": False}

_FILE = _record({"name": {"type": "string", "minLength": 1},
                 "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                 "bytes": _COUNT})

MANIFEST = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "manifest.json",
    **_record({
        "schema": {"const": MANIFEST_SCHEMA_ID},
        "app_version": _STR,
        "engine_version": _OPT_STR,
        "model": _OPT_STR,
        "architecture": _OPT_STR,
        "hostnames": _record({"exporter": _STR, "engine": _OPT_STR}),
        "endpoint": _OPT_STR,
        "created_utc": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$"},
        "created_unix": _NUM,
        "engine_monotonic": _OPT_NUM,
        "engine_uptime_s": _OPT_NUM,
        "window": _WINDOW,
        "config": {"type": "object"},
        "privacy": {"type": "string", "minLength": 1},
        "files": {"type": "array", "items": _FILE},
    }),
}

_EVENT = _record({"event": {"type": "string", "minLength": 1}, "time": _NUM}, {"worker": _OPT_STR})

_REQUEST = _record(
    {"request_id": _STR, "phase": _STR, "events": {"type": "array", "items": _EVENT}},
    {"slot": _OPT_INT, "tenant": _OPT_STR, "prompt_len": _OPT_INT, "prompt_hash": _OPT_STR,
     "max_new_tokens": _OPT_INT, "tokens": _OPT_INT, "decode_worker": _OPT_STR, "prefill_worker": _OPT_STR,
     "ttft_s": _OPT_NUM, "finish_reason": _OPT_STR, "arrival": _OPT_NUM, "pages": {"type": "object"},
     "error": {"type": ["object", "null"], "properties": {"code": _STR, "message": _OPT_STR}}},
)

_TRANSITION = {"type": "array", "prefixItems": [_STR, _NUM], "minItems": 2, "maxItems": 2}

_ALERT = _record(
    {"id": _STR, "kind": _STR, "subject": _STR,
     "severity": {"enum": list(SEVERITIES)},
     "state": {"enum": [s.value for s in AlertState]},
     "detail": _STR, "first_seen": _NUM, "last_seen": _NUM, "count": _COUNT, "acked": _BOOL},
    {"requests": {"type": "array", "items": _STR}, "pages": {"type": "array", "items": _INT},
     "prevented": {"type": ["boolean", "null"]}, "transitions": {"type": "array", "items": _TRANSITION},
     # episodes: an alert that resolves and fires again is a new record of the same id (older
     # engines sent one record per id); the lists keep the newest 50, the totals count all
     "episode": {"type": "integer", "minimum": 1}, "key": _STR, "previous_run": _BOOL,
     "requests_total": _COUNT, "pages_total": _COUNT},
)

_PAIR = _record({
    "source": _OPT_STR, "source_slot": _INT, "reader": _STR, "reader_slot": _INT,
    "pages": {"type": "array", "items": {"type": "array", "prefixItems": [_STR, _INT],
                                         "minItems": 2, "maxItems": 2}},
    "first": _NUM, "last": _NUM, "reads": _COUNT,
}, {"source_tenant": _OPT_STR, "reader_tenant": _OPT_STR})

_FIRST_CROSSING = _record(
    {"maps": {"type": "array", "items": _record({"pool": _STR, "time": _NUM, "reason": _STR}, {"pages": _COUNT})},
     "missing": _OPT_STR},
    {"keyframes": {"type": ["integer", "null"], "minimum": 0}, "problems": {"type": "array", "items": _STR}})

STATE = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "state.json",
    **_record({
        "schema": {"const": STATE_SCHEMA_ID},
        "window": _WINDOW,
        "engine": {"type": "object"},
        "workers": {"type": "array", "items": _record({"name": _STR, "role": _STR, "state": _STR},
                                                      {"pid": _OPT_INT})},
        "requests": {"type": "array", "items": _REQUEST},
        "alerts": {"type": "array", "items": _ALERT},
        "capacity": {"type": "array", "items": _record(
            {"limit": _STR, "exceeds": _BOOL, "window_tokens": _INT, "limit_tokens": _INT})},
        "scope": _record({"pairs": {"type": "array", "items": _PAIR}, "reads": _COUNT}),
        "prompt_log": {"type": "array", "items": _record(
            {"request_id": _STR, "time": _NUM, "tenant": _STR, "prompt_len": _COUNT, "prompt_hash": _STR},
            {"model": _OPT_STR, "data_tier": _OPT_STR})},
        "counters": {"type": "object", "additionalProperties": _INT},
        "engine_events": {"type": "array", "items": _record(
            {"subject": _STR, "events": {"type": "array", "items": _EVENT}})},
    }, {
        # optional: bundles from before the first-crossing maps lack it
        "first_crossing": _FIRST_CROSSING,
    }),
}

EVENT_LINE = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "one line of events.jsonl",
    **_record({"topic": {"type": "string", "minLength": 1}, "time": _NUM},
              {"seq": _INT, "bulk": {"type": "object", "additionalProperties": _COUNT}}),
}

SCHEMAS: dict[str, dict] = {"manifest.json": MANIFEST, "state.json": STATE, "events.jsonl": EVENT_LINE}

_VALIDATORS = {name: Draft202012Validator(schema) for name, schema in SCHEMAS.items()}
_MAX_MESSAGE = 240


def _path(parts: Iterable) -> str:
    """A JSON path like $.requests[2].events[0].time."""
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def validate(name: str, document) -> list[str]:
    """Problems of `document` as the bundle file `name` (a key of SCHEMAS), each naming the
    JSON path where it is; an empty list when it is valid. For "events.jsonl" the document
    is one line, parsed."""
    try:
        validator = _VALIDATORS[name]
    except KeyError:
        raise ValueError(f"no schema for {name!r}; known: {', '.join(SCHEMAS)}") from None
    problems = []
    for error in sorted(validator.iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]):
        message = error.message
        if len(message) > _MAX_MESSAGE:
            message = message[:_MAX_MESSAGE] + "…"
        problems.append(f"{name}: {_path(error.absolute_path)}: {message}")
    return problems


def validate_events(lines: Iterable[str]) -> list[str]:
    """Problems of the text lines of an events.jsonl, each naming its line number."""
    problems = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
        except ValueError as exc:
            problems.append(f"events.jsonl: line {number}: not JSON ({exc})")
            continue
        problems += [f"line {number}: {p}" for p in validate("events.jsonl", document)]
    return problems
