"""The journal writer and reader on a real SQLite file: what is written reads back whole, a full
queue drops and counts, pruning is oldest first and recorded, a later episode never overwrites."""

from __future__ import annotations

import json
import sqlite3
import time

import pytest

from engine.evidence.journal import Journal
from engine.evidence.journal_read import JournalError, JournalReader
from engine.server.alerts import AlertBook


def _journal(path, **kw) -> Journal:
    return Journal(path, run_info={"control": "tcp://127.0.0.1:1", "host": "h"},
                   max_age_s=kw.pop("max_age_s", 86_400.0), max_bytes=kw.pop("max_bytes", 1 << 30), **kw)


def test_what_is_written_reads_back_in_the_control_ops_shapes(tmp_path):
    journal = _journal(tmp_path / "j.sqlite")
    now = time.time()
    journal.event("r1", "admitted", now, {"slot": 1, "tenant": "acme", "prompt_len": 9, "prompt_hash": "ab"})
    journal.event("r1", "finished", now + 1, {"reason": "length", "tokens": 4})
    journal.event("r2", "rejected", now + 2, {"code": "admission_rejected", "message": "too long"})
    journal.event("r3", "admitted", now + 2, {"slot": 3, "tenant": "globex"})
    journal.event("r3", "placeholder", now + 2, {"message": "too long"})
    journal.event("worker:decode-0", "crashed", now + 3, {"pid": 7})
    journal.crossing((int(now), 1, 3, "r1", "r3", "acme", "globex", now, now + 0.5, 10, [["decode-0", 4]]))
    journal.crossing((int(now) + 1, 1, 3, "r1", "r3", "acme", "globex", now + 1, now + 1.2, 5,
                      [["decode-0", 4], ["decode-0", 5]]))
    journal.prompt({"request_id": "r1", "time": now, "tenant": "acme", "prompt_len": 9, "prompt_hash": "ab"})
    journal.close()
    with JournalReader(tmp_path / "j.sqlite") as reader:
        (run,) = reader.runs()
        assert run["clean"] and run["control"] == "tcp://127.0.0.1:1"
        (pair,) = reader.scope()
        assert (pair["source"], pair["reader"], pair["reads"], pair["source_tenant"], pair["reader_tenant"]) == (
            "r1", "r3", 15, "acme", "globex")
        assert pair["pages"] == [["decode-0", 4], ["decode-0", 5]]
        assert reader.scope(since=now + 5) == []
        history = reader.history()
        requests = {r["request_id"]: r for r in history["requests"]}
        assert requests["r1"]["phase"] == "finished" and requests["r1"]["tenant"] == "acme"
        assert requests["r2"]["phase"] == "rejected"
        assert requests["r3"].get("placeholder") and requests["r3"]["phase"] == "unfinished"
        assert [e["subject"] for e in history["engine_events"]] == ["worker:decode-0"]
        assert reader.prompt_log()[0]["prompt_hash"] == "ab"


def test_a_later_episode_is_another_record_and_both_are_journaled(tmp_path):
    journal = _journal(tmp_path / "j.sqlite")
    book = AlertBook(journal.alert)
    book.fire("ownership_violation", "critical", "wave 1", subject="decode-0", requests=["r1", "r2"], pages=[1])
    for i in range(1139):
        book.fire("ownership_violation", "critical", "wave 1", subject="decode-0", requests=[f"w1-{i}"], pages=[i])
    book.flush(time.time() + 5)
    book.expire(time.time() + 3600)  # quiet: the first episode resolves
    book.fire("ownership_violation", "critical", "wave 3", subject="decode-0", requests=["r9"], pages=[9])
    first, second = [r for r in book.records() if r["id"] == "ownership_violation:decode-0"]
    assert (first["episode"], first["count"], first["state"]) == (1, 1140, "resolved")
    assert (second["episode"], second["count"], second["state"]) == (2, 1, "firing")
    assert first["requests_total"] == 1141 and len(first["requests"]) == 50  # the list is cut, the total says so
    assert first["pages_total"] == 1139
    journal.close()
    with JournalReader(tmp_path / "j.sqlite") as reader:
        episodes = {a["key"]: a for a in reader.alerts()}
    assert set(episodes) == {"ownership_violation:decode-0#1", "ownership_violation:decode-0#2"}
    assert episodes["ownership_violation:decode-0#1"]["count"] == 1140
    assert episodes["ownership_violation:decode-0#1"]["state"] == "resolved"


def test_acknowledging_an_earlier_episode_by_key():
    book = AlertBook(lambda r: None)
    book.fire("worker_crashed", "critical", "one", subject="decode-0", condition=True)
    book.resolve("worker_crashed", "decode-0")
    book.fire("worker_crashed", "critical", "two", subject="decode-0", condition=True)
    assert book.acknowledge(["worker_crashed:decode-0#1"]) == ["worker_crashed:decode-0#1"]
    first, second = [r for r in book.records() if r["kind"] == "worker_crashed"]
    assert first["acked"] and not second["acked"]


