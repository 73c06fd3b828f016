"""EvidenceFeed: what the supervisor hands to the evidence journal, and what it reads back.

Everything here runs on the supervisor's loop and only queues (engine/evidence/journal.py
writes on its own thread). At start it reads the previous runs' alert episodes back, so a
restart shows them, marked `previous_run`.
"""

from __future__ import annotations

import io
import os
import re
import sqlite3
import time
from pathlib import Path

FLUSH_S = 0.25  # crossings changed since the last flush are queued this often
KEYFRAME_QUIET_S = 10.0  # a crossing after this long without one starts a wave: keyframe the pools
PREVIOUS_ALERTS = 2_000  # earlier runs' episodes shown at most (the newest; the journal keeps all)


def journal_path(setting: str, control_endpoint: str) -> Path | None:
    """Where `[audit] journal` puts the file (None: off). "auto": one file per engine, named
    by its control endpoint, under the state directory."""
    if not setting:
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    base = os.environ.get("PAGEWARDEN_STATE_DIR")
    if not base:
        xdg = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg) / "pagewarden" if xdg else Path.home() / ".local" / "state" / "pagewarden"
    name = re.sub(r"[^A-Za-z0-9]+", "-", control_endpoint).strip("-") or "engine"
    return Path(base) / f"engine-{name}.sqlite"


class EvidenceFeed:
    def __init__(self, sup, path: Path | None, *, run_info: dict):
        from engine.evidence.journal import Journal

        self.sup = sup
        self.journal: Journal | None = None
        self.open_error: str | None = None
        self.previous: dict | None = None  # the run before this one: when, and what it left
        self._last_flush = 0.0
        self._last_crossing = 0.0
        self._signatures: dict[str, object] = {}
        self._seen_dropped = 0
        self._failing = False
        if path is None:
            return
        audit = sup.config.audit
        try:
            self.journal = Journal(path, run_info=run_info, max_age_s=audit.journal_max_age_days * 86_400.0,
                                   max_bytes=audit.journal_max_mb << 20)
        except (OSError, sqlite3.Error) as exc:
            self.open_error = f"the evidence journal {path} could not be opened: {exc}"
            return
        sup.reads.track_changes()
        self._read_previous()

    def _read_previous(self) -> None:
        from engine.evidence.journal_read import JournalError, JournalReader

        journal = self.journal
        earlier = [r["run"] for r in journal.previous_runs]
        if not earlier:
            return
        try:
            with JournalReader(journal.path) as reader:
                records = reader.alerts(runs=earlier)[-PREVIOUS_ALERTS:]
                pairs = reader.scope(runs=earlier[-1:])
        except JournalError as exc:
            self.open_error = f"the previous runs' evidence could not be read back: {exc}"
            return
        self.sup.alerts.add_previous(records)
        last = journal.previous_runs[-1]
        self.previous = {**last, "alerts": sum(r["run"] == last["run"] for r in records),
                         "pairs": len(pairs), "reads": sum(p["reads"] for p in pairs),
                         "readers": len({p["reader"] for p in pairs})}

    # ---- what the supervisor hands over ------------------------------------------------
    def alert(self, record: dict) -> None:
        if self.journal is not None and not record.get("previous_run"):
            self.journal.alert(record)

    def event(self, subject: str, event: str, when: float, fields: dict) -> None:
        if self.journal is not None:
            self.journal.event(subject, event, when, fields)

    def prompt(self, entry: dict) -> None:
        if self.journal is not None:
            self.journal.prompt(entry)

    def changed(self, what: str, value, signature) -> None:
        """Journal `value` (the workers' or the capacity findings) when its signature changed."""
        if self.journal is None or self._signatures.get(what) == signature:
            return
        self._signatures[what] = signature
        getattr(self.journal, what)(time.time(), value)

    def keyframe(self, pool: str, arrays: dict, reason: str) -> None:
        import numpy as np

        if self.journal is None:
            return
        buffer = io.BytesIO()
        np.savez(buffer, **{name: np.asarray(a) for name, a in arrays.items()})
        self.journal.keyframe(time.time(), str(pool), reason, buffer.getvalue())

    # ---- periodic: crossings, keyframes, the journal's own health -------------------------
    def periodic(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.journal is not None and now - self._last_flush >= FLUSH_S:
            self._last_flush = now
            self._flush_crossings()
        self._check_health()

    def _flush_crossings(self) -> None:
        changed = self.sup.reads.take_dirty()
        if not changed:
            return
        book = self.sup.book
        for (second, source_slot, reader_slot), bucket in changed:
            self.journal.crossing((second, source_slot, reader_slot, bucket.source, bucket.reader,
                                   _tenant(book, bucket.source), _tenant(book, bucket.reader),
                                   bucket.first, bucket.last, bucket.reads, sorted(bucket.pages)))
        newest = max(bucket.last for _, bucket in changed)
        if newest - self._last_crossing > KEYFRAME_QUIET_S:
            self.sup.ask_keyframes("first_crossing")
        self._last_crossing = max(self._last_crossing, newest)

    def _check_health(self) -> None:
        sup, journal = self.sup, self.journal
        error = self.open_error if journal is None else journal.error
        if error and not self._failing:
            self._failing = True
            sup.alert("journal_failing", "error", f"{error}; serving goes on, but what is not written is lost on "
                      f"a restart", subject="write", condition=True)
        elif not error and self._failing:
            self._failing = False
            sup.alerts.resolve("journal_failing", "write")
        if journal is not None and journal.dropped > self._seen_dropped:
            self._seen_dropped = journal.dropped
            sup.alert("journal_failing", "error", f"the evidence journal's queue was full: {journal.dropped:,} "
                      f"records were dropped unwritten (the writer fell behind)", subject="dropped",
                      dropped=journal.dropped)

    @property
    def run(self) -> str | None:
        return self.journal.run if self.journal is not None else None

    def scope(self, since: float | None, until: float | None, run: str) -> list[dict]:
        """Affected pairs of an earlier run (or of every run: "all") from the journal. Raises
        InvalidRequest when there is no journal or no such run."""
        from engine.errors import InvalidRequest
        from engine.evidence.journal_read import JournalError, JournalReader

        if self.journal is None:
            raise InvalidRequest(f"no evidence journal: the scope of run {run!r} is not kept ([audit] journal)")
        known = [r["run"] for r in self.journal.previous_runs] + [self.journal.run]
        if run != "all" and run not in known:
            raise InvalidRequest(f"run {run!r} is not in the journal; runs: {', '.join(known[-20:])}")
        # (no wait for the writer: for "all", this run's last half second may not be in yet)
        try:
            with JournalReader(self.journal.path) as reader:
                return reader.scope(since, until, None if run == "all" else [run])
        except JournalError as exc:
            raise InvalidRequest(str(exc)) from None

    def keyframes(self, since: float | None) -> list[dict]:
        """This run's page-map keyframes since `since`, arrays as lists (for `history`)."""
        if self.journal is None:
            return []
        from engine.evidence.journal_read import JournalError
        from engine.evidence.journal_source import JournalSource

        try:
            with JournalSource(self.journal.path, run=self.journal.run) as source:
                return source.keyframes(since)
        except JournalError:
            return []

    def describe(self) -> dict:
        if self.journal is None:
            return {"journal": None, "error": self.open_error, "previous_run": None}
        return {**self.journal.describe(), "error": self.journal.error or self.open_error,
                "previous_run": self.previous}

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()


def _tenant(book, request_id) -> str | None:
    rec = book.get(request_id) if request_id else None
    return rec.tenant if rec is not None else None
