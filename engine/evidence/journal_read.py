"""JournalReader: the evidence journal read back, with the engine running or dead.

Opens the file read-only (it never checkpoints or rewrites it), so reading evidence cannot
change it. Answers in the shapes of the engine's control ops (`scope`, alert records, `history`
requests), so the same report and snapshot code serves both.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from engine.evidence import schema
from engine.evidence.scope_pairs import sorted_pairs

TERMINAL = ("finished", "failed", "cancelled", "rejected")  # request events that end its lifecycle
READ_BUDGET_S = 120.0  # one reader's SQL time in all: a hostile file cannot make it run forever
MAX_VALUE_BYTES = 64 << 20  # one string or blob read, at most (a keyframe is ~120 KB)


class JournalError(Exception):
    """The journal cannot be opened or read; the message names the file and why."""


class JournalReader:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise JournalError(f"no evidence journal at {self.path}")
        try:
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
            # A journal may come from anywhere (an incident bundle, a colleague): no view, trigger or
            # function in it runs, no value is larger than MAX_VALUE_BYTES, and reading stops after
            # READ_BUDGET_S of SQL.
            self.conn.execute("PRAGMA trusted_schema = OFF")
            self.conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            deadline = time.monotonic() + READ_BUDGET_S
            self.conn.set_progress_handler(lambda: time.monotonic() > deadline, 100_000)
            self._check_schema()
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{self.path} is not a readable evidence journal: {exc}") from None

    def _check_schema(self) -> None:
        """Only the journal's own tables and indexes, each a real table (not a view): what a
        query names is then what it reads."""
        objects = self.conn.execute("SELECT type, name FROM sqlite_master").fetchall()
        odd = [f"{kind} {name}" for kind, name in objects
               if kind not in ("table", "index") or (kind == "table" and name not in schema.TABLES
                                                     and name != "sqlite_sequence")]
        if odd:
            raise JournalError(f"{self.path} is not an evidence journal: it holds {', '.join(odd[:5])}")
        missing = [t for t in schema.TABLES if (("table", t) not in objects)]
        if missing:
            raise JournalError(f"{self.path} is not an evidence journal: no table {', '.join(missing)}")
        version = self.conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if version is None or version[0] != str(schema.SCHEMA_VERSION):
            raise JournalError(f"{self.path} has journal schema {version[0] if version else 'none'}; this version "
                               f"reads schema {schema.SCHEMA_VERSION}")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _rows(self, sql: str, args=()) -> list:
        try:
            return self.conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as exc:
            if "interrupt" in str(exc):  # the progress handler: the read budget is spent
                raise JournalError(f"reading {self.path} stopped after {READ_BUDGET_S:.0f} s of queries") from None
            raise JournalError(f"reading {self.path} failed: {exc}") from None

    # ---- runs --------------------------------------------------------------------------
    def runs(self) -> list[dict]:
        """Every engine run in the journal, oldest first."""
        out = []
        for run, started, ended, clean, pid, host, control, engine, config, last_write in self._rows(
                "SELECT run, started, ended, clean, pid, host, control, engine, config, last_write FROM runs "
                "ORDER BY started"):
            out.append({"run": run, "started": started, "ended": ended, "clean": bool(clean), "pid": pid,
                        "host": host, "control": control, "engine": _loads(engine) or {},
                        "config": _loads(config) or {}, "last_write": last_write})
        return out

    def _select(self, what: str, runs, since, until, columns: tuple[str, str] = ("time", "time")) -> tuple[str, tuple]:
        """SELECT `what` of the runs (None: all) in [since, until]: a row counts when its
        columns[0] (its last time) is at or after since and its columns[1] (its first) at or
        before until."""
        where, args = self._run_filter(runs)
        sql = f"SELECT {what} WHERE {where}"
        if since is not None:
            sql, args = sql + f" AND {columns[0]} >= ?", (*args, since)
        if until is not None:
            sql, args = sql + f" AND {columns[1]} <= ?", (*args, until)
        return sql, args

    def _run_filter(self, runs) -> tuple[str, tuple]:
        if runs is None:
            return "1=1", ()
        runs = tuple(runs)
        return f"run IN ({', '.join('?' * len(runs))})", runs

    # ---- alerts ------------------------------------------------------------------------
    def alerts(self, runs=None, since: float | None = None, until: float | None = None) -> list[dict]:
        """Every alert episode (its newest state), oldest first, each with its `run`."""
        sql, args = self._select("run, record FROM alerts", runs, since, until, ("last_seen", "first_seen"))
        out = []
        for run, record in self._rows(sql + " ORDER BY first_seen", args):
            record = _loads(record)
            if isinstance(record, dict):
                record.setdefault("key", f"{record.get('id')}#{record.get('episode', 1)}")
                out.append({**record, "run": run})
        return out

    # ---- crossings: who received whose data -----------------------------------------------
    def scope(self, since: float | None = None, until: float | None = None, runs=None) -> list[dict]:
        """Affected pairs in [since, until], as the engine's `scope` answers them (a second
        partly inside the window counts whole), with tenants and the run; sorted by run, then
        (source slot, reader slot)."""
        sql, args = self._select("run, source_slot, reader_slot, source, reader, source_tenant, reader_tenant, "
                                 "first, last, reads, pages FROM crossings", runs, since, until, ("last", "first"))
        pairs: dict[tuple, dict] = {}
        for run, s_slot, r_slot, source, reader, s_tenant, r_tenant, first, last, reads, pages in self._rows(sql, args):
            if not all(isinstance(v, (int, float)) for v in (first, last, reads, s_slot, r_slot)):
                continue  # a damaged row: not evidence of anything
            pair = pairs.get((run, s_slot, r_slot))
            if pair is None:
                pair = pairs[(run, s_slot, r_slot)] = {
                    "run": run, "source": source, "source_slot": s_slot, "reader": reader, "reader_slot": r_slot,
                    "source_tenant": s_tenant, "reader_tenant": r_tenant, "pages": set(), "first": first,
                    "last": last, "reads": 0}
            for name, value in (("source", source), ("source_tenant", s_tenant), ("reader_tenant", r_tenant)):
                if pair[name] is None:
                    pair[name] = value
            pair["pages"] |= _pages(_loads(pages))
            pair["first"], pair["last"] = min(pair["first"], first), max(pair["last"], last)
            pair["reads"] += reads
        return sorted_pairs(pairs)

    # ---- requests and engine events ------------------------------------------------------
    def events(self, since: float | None = None, until: float | None = None, runs=None) -> list[dict]:
        """Every event in [since, until]: {run, time, subject, event, **fields}, in order."""
        sql, args = self._select("run, time, subject, event, fields FROM events", runs, since, until)
        out = []
        for run, when, subject, event, fields in self._rows(sql + " ORDER BY seq", args):
            fields = _loads(fields)
            out.append({**(fields if isinstance(fields, dict) else {}), "run": run, "time": when,
                        "subject": subject, "event": event})
        return out

    def history(self, since: float | None = None, until: float | None = None, runs=None) -> dict:
        """Requests with their lifecycle events and the engine's own events, shaped as the
        engine's `history` answer."""
        subjects: dict[str, list[dict]] = {}
        for event in self.events(since, until, runs):
            subject = event.pop("subject")
            subjects.setdefault(subject, []).append(event)
        requests, other = [], []
        for subject, events in subjects.items():
            if subject == "engine" or subject.startswith("worker:"):
                other.append({"subject": subject, "events": events})
            else:
                requests.append(request_from_events(subject, events))
        return {"requests": requests, "engine_events": other}

    def prompt_log(self, since: float | None = None, runs=None) -> list[dict]:
        sql, args = self._select("run, time, request_id, tenant, model, prompt_len, prompt_hash, data_tier "
                                 "FROM prompts", runs, since, None)
        names = ("run", "time", "request_id", "tenant", "model", "prompt_len", "prompt_hash", "data_tier")
        return [dict(zip(names, row)) for row in self._rows(sql + " ORDER BY time", args)]

    def latest(self, table: str, column: str, runs=None, until: float | None = None):
        """The newest JSON value of `column` in `table` (findings, workers), or None."""
        sql, args = self._select(f"{column} FROM {table}", runs, None, until)
        rows = self._rows(sql + " ORDER BY time DESC LIMIT 1", args)
        return _loads(rows[0][0]) if rows else None

    def keyframes(self, since: float | None = None, until: float | None = None, runs=None,
                  limit: int | None = None) -> list[dict]:
        """Page-map keyframes: {run, time, pool, reason, arrays (npz bytes)}, oldest first (the
        first `limit` of the window)."""
        sql, args = self._keyframe_query("run, time, pool, reason, arrays", since, until, runs)
        if limit is not None:
            sql, args = sql + " LIMIT ?", (*args, int(limit))
        return [{"run": r, "time": t, "pool": p, "reason": why, "arrays": a}
                for r, t, p, why, a in self._rows(sql, args)]

    def count_keyframes(self, since: float | None = None, until: float | None = None, runs=None) -> int:
        sql, args = self._select("COUNT(*) FROM keyframes", runs, since, until)
        return int(self._rows(sql, args)[0][0])

    def keyframe_pools(self, until: float | None = None, runs=None) -> set[str]:
        """The pools with a keyframe at or before `until` (no map is read)."""
        sql, args = self._select("DISTINCT pool FROM keyframes", runs, None, until)
        return {pool for (pool,) in self._rows(sql, args)}

    def latest_keyframe(self, pool: str, until: float | None = None, runs=None) -> bytes | None:
        """The newest keyframe of `pool` at or before `until` (npz bytes), or None."""
        sql, args = self._select("arrays FROM keyframes", runs, None, until)
        rows = self._rows(sql + " AND pool = ? ORDER BY time DESC LIMIT 1", (*args, pool))
        return rows[0][0] if rows else None

    def event_counts(self, names, until: float | None = None, runs=None) -> dict[str, int]:
        """How many events of each of `names` (admitted, rejected, ...) at or before `until`."""
        names = tuple(names)
        sql, args = self._select("event, COUNT(*) FROM events", runs, None, until)
        sql += f" AND event IN ({', '.join('?' * len(names))}) GROUP BY event"
        return {event: int(n) for event, n in self._rows(sql, (*args, *names))}

    def _keyframe_query(self, columns: str, since, until, runs) -> tuple[str, tuple]:
        sql, args = self._select(f"{columns} FROM keyframes", runs, since, until)
        return sql + " ORDER BY time", args

    def prunes(self) -> list[dict]:
        return [{"time": t, "older_than": cut, "rows": n, "reason": why}
                for t, cut, n, why in self._rows("SELECT time, older_than, rows, reason FROM prunes ORDER BY time")]


