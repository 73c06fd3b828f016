"""The evidence survives a SIGKILL of the supervisor mid-incident and a restart on the same
journal; a torn WAL tail or a damaged file is said and the rest kept (real server, loopback)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from engine.config import REPO_ROOT
from engine.evidence.journal_read import JournalReader
from tests.engine.evidence.incident_run import incident_config, pair_key, start, submit_wave

pytestmark = pytest.mark.e2e

BOUND_S = 1.0  # what a crash may lose: the last second


@pytest.fixture
def started():
    """started(config) -> a ready server on the incident's config; every one is stopped after."""
    servers = []

    def run(config):
        servers.append(start(config))
        return servers[-1]

    yield run
    for server in servers:
        server.stop()


def _contains(journal: dict, live: list[dict]) -> bool:
    """Every pair of a live scope answer is in the journal with at least its reads."""
    return all(pair_key(p) in journal and journal[pair_key(p)]["reads"] >= p["reads"] for p in live)


def test_sigkill_mid_wave_loses_at_most_the_last_second_and_a_restart_shows_it(tmp_path, started):
    journal = tmp_path / "evidence.sqlite"
    config = incident_config(tmp_path, journal)
    server = started(config)
    client = server.client(timeout_s=60)
    submit_wave(client, seed=11, scale=2.0)
    answers = []  # (time the answer came back, its pairs)
    crossing_since = None
    deadline = time.monotonic() + 240
    while True:
        pairs = client.call("scope")["pairs"]
        answers.append((time.time(), pairs))
        running = client.call("status", brief=True)["load"]["running"]
        if pairs and crossing_since is None:
            crossing_since = time.time()
        # mid-wave: data has been crossing for a few seconds and requests are still running
        assert running or crossing_since is None or time.time() - crossing_since < 3 * BOUND_S, \
            "the wave ended before the kill: make it longer"
        if crossing_since is not None and time.time() - crossing_since > 3 * BOUND_S:
            break
        assert time.monotonic() < deadline, "the incident wave never crossed data"
        time.sleep(0.05)
    server.kill()
    killed_at = time.time()
    with JournalReader(journal) as reader:
        kept = {pair_key(p): p for p in reader.scope()}
        (run,) = reader.runs()
    assert not run["clean"] and run["ended"] is None
    # the newest live answer the journal holds whole: everything older than it survived
    held = [t for t, pairs in answers if _contains(kept, pairs)]
    assert held, "the journal holds none of the live answers"
    lost_s = killed_at - max(held)
    older = [pairs for t, pairs in answers if t <= killed_at - BOUND_S]
    assert older and older[-1], "no data had crossed a second before the kill: the test proves nothing"
    assert _contains(kept, older[-1]), f"the journal lost more than {BOUND_S} s before the kill"
    print(f"\nSIGKILL mid-wave: the journal held every live answer up to {lost_s:.3f} s before the kill "
          f"({len(kept)} pairs, {sum(p['reads'] for p in kept.values()):,} reads kept)")

    # the same journal after a restart: the previous run's evidence, marked as such
    server = started(config)
    status = server.client().status()
    previous = status["evidence"]["previous_run"]
    assert previous["run"] == run["run"] and previous["clean"] is False
    assert previous["pairs"] == len(kept) and previous["reads"] == sum(p["reads"] for p in kept.values())
    old = [a for a in status["alerts"] if a.get("previous_run")]
    assert any(a["kind"] == "ownership_violation" for a in old) or any(
        a["kind"] == "admission_rejected" for a in old), [a["key"] for a in old]
    assert all(a["run"] == run["run"] for a in old)
    assert not any(a.get("previous_run") for a in status["alerts"] if a.get("run") == status["engine"]["run"])
    server.stop()
    # and the CLI answers "who received whose data" from the journal alone
    done = subprocess.run([sys.executable, "main.py", "evidence", "--journal", str(journal), "--run", run["run"],
                           "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr  # 1: data crossed
    answer = json.loads(done.stdout)
    assert {pair_key(p): p["reads"] for p in answer["pairs"]} == {k: p["reads"] for k, p in kept.items()}
    assert answer["placeholders"] and all(t["reader_tenant"] for t in answer["tenants"])


def test_a_torn_wal_tail_is_said_and_the_rest_kept(tmp_path, started):
    journal = tmp_path / "evidence.sqlite"
    config = incident_config(tmp_path, journal)
    server = started(config)
    client = server.client(timeout_s=60)

    def committed(ids) -> None:  # read from the file itself, as another process would
        deadline = time.monotonic() + 60
        while True:
            with JournalReader(journal) as reader:
                if set(ids) <= {r["request_id"] for r in reader.history()["requests"]}:
                    return
            assert time.monotonic() < deadline, f"{ids} never reached the journal"
            time.sleep(0.1)

    for i in range(4):
        client.generate([256, 1, 2, 3], max_new_tokens=2, ignore_eos=True, tenant="acme", request_id=f"kept-{i}")
    committed([f"kept-{i}" for i in range(4)])
    # one more transaction after them: the torn frame below belongs to it (or to a later one)
    client.generate([256, 1, 2, 3], max_new_tokens=2, ignore_eos=True, tenant="acme", request_id="kept-4")
    committed(["kept-4"])
    server.kill()
    wal = journal.with_name(journal.name + "-wal")
    assert wal.exists() and wal.stat().st_size > 4096
    with wal.open("r+b") as f:  # the machine died mid-write: the last frame is half there
        f.truncate(wal.stat().st_size - 1000)
    server = started(config)
    evidence = server.client().status()["evidence"]
    assert evidence["recovered"]["torn_wal_bytes"] > 0, evidence["recovered"]
    assert "partial write" in evidence["recovered"]["message"]
    server.stop()
    with JournalReader(journal) as reader:
        requests = {r["request_id"] for r in reader.history()["requests"]}
        assert {f"kept-{i}" for i in range(4)} <= requests  # what was committed before the torn frame


def test_a_damaged_journal_is_moved_aside_and_what_can_be_read_is_kept(tmp_path, started):
    journal = tmp_path / "evidence.sqlite"
    config = incident_config(tmp_path, journal)
    server = started(config)
    client = server.client(timeout_s=60)
    for i in range(40):
        client.generate([256, 1, 2, 3], max_new_tokens=2, ignore_eos=True, tenant="acme", request_id=f"early-{i}")
    server.stop()  # a clean stop: the WAL is folded into the file
    size = journal.stat().st_size
    with journal.open("r+b") as f:  # the disk returned garbage for the file's last pages
        f.seek(size - 8192)
        f.write(b"\xde\xad\xbe\xef" * 2048)
    server = started(config)
    status = server.client().status()
    recovered = status["evidence"]["recovered"]
    assert recovered and recovered["moved_to"] and "could not be read whole" in recovered["message"]
    assert sum(recovered["kept_rows"].values()) > 0
    assert status["engine"]["run"]  # serving a new run on a fresh file
    assert server.client().generate([256, 1, 2], max_new_tokens=2, ignore_eos=True)["token_ids"]
    server.stop()
    from pathlib import Path

    assert Path(recovered["moved_to"]).exists()  # the damaged file is kept, never deleted
    with JournalReader(journal) as reader:
        assert len(reader.runs()) == 2  # the salvaged run and the new one


def test_scope_of_an_earlier_run_comes_from_the_journal(tmp_path, started):
    from tests.engine.evidence.incident_run import wait_ends

    journal = tmp_path / "evidence.sqlite"
    config = incident_config(tmp_path, journal)
    server = started(config)
    client = server.client(timeout_s=120)
    wait_ends(client, submit_wave(client, seed=3))
    time.sleep(1.0)
    live = client.call("scope")["pairs"]
    first_run = client.status()["engine"]["run"]
    server.stop()
    server = started(config)
    client = server.client()
    assert client.call("scope")["pairs"] == []  # this run: nothing crossed yet
    earlier = client.call("scope", run=first_run)["pairs"]
    assert live and {pair_key(p): p["reads"] for p in earlier} == {pair_key(p): p["reads"] for p in live}
    from engine.client import RemoteError

    with pytest.raises(RemoteError, match="not in the journal"):
        client.call("scope", run="no-such-run")
