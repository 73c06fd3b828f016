"""JournalReader: the evidence journal read back, with the engine running or dead.

Opens the file read-only (it never checkpoints or rewrites it), so reading evidence cannot
change it. Answers in the shapes of the engine's control ops (`scope`, alert records, `history`
requests), so the same report and snapshot code serves both.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

TERMINAL = ("finished", "failed", "cancelled", "rejected")  # request events that end its lifecycle


class JournalError(Exception):
    """The journal cannot be opened or read; the message names the file and why."""


class JournalReader:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise JournalError(f"no evidence journal at {self.path}")
        try:
            self.conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, timeout=5.0)
            self.conn.execute("SELECT 1 FROM runs LIMIT 1").fetchall()
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{self.path} is not a readable evidence journal: {exc}") from None

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

    def _run_filter(self, runs) -> tuple[str, tuple]:
        if runs is None:
            return "1=1", ()
        runs = tuple(runs)
        return f"run IN ({', '.join('?' * len(runs))})", runs

    # ---- alerts ------------------------------------------------------------------------
    def alerts(self, runs=None, since: float | None = None, until: float | None = None) -> list[dict]:
        """Every alert episode (its newest state), oldest first, each with its `run`."""
        where, args = self._run_filter(runs)
        sql = f"SELECT run, record FROM alerts WHERE {where}"
        if since is not None:
            sql, args = sql + " AND last_seen >= ?", (*args, since)
        if until is not None:
            sql, args = sql + " AND first_seen <= ?", (*args, until)
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
        where, args = self._run_filter(runs)
        sql = (f"SELECT run, source_slot, reader_slot, source, reader, source_tenant, reader_tenant, first, last, "
               f"reads, pages FROM crossings WHERE {where}")
        if since is not None:
            sql, args = sql + " AND last >= ?", (*args, since)
        if until is not None:
            sql, args = sql + " AND first <= ?", (*args, until)
        pairs: dict[tuple, dict] = {}
        for run, s_slot, r_slot, source, reader, s_tenant, r_tenant, first, last, reads, pages in self._rows(sql, args):
            pair = pairs.get((run, s_slot, r_slot))
            if pair is None:
                pair = pairs[(run, s_slot, r_slot)] = {
                    "run": run, "source": source, "source_slot": s_slot, "reader": reader, "reader_slot": r_slot,
                    "source_tenant": s_tenant, "reader_tenant": r_tenant, "pages": set(), "first": first,
                    "last": last, "reads": 0}
            for name, value in (("source", source), ("source_tenant", s_tenant), ("reader_tenant", r_tenant)):
                if pair[name] is None:
                    pair[name] = value
            pair["pages"] |= {(str(p[0]), int(p[1])) for p in (_loads(pages) or []) if len(p) == 2}
            pair["first"], pair["last"] = min(pair["first"], first), max(pair["last"], last)
            pair["reads"] += reads
        out = []
        for key in sorted(pairs):
            pair = pairs[key]
            pair["pages"] = [[pool, page] for pool, page in sorted(pair["pages"])]
            out.append(pair)
        return out

    # ---- requests and engine events ------------------------------------------------------
    def events(self, since: float | None = None, until: float | None = None, runs=None) -> list[dict]:
        """Every event in [since, until]: {run, time, subject, event, **fields}, in order."""
        where, args = self._run_filter(runs)
        sql = f"SELECT run, time, subject, event, fields FROM events WHERE {where}"
        if since is not None:
            sql, args = sql + " AND time >= ?", (*args, since)
        if until is not None:
            sql, args = sql + " AND time <= ?", (*args, until)
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
        where, args = self._run_filter(runs)
        sql = (f"SELECT run, time, request_id, tenant, model, prompt_len, prompt_hash, data_tier FROM prompts "
               f"WHERE {where}")
        if since is not None:
            sql, args = sql + " AND time >= ?", (*args, since)
        names = ("run", "time", "request_id", "tenant", "model", "prompt_len", "prompt_hash", "data_tier")
        return [dict(zip(names, row)) for row in self._rows(sql + " ORDER BY time", args)]

    def latest(self, table: str, column: str, runs=None, until: float | None = None):
        """The newest JSON value of `column` in `table` (findings, workers), or None."""
        where, args = self._run_filter(runs)
        sql = f"SELECT {column} FROM {table} WHERE {where}"
        if until is not None:
            sql, args = sql + " AND time <= ?", (*args, until)
        rows = self._rows(sql + " ORDER BY time DESC LIMIT 1", args)
        return _loads(rows[0][0]) if rows else None

    def keyframes(self, since: float | None = None, until: float | None = None, runs=None) -> list[dict]:
        """Page-map keyframes: {run, time, pool, reason, arrays (npz bytes)}, oldest first."""
        where, args = self._run_filter(runs)
        sql = f"SELECT run, time, pool, reason, arrays FROM keyframes WHERE {where}"
        if since is not None:
            sql, args = sql + " AND time >= ?", (*args, since)
        if until is not None:
            sql, args = sql + " AND time <= ?", (*args, until)
        return [{"run": r, "time": t, "pool": p, "reason": why, "arrays": a}
                for r, t, p, why, a in self._rows(sql + " ORDER BY time", args)]

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


def _loads(text):
    if text is None:
        return None
    try:
        return json.loads(text)
    except (ValueError, TypeError):
        return None