def request_from_events(request_id: str, events: list[dict]) -> dict:
    """A request as the engine's `history` describes it, rebuilt from its journaled events."""
    rec: dict = {"request_id": request_id, "phase": "unknown", "events": events,
                 "arrival": events[0]["time"] if events else None, "run": events[0].get("run") if events else None}
    for event in events:
        name = event.get("event")
        if name == "admitted":
            for key in ("slot", "tenant", "prompt_len", "prompt_hash", "max_new_tokens", "data_tier"):
                rec[key] = event.get(key)
            rec["phase"] = "queued"
        elif name == "placeholder":
            rec["placeholder"] = True
        elif name in ("reserve_sent", "reserved"):
            rec["decode_worker"] = event.get("worker")
        elif name in ("prefill_sent", "prefilled"):
            rec["prefill_worker"] = event.get("worker")
        elif name in TERMINAL:
            rec["phase"] = name
            rec["finish_reason"] = event.get("reason") or event.get("code")
            rec["error"] = event.get("error") or ({"code": event.get("code"), "message": event.get("message")}
                                                  if name == "rejected" else None)
            rec["tokens"] = event.get("tokens", 0)
    if rec["phase"] not in TERMINAL and events:
        rec["phase"] = "unfinished"  # the run ended (or the journal was cut) before this request did
    return rec


def _pages(ranges) -> set[tuple[str, int]]:
    """A crossing row's pages: [[pool, first, last], ...] ranges, as (pool, page) pairs. Anything
    else in the row (a damaged or hostile file) is skipped."""
    out: set[tuple[str, int]] = set()
    for item in ranges if isinstance(ranges, list) else ():
        if isinstance(item, list) and len(item) == 3 and all(isinstance(v, int) for v in item[1:]) \
                and 0 <= item[2] - item[1] < 1 << 24:
            out.update((str(item[0]), page) for page in range(item[1], item[2] + 1))
    return out


def _loads(text):
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, TypeError, RecursionError):
        return None
