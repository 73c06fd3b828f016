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
QUEUE_ITEMS = 200_000  # items waiting to be written; past it new items are dropped and counted
BATCH_ITEMS = 5_000  # items written in one transaction at most
PRUNE_EVERY_S = 60.0
RETRY_S = 5.0  # after a failed write, the writer reopens the file this long later
MAX_FIELD_CHARS = 64 << 10  # one JSON field of an event, at most (an alert's log tail is cut here)


def _json(value) -> str:
    text = json.dumps(value, default=str, separators=(",", ":"))
    if len(text) > MAX_FIELD_CHARS:
        text = json.dumps({"cut": True, "chars": len(text), "head": text[:MAX_FIELD_CHARS // 2]})
    return text


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
        self._last_prune = time.time()  # the first prune a minute after start, off the start-up path
        self._thread = threading.Thread(target=self._run, name="evidence-journal", daemon=True)
        self._thread.start()

    # ---- the serving side: never blocks --------------------------------------------------
    def put(self, kind: str, *item) -> None:
        try:
            self.queue.put_nowait((kind, item))
        except queue.Full:
            self.dropped += 1

    def alert(self, record: dict) -> None:
        self.put("alert", dict(record))

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
        self.queue.put(("prune", (now, result, done)), timeout=timeout_s)
        done.wait(timeout_s)
        return result[0] if result else 0

    def describe(self) -> dict:
        try:
            size = sum(p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists())
        except OSError:
            size = None
        return {"journal": str(self.path), "run": self.run, "written": self.written, "dropped": self.dropped,
                "lost": self.lost, "error": self.error, "queued": self.queue.qsize(), "bytes": size,
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
        stop = False
        while not stop:
            try:
                first = self.queue.get(timeout=COMMIT_S)
            except queue.Empty:
                self._maybe_prune()
                continue
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
        try:
            with conn:
                for kind, item in batch:
                    getattr(self, f"_write_{kind}")(conn, *item)
                conn.execute("UPDATE runs SET last_write = ? WHERE run = ?", (time.time(), self.run))
            self.written += len(batch)
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

    def _write_alert(self, conn, record: dict) -> None:
        key = record.get("key") or record.get("id")
        conn.execute("INSERT OR REPLACE INTO alerts VALUES (?,?,?,?,?,?,?,?,?,?)",
                     (self.run, key, record.get("id"), record.get("episode", 1), record.get("kind"),
                      record.get("severity"), record.get("state"), record.get("first_seen"),
                      record.get("last_seen"), _json(record)))

    def _write_event(self, conn, when, subject, event, fields) -> None:
        conn.execute("INSERT INTO events (run, time, subject, event, fields) VALUES (?,?,?,?,?)",
                     (self.run, when, subject, event, _json(fields)))

    def _write_crossing(self, conn, row) -> None:
        conn.execute("INSERT OR REPLACE INTO crossings VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                     (self.run, *row[:10], _json(row[10])))

    def _write_prompt(self, conn, e: dict) -> None:
        conn.execute("INSERT INTO prompts VALUES (?,?,?,?,?,?,?,?)",
                     (self.run, e.get("time"), e.get("request_id"), e.get("tenant"), e.get("model"),
                      e.get("prompt_len"), e.get("prompt_hash"), e.get("data_tier")))

    def _write_findings(self, conn, when, findings) -> None:
        conn.execute("INSERT INTO findings VALUES (?,?,?)", (self.run, when, _json(findings)))

    def _write_workers(self, conn, when, workers) -> None:
        conn.execute("INSERT INTO workers VALUES (?,?,?)", (self.run, when, _json(workers)))

    def _write_keyframe(self, conn, when, pool, reason, arrays) -> None:
        conn.execute("INSERT INTO keyframes VALUES (?,?,?,?,?)", (self.run, when, pool, reason, arrays))

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
                conn.execute("INSERT INTO prunes VALUES (?,?,?,?)", (time.time(), cut, rows, reason))
        self.pruned_rows += rows
        return rows


def _used_bytes(conn) -> int:
    pages = conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]
    return pages * conn.execute("PRAGMA page_size").fetchone()[0]
