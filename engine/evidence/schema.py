"""The journal's tables. One file per engine; every row carries the run (one engine start) it
belongs to, so a restart adds a run and never rewrites the previous one's rows.

Alert episodes are upserted by (run, key): the newest state of an episode replaces the older
state of *that* episode only; a later episode of the same alert is another row. Crossings are
pair aggregates per second, upserted by (run, second, source slot, reader slot) while their
second is still filling."""

from __future__ import annotations

SCHEMA_VERSION = 1

TABLES = {
    "meta": "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
    "runs": """CREATE TABLE IF NOT EXISTS runs (
        run TEXT PRIMARY KEY, started REAL, ended REAL, clean INTEGER DEFAULT 0, pid INTEGER,
        host TEXT, control TEXT, engine TEXT, config TEXT, last_write REAL)""",
    "alerts": """CREATE TABLE IF NOT EXISTS alerts (
        run TEXT, key TEXT, id TEXT, episode INTEGER, kind TEXT, severity TEXT, state TEXT,
        first_seen REAL, last_seen REAL, record TEXT, PRIMARY KEY (run, key))""",
    "crossings": """CREATE TABLE IF NOT EXISTS crossings (
        run TEXT, second INTEGER, source_slot INTEGER, reader_slot INTEGER, source TEXT, reader TEXT,
        source_tenant TEXT, reader_tenant TEXT, first REAL, last REAL, reads INTEGER, pages TEXT,
        PRIMARY KEY (run, second, source_slot, reader_slot))""",
    "events": """CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT, time REAL, subject TEXT, event TEXT, fields TEXT)""",
    "prompts": """CREATE TABLE IF NOT EXISTS prompts (
        run TEXT, time REAL, request_id TEXT, tenant TEXT, model TEXT, prompt_len INTEGER,
        prompt_hash TEXT, data_tier TEXT)""",
    "findings": "CREATE TABLE IF NOT EXISTS findings (run TEXT, time REAL, findings TEXT)",
    "workers": "CREATE TABLE IF NOT EXISTS workers (run TEXT, time REAL, workers TEXT)",
    "keyframes": """CREATE TABLE IF NOT EXISTS keyframes (
        run TEXT, time REAL, pool TEXT, reason TEXT, arrays BLOB)""",
    "prunes": "CREATE TABLE IF NOT EXISTS prunes (time REAL, older_than REAL, rows INTEGER, reason TEXT)",
}

INDEXES = (
    "CREATE INDEX IF NOT EXISTS crossings_time ON crossings (run, last)",
    "CREATE INDEX IF NOT EXISTS events_subject ON events (run, subject)",
    "CREATE INDEX IF NOT EXISTS events_time ON events (time)",
    "CREATE INDEX IF NOT EXISTS prompts_time ON prompts (time)",
    "CREATE INDEX IF NOT EXISTS alerts_time ON alerts (last_seen)",
)

# Tables pruned by age: (table, its time column). Runs go last, once none of their rows is left.
TIMED = (("crossings", "last"), ("events", "time"), ("prompts", "time"), ("findings", "time"),
         ("workers", "time"), ("keyframes", "time"), ("alerts", "last_seen"))


def create(conn) -> None:
    for ddl in (*TABLES.values(), *INDEXES):
        conn.execute(ddl)
    conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
