"""Opening a journal that a crash or a bad disk may have damaged, keeping all that can be read.

Two kinds of damage, each said, never silently papered over:
- a torn WAL tail (the process or machine died mid-write): SQLite ignores the partial frame and
  the transaction in it; we report its size, since those bytes held the newest evidence;
- a damaged database file (`quick_check` fails or the file is not a database): the file is moved
  aside (never deleted), a new journal is created, and every row that can still be read is
  copied into it; the ranges that could not be read are listed.
"""

from __future__ import annotations

import sqlite3
import struct
import time
from pathlib import Path

from engine.evidence import schema

DAMAGE = ("SQLITE_CORRUPT", "SQLITE_NOTADB")  # the errors that mean the file itself is damaged
CHUNK = 500  # rows copied per read while salvaging
MAX_BAD_CHUNKS = 2_000  # unreadable chunks skipped per table before giving the rest of it up


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=5.0, check_same_thread=False, isolation_level="DEFERRED")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    return conn


def torn_wal_bytes(path: Path) -> int:
    """Bytes at the end of `path`'s WAL that do not make a whole frame (0: none, or no WAL)."""
    wal = Path(f"{path}-wal")
    try:
        size = wal.stat().st_size
        if size < 32:
            return size
        with wal.open("rb") as f:
            header = f.read(32)
    except OSError:
        return 0
    page_size = struct.unpack(">I", header[8:12])[0]
    if page_size == 1:  # the encoding of 65536
        page_size = 65536
    if page_size < 512:
        return size - 32
    return (size - 32) % (24 + page_size)


def open_recovered(path: Path) -> tuple[sqlite3.Connection, dict | None]:
    """The journal at `path`, opened and ready to write, and what recovery did (None: nothing
    was wrong). Raises sqlite3.Error / OSError only when no journal can be created at all."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise OSError(f"{path} is not a regular file (a directory?): name a file for [audit] journal")
    torn = torn_wal_bytes(path) if path.exists() else 0
    problem = None
    if path.exists():
        conn = None
        try:
            conn = connect(path)
            check = [row[0] for row in conn.execute("PRAGMA quick_check(20)").fetchall()]
            if check == ["ok"]:
                _check_version(conn, path)
                schema.create(conn)
                conn.commit()
                if torn:
                    return conn, {"torn_wal_bytes": torn, "message": (
                        f"the journal's WAL ended in {torn:,} bytes of a partial write (the process died "
                        f"mid-write): the transaction in them could not be read; everything before it was kept")}
                return conn, None
            problem = "; ".join(check)
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                conn.close()
            if getattr(exc, "sqlite_errorname", None) not in DAMAGE:
                raise  # locked by another process, no permission, an I/O error: not damage; the file stays
            problem = str(exc)
            conn = None
        if conn is not None:
            conn.close()
    if problem is None:  # a new journal
        conn = connect(path)
        schema.create(conn)
        conn.commit()
        return conn, None
    moved = path.with_name(f"{path.name}.unreadable-{time.strftime('%Y%m%d-%H%M%S')}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            src.rename(f"{moved}{suffix}")
    conn = connect(path)
    schema.create(conn)
    conn.commit()
    kept, unreadable = salvage(moved, conn)
    message = (f"the journal could not be read whole ({problem}); it was moved to {moved.name} and "
               f"{sum(kept.values()):,} rows were kept")
    if unreadable:
        message += "; could not read: " + "; ".join(unreadable[:20])
        if len(unreadable) > 20:
            message += f" (+{len(unreadable) - 20} more ranges)"
    return conn, {"problem": problem, "moved_to": str(moved), "kept_rows": kept, "unreadable": unreadable,
                  "torn_wal_bytes": torn, "message": message}


def _check_version(conn: sqlite3.Connection, path: Path) -> None:
    """A journal written by another schema version is left alone (raises sqlite3.DatabaseError
    naming both versions): writing into it would fail row by row, or mix two layouts."""
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return  # an empty file: a new journal
    row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() if "meta" in tables else None
    if row is None or row[0] != str(schema.SCHEMA_VERSION):
        conn.close()
        raise sqlite3.DatabaseError(f"{path} holds journal schema {row[0] if row else 'none'}; this engine writes "
                                    f"schema {schema.SCHEMA_VERSION}: move the file away or set [audit] journal")


def salvage(src_path: Path, dst: sqlite3.Connection) -> tuple[dict[str, int], list[str]]:
    """Copy every readable row of the journal at src_path into dst; returns (rows kept per
    table, descriptions of what could not be read)."""
    kept: dict[str, int] = {}
    unreadable: list[str] = []
    try:
        src = sqlite3.connect(str(src_path), timeout=5.0)
    except sqlite3.Error as exc:
        return kept, [f"the whole file ({exc})"]
    try:
        for table in schema.TABLES:
            kept[table] = _copy_table(src, dst, table, unreadable)
        dst.commit()
    finally:
        src.close()
    return kept, unreadable


def _copy_table(src, dst, table: str, unreadable: list[str]) -> int:
    try:
        columns = [row[1] for row in src.execute(f"PRAGMA table_info({table})").fetchall()]
    except sqlite3.DatabaseError as exc:
        unreadable.append(f"table {table} ({exc})")
        return 0
    if not columns:
        return 0
    names = ", ".join(columns)
    insert = f"INSERT OR IGNORE INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})"
    after, copied, bad = 0, 0, 0
    while bad < MAX_BAD_CHUNKS:
        try:
            rows = src.execute(f"SELECT rowid, {names} FROM {table} WHERE rowid > ? ORDER BY rowid LIMIT {CHUNK}",
                               (after,)).fetchall()
        except sqlite3.DatabaseError as exc:
            bad += 1
            rows, lost = _one_by_one(src, table, names, after)
            if rows:
                dst.executemany(insert, [row[1:] for row in rows])
                copied += len(rows)
            if lost:
                unreadable.append(f"{table}: {lost} row(s) between rowid {after:,} and {after + CHUNK:,} ({exc})")
            after += CHUNK
            continue
        if not rows:
            break
        dst.executemany(insert, [row[1:] for row in rows])
        copied += len(rows)
        after = rows[-1][0]
    if bad >= MAX_BAD_CHUNKS:
        unreadable.append(f"{table}: the rest after rowid {after:,} (too many unreadable ranges)")
    return copied


def _one_by_one(src, table: str, names: str, after: int) -> tuple[list, int]:
    """The readable rows with rowid in (after, after + CHUNK], read one at a time; and how many
    of those rowids could not be read (a rowid with no row is not counted)."""
    rows, lost = [], 0
    for rowid in range(after + 1, after + CHUNK + 1):
        try:
            row = src.execute(f"SELECT rowid, {names} FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
        except sqlite3.DatabaseError:
            lost += 1
            continue
        if row is not None:
            rows.append(row)
    return rows, lost
