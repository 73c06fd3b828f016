"""Journal: the evidence written to SQLite by one thread behind a bounded queue.

The supervisor's loop only puts tuples on the queue (never waits on the disk); a full queue
drops the item and counts it, and the count is itself evidence (status, /metrics, the report).
The writer commits at least every COMMIT_S, in WAL mode with synchronous=NORMAL: a commit is in
the WAL file when it returns, so a SIGKILL of the supervisor loses only what was still queued or
not yet flushed by the supervisor (the crossings of the last FLUSH_S): well under a second.
A disk that fills or a file that turns read-only makes writes fail: the rows are counted as
lost, `error` says why (the supervisor raises `journal_failing`), and the writer tries again.
"""

from __future__ import annotations

import json
import os
import queue
import sqlite3
import threading
import time
import uuid
from pathlib import Path

from engine.evidence import schema
from engine.evidence.recovery import connect as _connect, open_recovered

COMMIT_S = 0.2  # the writer commits at least this often while there is something to write
GATHER_S = 0.1  # and at most this often: records gathered meanwhile share one transaction
QUEUE_ITEMS = 200_000  # items waiting to be written; past it new items are dropped and counted
BATCH_ITEMS = 5_000  # items written in one transaction at most
PRUNE_EVERY_S = 60.0
RETRY_S = 5.0  # after a failed write, the writer reopens the file this long later
MAX_FIELD_CHARS = 64 << 10  # one record's JSON, at most: longer strings and lists inside it are cut
MAX_STRING = 8 << 10  # a string inside a record past which it is cut (an alert's log tail)
MAX_ITEMS = 1_000  # a list inside a record past which it is cut
MAX_DEPTH = 32  # nesting kept (deeper values are written as their repr, cut)