def test_a_full_queue_drops_and_counts_and_serving_never_waits(tmp_path):
    journal = _journal(tmp_path / "j.sqlite", queue_items=10)
    lock = sqlite3.connect(tmp_path / "j.sqlite", timeout=0)
    lock.execute("BEGIN EXCLUSIVE")  # another process holds the file: the writer waits for it
    journal.event("first", "admitted", time.time(), {})
    time.sleep(0.5)  # the writer took "first" and now waits on the lock
    start = time.perf_counter()
    for i in range(100):
        journal.event(f"r{i}", "admitted", time.time(), {})
    assert time.perf_counter() - start < 1.0  # never waits for the writer (generous; not a speed test)
    lock.rollback()
    lock.close()
    journal.close()
    assert journal.dropped >= 100 - 10 and journal.written + journal.dropped + journal.lost == 1 + 100 + 1
    assert journal.describe()["dropped"] == journal.dropped


def test_pruned_by_age_oldest_first_and_the_prune_recorded(tmp_path):
    journal = _journal(tmp_path / "j.sqlite", max_age_s=3600.0)
    now = time.time()
    for i in range(10):
        journal.event(f"old-{i}", "admitted", now - 7200 - i, {})
        journal.event(f"new-{i}", "admitted", now - 60, {})
    assert journal.prune_now(now) == 10
    journal.close()
    with JournalReader(tmp_path / "j.sqlite") as reader:
        subjects = {r["request_id"] for r in reader.history()["requests"]}
        (prune,) = reader.prunes()
    assert subjects == {f"new-{i}" for i in range(10)}
    assert prune["rows"] == 10 and "max_age_s" in prune["reason"]


def test_pruned_by_size_keeps_the_newest(tmp_path):
    journal = _journal(tmp_path / "j.sqlite", max_bytes=256 << 10)
    now = time.time()
    for i in range(4000):
        journal.event(f"r{i}", "admitted", now - 4000 + i, {"pad": "x" * 200})
    assert journal.prune_now(now) > 0
    journal.close()
    with JournalReader(tmp_path / "j.sqlite") as reader:
        kept = [int(r["request_id"][1:]) for r in reader.history()["requests"]]
        prunes = reader.prunes()
    assert kept and max(kept) == 3999 and min(kept) > 0  # the oldest went first
    assert prunes and all("max_bytes" in p["reason"] for p in prunes)


def test_long_fields_are_cut_inside_the_record_and_say_how_much(tmp_path):
    journal = _journal(tmp_path / "j.sqlite")
    journal.event("worker:decode-0", "crashed", time.time(), {"log_tail": "x" * (1 << 20) + "THE END"})
    book = AlertBook(journal.alert)
    book.fire("worker_crashed", "critical", "killed", subject="decode-0", condition=True,
              log_tail="y" * (1 << 20))
    now = time.time()
    journal.crossing((int(now), 1, 2, "r1", "r2", "a", "b", now, now, 4096,
                      [["decode-0", p] for p in range(4096)]))
    journal.close()
    conn = sqlite3.connect(tmp_path / "j.sqlite")
    (fields,) = conn.execute("SELECT fields FROM events").fetchone()
    fields = json.loads(fields)
    assert fields["log_tail"].endswith("THE END") and fields["log_tail_cut_chars"] == (1 << 20) + 7
    with JournalReader(tmp_path / "j.sqlite") as reader:
        (alert,) = reader.alerts()
        (pair,) = reader.scope()
    assert (alert["key"], alert["kind"], alert["state"]) == ("worker_crashed:decode-0#1", "worker_crashed", "firing")
    assert alert["log_tail_cut_chars"] == 1 << 20
    assert len(pair["pages"]) == 4096  # stored as one range, read back whole


def test_a_record_the_writer_cannot_encode_is_lost_alone_and_the_writer_goes_on(tmp_path):
    journal = _journal(tmp_path / "j.sqlite")

    class Hostile:
        def __str__(self):
            raise RuntimeError("no")

    journal.event("engine", "reconfigure_requested", time.time(), {"changes": {b"model": 1}})  # bytes keys
    journal.event("engine", "odd", time.time(), {"value": Hostile()})
    journal.event("r1", "admitted", time.time(), {"slot": 1})
    assert journal.sync(10)
    assert journal.alive and journal.lost == 1 and "odd" not in (journal.error or "")
    assert "RuntimeError" in journal.item_error
    journal.close()
    with JournalReader(tmp_path / "j.sqlite") as reader:
        events = [(e["subject"], e["event"]) for e in reader.events()]
    assert ("engine", "reconfigure_requested") in events and ("r1", "admitted") in events


def test_a_file_that_is_not_a_journal_is_named(tmp_path):
    bad = tmp_path / "j.sqlite"
    bad.write_bytes(b"not a database" * 100)
    with pytest.raises(JournalError, match="j.sqlite"):
        JournalReader(bad)
    with pytest.raises(JournalError, match="no evidence journal"):
        JournalReader(tmp_path / "missing.sqlite")


def test_an_episode_with_one_leak_stays_not_prevented():
    book = AlertBook(lambda r: None)
    book.fire("ownership_violation", "critical", "leaked", subject="decode-0", prevented=False)
    book.fire("ownership_violation", "critical", "masked", subject="decode-0", prevented=True)
    (record,) = book.records()
    assert record["prevented"] is False
    assert record["prevented_counts"] == {"prevented": 1, "not_prevented": 1}
