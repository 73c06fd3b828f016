"""Journal files that are not what they should be: a directory, a file another process holds,
another schema version, a hostile file handed to `evidence --journal`. None is moved aside as
damaged unless it is damaged; none makes a reader hang or crash."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time

import pytest

from engine.config import REPO_ROOT
from engine.evidence.journal import Journal
from engine.evidence.journal_read import JournalError, JournalReader
from engine.server.alerts import AlertBook


def _journal(path) -> Journal:
    return Journal(path, run_info={}, max_age_s=86_400.0, max_bytes=1 << 30)


def test_a_directory_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "journal.sqlite"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    with pytest.raises(OSError, match="not a regular file"):
        _journal(folder)
    assert (folder / "keep.txt").read_text() == "mine" and not list(tmp_path.glob("*.unreadable-*"))


def test_a_journal_another_process_holds_is_not_taken_for_damage(tmp_path):
    path = tmp_path / "j.sqlite"
    _journal(path).close()
    holder = sqlite3.connect(path, timeout=0)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        start = time.monotonic()
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            _journal(path)
        assert time.monotonic() - start < 30
    finally:
        holder.rollback()
        holder.close()
    assert path.exists() and not list(tmp_path.glob("*.unreadable-*"))  # nothing moved


def test_another_schema_version_is_refused_by_name(tmp_path):
    path = tmp_path / "j.sqlite"
    _journal(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with pytest.raises(sqlite3.DatabaseError, match="schema 99"):
        _journal(path)
    with pytest.raises(JournalError, match="schema 99"):
        JournalReader(path)


def test_earlier_runs_episodes_keep_their_own_keys_and_acknowledgements(tmp_path):
    path = tmp_path / "j.sqlite"
    first = _journal(path)
    book = AlertBook(lambda r: None, changed=first.alert)
    book.fire("ownership_violation", "critical", "run 1", subject="decode-0")
    first.close()
    second = _journal(path)
    with JournalReader(path) as reader:
        earlier = reader.alerts(runs=[first.run])
    book = AlertBook(lambda r: None, changed=lambda r: None)
    book.add_previous(earlier)
    book.fire("ownership_violation", "critical", "run 2", subject="decode-0")
    keys = [r["key"] for r in book.records()]
    assert len(set(keys)) == 2 and f"{first.run}/ownership_violation:decode-0#1" in keys
    assert book.acknowledge([f"{first.run}/ownership_violation:decode-0#1"])
    old, new = book.records()
    assert old["acked"] and not new["acked"]
    second.close()


def test_a_hostile_journal_is_refused_or_read_within_bounds(tmp_path):
    path = tmp_path / "hostile.sqlite"
    _journal(path).close()
    conn = sqlite3.connect(path)
    conn.execute("CREATE VIEW forever AS WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
                 "SELECT x FROM n")
    conn.commit()
    conn.close()
    done = subprocess.run([sys.executable, "main.py", "evidence", "--journal", str(path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "view forever" in done.stderr

    deep = tmp_path / "deep.sqlite"
    journal = _journal(deep)
    journal.close()
    conn = sqlite3.connect(deep)
    conn.execute("INSERT INTO alerts (run, key, record, first_seen, last_seen) VALUES ('r', 'k', ?, 0, 0)",
                 ("[" * 100_000,))
    conn.execute("INSERT INTO crossings (run, second, source_slot, reader_slot, first, last, reads, pages) "
                 "VALUES ('r', 1, 1, 2, NULL, 'x', 3, '[[\"p\", 0, 99999999999]]')")
    conn.commit()
    conn.close()
    done = subprocess.run([sys.executable, "main.py", "evidence", "--journal", str(deep), "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr  # the damaged rows are skipped, nothing crossed is claimed


def test_auto_names_one_journal_per_engine_that_a_restart_finds_again(tmp_path, monkeypatch):
    from engine.server.evidence_feed import journal_path

    monkeypatch.setenv("PAGEWARDEN_STATE_DIR", str(tmp_path))
    fixed = journal_path("auto", "tcp://127.0.0.1:5650", "/etc/pw/a.toml")
    assert fixed == tmp_path / "engine-tcp-127-0-0-1-5650.sqlite"
    assert journal_path("auto", "tcp://127.0.0.1:5650", "/etc/pw/b.toml") == fixed  # the endpoint names it
    hosted = journal_path("auto", "tcp://127.0.0.1:0", "/etc/pw/a.toml")  # a random port: the config names it
    assert hosted == journal_path("auto", "tcp://127.0.0.1:0", "/etc/pw/a.toml") != fixed
    assert hosted != journal_path("auto", "tcp://127.0.0.1:0", "/etc/pw/b.toml")
    assert journal_path("", "tcp://127.0.0.1:5650", "x") is None
    assert journal_path("~/j.sqlite", "tcp://127.0.0.1:0", "x").name == "j.sqlite"