def _plain(value, depth: int = 0, cut: bool = False):
    """value as JSON-ready data: keys made strings, unknown types their str(); with `cut`, long
    strings and lists shortened in place of the whole, each cut saying how much it left out."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            name = key if isinstance(key, str) else (key.decode(errors="replace") if isinstance(key, bytes) else str(key))
            if cut and isinstance(item, str) and len(item) > MAX_STRING:
                out[name], out[f"{name}_cut_chars"] = item[-MAX_STRING:], len(item)  # the tail: a log's end matters
            elif cut and isinstance(item, (list, tuple)) and len(item) > MAX_ITEMS:
                out[name], out[f"{name}_total"] = [_plain(v, depth + 1, cut) for v in item[:MAX_ITEMS]], len(item)
            else:
                out[name] = _plain(item, depth + 1, cut) if depth < MAX_DEPTH else repr(item)[:MAX_STRING]
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(v, depth + 1, cut) for v in value] if depth < MAX_DEPTH else repr(value)[:MAX_STRING]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


def _other(value):
    """What json cannot encode itself: bytes as text, anything else as its str()."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _json(value) -> str:
    """One record as JSON: whole when it fits MAX_FIELD_CHARS, else with its long strings and
    lists cut (each says how much); only what still does not fit is replaced by a marker."""
    try:  # the usual record is plain data: json's C encoder alone
        text = json.dumps(value, separators=(",", ":"), default=_other)
    except (TypeError, ValueError, RecursionError):  # bytes keys, cycles, depth: made plain first
        text = json.dumps(_plain(value), separators=(",", ":"))
    if len(text) > MAX_FIELD_CHARS:
        text = json.dumps(_plain(value, cut=True), separators=(",", ":"))
    if len(text) > MAX_FIELD_CHARS:
        text = json.dumps({"cut": True, "chars": len(text), "head": text[:MAX_FIELD_CHARS // 2]})
    return text


def page_ranges(pages) -> list:
    """[[pool, page], ...] as [[pool, first, last], ...]: a crossing's pages, compact."""
    out: list = []
    for pool, page in sorted((str(p[0]), int(p[1])) for p in pages):
        if out and out[-1][0] == pool and out[-1][2] + 1 == page:
            out[-1][2] = page
        else:
            out.append([pool, page, page])
    return out


class Journal:
    def __init__(self, path: str | os.PathLike, *, run_info: dict, max_age_s: float, max_bytes: int,
                 queue_items: int = QUEUE_ITEMS):
        """Open (or create) the journal at `path` and start a new run in it. A file that cannot be
        read whole is moved aside and what could be read is kept (`recovered` says what).

        Raises OSError or sqlite3.Error when the file cannot be opened or created at all."""
        self.path = Path(path)
        self.max_age_s, self.max_bytes = float(max_age_s), int(max_bytes)
        self.run = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
        self.started = time.time()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn, self.recovered = open_recovered(self.path)
        self.previous_runs = [{"run": run, "started": started, "ended": ended, "clean": bool(clean)}
                              for run, started, ended, clean in conn.execute(
                                  "SELECT run, started, ended, clean FROM runs ORDER BY started")]
        conn.execute("INSERT INTO runs (run, started, pid, host, control, engine, config) VALUES (?,?,?,?,?,?,?)",
                     (self.run, self.started, os.getpid(), run_info.get("host"), run_info.get("control"),
                      _json(run_info.get("engine", {})), _json(run_info.get("config", {}))))
        conn.commit()
        self._conn: sqlite3.Connection | None = conn
        self.queue: queue.Queue = queue.Queue(maxsize=queue_items)
        self.written = 0  # items committed
        self.dropped = 0  # items never written because the queue was full
        self.lost = 0  # items whose write failed (disk full, read-only file)
        self.error: str | None = None  # why the last write failed (None once writes succeed again)
        self.pruned_rows = 0
        self._last_write = 0.0
        self.item_error: str | None = None  # the last record that could not be encoded (it alone was lost)
        self._last_prune = time.time()  # the first prune a minute after start, off the start-up path
        self._thread = threading.Thread(target=self._run, name="evidence-journal", daemon=True)
        self._thread.start()

    # ---- the serving side: never blocks --------------------------------------------------
    def put(self, kind: str, *item) -> None:
        try:
            self.queue.put_nowait((kind, item))
        except queue.Full:
            self.dropped += 1

    def alert(self, record: dict, run: str | None = None) -> None:
        self.put("alert", dict(record), run)

    def event(self, subject: str, event: str, when: float, fields: dict) -> None:
        self.put("event", when, subject, event, fields)

    def crossing(self, row: tuple) -> None:
        """row: (second, source_slot, reader_slot, source, reader, source_tenant, reader_tenant,
        first, last, reads, pages as [[pool, page], ...])."""
        self.put("crossing", row)

    def prompt(self, entry: dict) -> None:
        self.put("prompt", dict(entry))

    def findings(self, when: float, findings: list[dict]) -> None:
        self.put("findings", when, findings)

    def workers(self, when: float, workers: list[dict]) -> None:
        self.put("workers", when, workers)

    def keyframe(self, when: float, pool: str, reason: str, arrays: bytes) -> None:
        self.put("keyframe", when, pool, reason, arrays)

    def sync(self, timeout_s: float = 30.0) -> bool:
        """Wait until everything queued before this call is written (or failed). False on timeout."""
        done = threading.Event()
        try:
            self.queue.put(("sync", (done,)), timeout=timeout_s)
        except queue.Full:
            return False
        return done.wait(timeout_s)

    def prune_now(self, now: float | None = None, timeout_s: float = 30.0) -> int:
        """Prune on the writer's thread now (it also does every PRUNE_EVERY_S); the rows deleted."""
        result: list[int] = []
        done = threading.Event()
        try:
            self.queue.put(("prune", (now, result, done)), timeout=timeout_s)
        except queue.Full:
            return 0
        done.wait(timeout_s)
        return result[0] if result else 0

    def describe(self) -> dict:
        try:
            size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        except OSError:
            size = None
        return {"journal": str(self.path), "run": self.run, "written": self.written, "dropped": self.dropped,
                "lost": self.lost, "error": self.error, "queued": self.queue.qsize(), "bytes": size,
                "item_error": self.item_error, "writer_alive": self.alive,
                "pruned_rows": self.pruned_rows, "recovered": self.recovered,
                "previous_runs": self.previous_runs[-20:], "max_age_s": self.max_age_s, "max_bytes": self.max_bytes}

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, mark the run ended cleanly, close the file."""
        self.put("end", time.time())
        try:
            self.queue.put(None, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(timeout_s)

    # ---- the writer thread -------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # the writer must never end unseen: the feed alerts on this
            self.error = f"the journal's writer stopped: {type(exc).__name__}: {exc}"
            raise

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        stop = False
        while not stop:
            try:
                first = self.queue.get(timeout=COMMIT_S)
            except queue.Empty:
                self._maybe_prune()
                continue
            if first is not None and first[0] not in ("sync", "prune"):
                # gather for a moment: one transaction (and one wake-up of this thread) per
                # GATHER_S instead of per record; a crash loses at most that much more
                wait = GATHER_S - (time.monotonic() - self._last_write)
                if wait > 0:
                    time.sleep(wait)
            batch = [first]
            while len(batch) < BATCH_ITEMS:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                stop = True
                batch = [b for b in batch if b is not None]
            self._write(batch)
            self._last_write = time.monotonic()
            self._maybe_prune()
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass

    def _write(self, batch: list) -> None:
        controls = [item for item in batch if item[0] in ("sync", "prune")]
        if controls:
            batch = [item for item in batch if item[0] not in ("sync", "prune")]
        if batch:
            self._write_rows(batch)
        for kind, item in controls:
            if kind == "prune":
                now, result, done = item
                try:
                    if self._connection() is not None:
                        result.append(self.prune(now))
                except sqlite3.Error as exc:
                    self.error = f"pruning {self.path} failed: {exc}"
                    self._drop_connection()
                done.set()
            else:
                item[0].set()

    def _write_rows(self, batch: list) -> None:
        conn = self._connection()
        if conn is None:
            self.lost += len(batch)
            return
        bad = 0
        try:
            with conn:
                for kind, item in batch:
                    try:
                        getattr(self, f"_write_{kind}")(conn, *item)
                    except sqlite3.Error:
                        raise  # the file itself: the whole transaction is lost, said below
                    except Exception as exc:  # one record the writer cannot encode: it alone is lost
                        bad += 1
                        self.item_error = f"a {kind} record could not be written: {type(exc).__name__}: {exc}"
                conn.execute("UPDATE runs SET last_write = ? WHERE run = ?", (time.time(), self.run))
            self.written += len(batch) - bad
            self.lost += bad
            self.error = None
        except sqlite3.Error as exc:
            self.lost += len(batch)
            self.error = f"writing {self.path} failed: {exc}"
            self._drop_connection()

    def _connection(self) -> sqlite3.Connection | None:
        if self._conn is None and time.monotonic() >= getattr(self, "_retry_at", 0.0):
            try:
                self._conn = _connect(self.path)
                schema.create(self._conn)
                self._conn.execute("INSERT OR IGNORE INTO runs (run, started, pid) VALUES (?,?,?)",
                                   (self.run, self.started, os.getpid()))
                self._conn.commit()
            except (sqlite3.Error, OSError) as exc:
                self.error = f"opening {self.path} failed: {exc}"
                self._drop_connection()
        return self._conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
        self._conn = None
        self._retry_at = time.monotonic() + RETRY_S

    def _write_alert(self, conn, record: dict, run: str | None = None) -> None:
        """An episode's newest state, under (run, key): this run's, or (an acknowledgement of)
        an earlier run's episode under that run's own key."""
        key = record.get("key") or record.get("id")
        conn.execute("INSERT OR REPLACE INTO alerts (run, key, id, episode, kind, severity, state, first_seen, "
                     "last_seen, record) VALUES (?,?,?,?,?,?,?,?,?,?)",
                     (run or self.run, key, record.get("id"), record.get("episode", 1), record.get("kind"),
                      record.get("severity"), record.get("state"), record.get("first_seen"),
                      record.get("last_seen"), _json(record)))

    def _write_event(self, conn, when, subject, event, fields) -> None:
        conn.execute("INSERT INTO events (run, time, subject, event, fields) VALUES (?,?,?,?,?)",
                     (self.run, when, subject, event, _json(fields)))

    def _write_crossing(self, conn, row) -> None:
        conn.execute("INSERT OR REPLACE INTO crossings (run, second, source_slot, reader_slot, source, reader, "
                     "source_tenant, reader_tenant, first, last, reads, pages) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                     (self.run, *row[:10], json.dumps(page_ranges(row[10]), separators=(",", ":"))))

    def _write_prompt(self, conn, e: dict) -> None:
        conn.execute("INSERT INTO prompts (run, time, request_id, tenant, model, prompt_len, prompt_hash, data_tier) "
                     "VALUES (?,?,?,?,?,?,?,?)",
                     (self.run, e.get("time"), e.get("request_id"), e.get("tenant"), e.get("model"),
                      e.get("prompt_len"), e.get("prompt_hash"), e.get("data_tier")))

    def _write_findings(self, conn, when, findings) -> None:
        conn.execute("INSERT INTO findings (run, time, findings) VALUES (?,?,?)", (self.run, when, _json(findings)))

    def _write_workers(self, conn, when, workers) -> None:
        conn.execute("INSERT INTO workers (run, time, workers) VALUES (?,?,?)", (self.run, when, _json(workers)))

    def _write_keyframe(self, conn, when, pool, reason, arrays) -> None:
        conn.execute("INSERT INTO keyframes (run, time, pool, reason, arrays) VALUES (?,?,?,?,?)",
                     (self.run, when, pool, reason, arrays))

    def _write_end(self, conn, when) -> None:
        conn.execute("UPDATE runs SET ended = ?, clean = 1 WHERE run = ?", (when, self.run))

    # ---- bounds: age and size, oldest first, each prune recorded ----------------------
    def _maybe_prune(self) -> None:
        now = time.time()
        if now - self._last_prune < PRUNE_EVERY_S or self._conn is None:
            return
        self._last_prune = now
        try:
            self.prune(now)
        except sqlite3.Error as exc:
            self.error = f"pruning {self.path} failed: {exc}"
            self._drop_connection()

    def prune(self, now: float | None = None) -> int:
        """(The writer's thread only.) Delete rows older than max_age_s, then the oldest rows while the file's used pages
        exceed max_bytes. Returns the rows deleted; each prune is a row in `prunes`."""
        now = time.time() if now is None else now
        conn = self._conn
        deleted = self._delete_before(conn, now - self.max_age_s, "older than the journal's max_age_s")
        while _used_bytes(conn) > self.max_bytes:  # page maps go first: they are the bulk, not the record
            with conn:
                gone = conn.execute("DELETE FROM keyframes WHERE rowid IN (SELECT rowid FROM keyframes "
                                    "ORDER BY time LIMIT 10)").rowcount
                if gone:
                    conn.execute("INSERT INTO prunes (time, older_than, rows, reason) VALUES (?,?,?,?)",
                                 (time.time(), None, gone, f"keyframes, oldest first: the journal was over "
                                                           f"max_bytes ({self.max_bytes:,})"))
            deleted += gone
            self.pruned_rows += gone
            if not gone:
                break
        for _ in range(20):
            if _used_bytes(conn) <= self.max_bytes:
                break
            oldest = min((t for t in (conn.execute(f"SELECT MIN({col}) FROM {table}").fetchone()[0]
                                      for table, col in schema.TIMED) if t is not None), default=None)
            if oldest is None:
                break
            cut = oldest + max(1.0, (now - oldest) * 0.1)  # the oldest tenth of the time kept
            gone = self._delete_before(conn, cut, f"the journal was over max_bytes ({self.max_bytes:,})")
            deleted += gone
            if not gone:
                break
        return deleted

    def _delete_before(self, conn, cut: float, reason: str) -> int:
        with conn:
            rows = sum(conn.execute(f"DELETE FROM {table} WHERE {col} < ?", (cut,)).rowcount
                       for table, col in schema.TIMED)
            # a run none of whose rows is left, ended before the cut, goes too (never this one)
            conn.execute("DELETE FROM runs WHERE run != ? AND COALESCE(ended, last_write, started) < ?",
                         (self.run, cut))
            if rows:
                conn.execute("INSERT INTO prunes (time, older_than, rows, reason) VALUES (?,?,?,?)",
                             (time.time(), cut, rows, reason))
        self.pruned_rows += rows
        return rows


def _used_bytes(conn) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]
