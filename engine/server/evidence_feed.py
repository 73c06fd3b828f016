"""EvidenceFeed: what the supervisor hands to the evidence journal, and what it reads back.

Everything here runs on the supervisor's loop and only queues (engine/evidence/journal.py
writes on its own thread); reads of the journal for clients (an earlier run's scope) run on a
reader thread of their own and are answered when done. At start it reads the previous runs'
alert episodes back, so a restart shows them, marked `previous_run`.
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import numpy.typing as npt

    from engine.errors import InvalidRequest
    from engine.evidence.journal import Journal
    from engine.server.request_book import RequestBook
    from engine.server.supervisor import Supervisor

    # answer(pairs) with the affected pairs, or answer(error) when the journal could not say
    Answer = Callable[[list[dict[str, Any]] | InvalidRequest], None]
    Query = tuple[float | None, float | None, list[str] | None, Answer]  # since, until, runs (None: all)

FLUSH_S = 0.25  # crossings and alert changes are queued this often
KEYFRAME_QUIET_S = 10.0  # a crossing after this long without one starts a wave: keyframe the pools
KEYFRAME_EVERY_S = 300.0  # and at most this often (a flapping leak must not fill the disk with maps)
PREVIOUS_ALERTS = 500  # earlier runs' episodes shown at most (the newest; the journal keeps all, and says so)


def journal_path(setting: str, asked_bind: str, config_source: str) -> Path | None:
    """Where `[audit] journal` puts the file (None: off). "auto": one file per engine under the
    state directory, named by the control endpoint it was asked to bind, so a restart finds it;
    an engine on a random port (port 0: the app's hosted engine, tests) is named by its config
    file instead."""
    if not setting:
        return None
    if setting != "auto":
        return Path(setting).expanduser()
    base: str | Path | None = os.environ.get("PAGEWARDEN_STATE_DIR")
    if not base:
        xdg = os.environ.get("XDG_STATE_HOME")
        base = Path(xdg) / "pagewarden" if xdg else Path.home() / ".local" / "state" / "pagewarden"
    if asked_bind.endswith(":0"):
        source = str(Path(config_source).resolve()) if config_source and not config_source.startswith("<") \
            else config_source
        digest = hashlib.sha256(source.encode()).hexdigest()[:10]
        name = f"config-{re.sub(r'[^A-Za-z0-9]+', '-', Path(source).stem).strip('-')[:40]}-{digest}"
    else:
        name = re.sub(r"[^A-Za-z0-9]+", "-", asked_bind).strip("-") or "engine"
    return Path(base) / f"engine-{name}.sqlite"


class EvidenceFeed:
    def __init__(self, sup: Supervisor, path: Path | None, *, run_info: dict[str, Any]) -> None:
        from engine.evidence.journal import Journal

        self.sup = sup
        self.journal: Journal | None = None
        self.open_error: str | None = None  # the journal could not be opened at all
        self.read_error: str | None = None  # an earlier run's evidence could not be read back
        self.previous: dict[str, Any] | None = None  # the run before this one: when, and what it left
        self._last_flush = 0.0
        self._last_crossing = 0.0
        self._last_keyframe = -KEYFRAME_EVERY_S
        self._keyframes_skipped = 0
        self._dirty_alerts: dict[tuple[str | None, str | None], dict[str, Any]] = {}  # (run, key) -> its newest record
        self._signatures: dict[str, object] = {}
        self._seen_dropped = 0
        self._seen_lost = 0
        self._failing = False
        self._queries: queue.Queue[Query | None] = queue.Queue(maxsize=16)  # None: the reader thread ends
        self._answers: queue.Queue[tuple[Answer, list[dict[str, Any]] | InvalidRequest]] = queue.Queue()
        self._reader_thread: threading.Thread | None = None
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

    @property
    def run(self) -> str | None:
        return self.journal.run if self.journal is not None else None

    def _read_previous(self) -> None:
        from engine.evidence.journal_read import JournalError, JournalReader

        journal = cast("Journal", self.journal)  # __init__ calls this once the journal is open
        earlier = [r["run"] for r in journal.previous_runs]
        if not earlier:
            return
        try:
            with JournalReader(journal.path) as reader:
                records = reader.alerts(runs=earlier)
                pairs = reader.scope(runs=earlier[-1:])
        except JournalError as exc:
            self.read_error = f"the previous runs' evidence could not be read back: {exc}"
            return
        self.sup.alerts.add_previous(records[-PREVIOUS_ALERTS:], left_out=max(0, len(records) - PREVIOUS_ALERTS))
        last = journal.previous_runs[-1]
        self.previous = {**last, "alerts": sum(r["run"] == last["run"] for r in records),
                         "pairs": len(pairs), "reads": sum(p["reads"] for p in pairs),
                         "readers": len({p["reader"] for p in pairs})}

    # ---- what the supervisor hands over ------------------------------------------------
    def alert_changed(self, record: dict[str, Any]) -> None:
        """Every change of an alert record (unthrottled): queued at the next flush, newest state."""
        if self.journal is not None:
            self._dirty_alerts[(record.get("run"), record.get("key"))] = record

    def event(self, subject: str, event: str, when: float, fields: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.event(subject, event, when, fields)

    def prompt(self, entry: dict[str, Any]) -> None:
        if self.journal is not None:
            self.journal.prompt(entry)

    def changed(self, what: str, value: list[dict[str, Any]], signature: object) -> None:
        """Journal `value` (the workers' or the capacity findings) when its signature changed."""
        if self.journal is None or self._signatures.get(what) == signature:
            return
        self._signatures[what] = signature
        getattr(self.journal, what)(time.time(), value)

    def keyframe(self, pool: str, arrays: dict[str, npt.NDArray[Any]], reason: str) -> None:
        import numpy as np

        if self.journal is None:
            return
        buffer = io.BytesIO()
        # numpy's stubs take any key for allow_pickle; these are page array names
        np.savez(buffer, **{name: np.asarray(a) for name, a in arrays.items()})  # type: ignore[arg-type]
        self.journal.keyframe(time.time(), str(pool), reason, buffer.getvalue())

    # ---- periodic: crossings, alerts, keyframes, answers, the journal's own health ---------
    def periodic(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.journal is not None and now - self._last_flush >= FLUSH_S:
            self._last_flush = now
            self._flush_alerts()
            self._flush_crossings(now)
        self._deliver()
        self._check_health()

    def _flush_alerts(self) -> None:
        journal = cast("Journal", self.journal)  # called only when there is one
        for (run, _), record in self._dirty_alerts.items():
            if record.get("previous_run"):  # an acknowledgement of an earlier run's episode: under its own key
                journal.alert({k: v for k, v in record.items() if k not in ("previous_run", "journal_key")}
                              | {"key": record["journal_key"]}, run)
            else:
                journal.alert(dict(record))
        self._dirty_alerts.clear()

    def _flush_crossings(self, now: float) -> None:
        changed = self.sup.reads.take_dirty()
        if not changed:
            return
        book = self.sup.book
        journal = cast("Journal", self.journal)  # periodic() flushes only when there is one
        for (second, source_slot, reader_slot), bucket in changed:
            journal.crossing((second, source_slot, reader_slot, bucket.source, bucket.reader,
                              _tenant(book, bucket.source), _tenant(book, bucket.reader),
                              bucket.first, bucket.last, bucket.reads, sorted(bucket.pages)))
        newest = max(bucket.last for _, bucket in changed)
        if newest - self._last_crossing > KEYFRAME_QUIET_S:
            if now - self._last_keyframe >= KEYFRAME_EVERY_S:
                self._last_keyframe = now
                self.sup.ask_keyframes("first_crossing")
            else:
                self._keyframes_skipped += 1
        self._last_crossing = max(self._last_crossing, newest)

    def _check_health(self) -> None:
        sup, journal = self.sup, self.journal
        error = self.open_error or self.read_error
        if journal is not None:
            error = journal.error or (None if journal.alive else "the journal's writer thread stopped") or error
        if error and not self._failing:
            self._failing = True
            sup.alert("journal_failing", "error", f"{error}; serving goes on, but what is not written is lost on "
                      f"a restart", subject="write", condition=True)
        elif not error and self._failing:
            self._failing = False
            sup.alerts.resolve("journal_failing", "write")
        if journal is None:
            return
        if journal.dropped > self._seen_dropped:
            self._seen_dropped = journal.dropped
            sup.alert("journal_failing", "error", f"the evidence journal's queue was full: {journal.dropped:,} "
                      f"records were dropped unwritten (the writer fell behind)", subject="dropped",
                      dropped=journal.dropped)
        if journal.lost > self._seen_lost and journal.item_error and not journal.error:
            self._seen_lost = journal.lost
            sup.alert("journal_failing", "error", f"{journal.item_error}; {journal.lost:,} records lost in all",
                      subject="record", lost=journal.lost)

    # ---- reads for clients, off the loop ------------------------------------------------
    def scope(self, since: float | None, until: float | None, run: str, answer: Answer) -> None:
        """An earlier run's (or every run's: "all") affected pairs, read from the journal on the
        reader thread; answer(pairs) or answer(error: InvalidRequest) is called on the loop.
        Raises InvalidRequest at once when there is no journal, no such run, or too many reads
        are waiting."""
        from engine.errors import InvalidRequest

        if self.journal is None:
            raise InvalidRequest(f"no evidence journal: the scope of run {run!r} is not kept ([audit] journal)")
        known = [r["run"] for r in self.journal.previous_runs] + [self.journal.run]
        if run != "all" and run not in known:
            raise InvalidRequest(f"run {run!r} is not in the journal; runs: {', '.join(known[-20:])}")
        self._ensure_reader()
        try:
            self._queries.put_nowait((since, until, None if run == "all" else [run], answer))
        except queue.Full:
            raise InvalidRequest(f"{self._queries.maxsize} journal reads are waiting already; ask again shortly") \
                from None

    def _ensure_reader(self) -> None:
        if self._reader_thread is None or not self._reader_thread.is_alive():
            self._reader_thread = threading.Thread(target=self._read_loop, name="evidence-reader", daemon=True)
            self._reader_thread.start()

    def _read_loop(self) -> None:
        from engine.errors import InvalidRequest
        from engine.evidence.journal_read import JournalError, JournalReader

        while True:
            job = self._queries.get()
            if job is None:
                return
            since, until, runs, answer = job
            try:
                # scope() starts this thread only when there is a journal
                with JournalReader(cast("Journal", self.journal).path) as reader:
                    result = reader.scope(since, until, runs)
            except JournalError as exc:
                result = InvalidRequest(str(exc))
            except Exception as exc:  # a damaged row: the client hears why; the reader goes on
                result = InvalidRequest(f"the journal could not be read: {type(exc).__name__}: {exc}")
            self._answers.put((answer, result))

    def _deliver(self) -> None:
        while True:
            try:
                answer, result = self._answers.get_nowait()
            except queue.Empty:
                return
            answer(result)

    def keyframes(self, since: float | None) -> tuple[list[dict[str, Any]], int]:
        """This run's first page-map keyframes since `since` (FIRST_KEYFRAMES of them), arrays as
        lists (for `history`), and how many more there were."""
        if self.journal is None:
            return [], 0
        from engine.evidence.journal_read import JournalError
        from engine.evidence.journal_source import FIRST_KEYFRAMES, JournalSource

        try:
            with JournalSource(self.journal.path, run=self.journal.run) as source:
                frames = source.keyframes(since, first=FIRST_KEYFRAMES)
                return frames, max(0, source.count_keyframes(since) - len(frames))
        except JournalError:
            return [], 0

    def describe(self) -> dict[str, Any]:
        counts = {"alerts": self.sup.alerts.counts(), "keyframes_skipped": self._keyframes_skipped}
        if self.journal is None:
            return {"journal": None, "run": None, "error": self.open_error, "previous_run": None, **counts}
        return {**self.journal.describe(), "error": self.journal.error or self.read_error,
                "previous_run": self.previous, **counts}

    def close(self) -> None:
        if self._reader_thread is not None:
            try:
                self._queries.put_nowait(None)
            except queue.Full:
                pass
        if self.journal is not None:
            self._flush_alerts()
            self.journal.close()


def _tenant(book: RequestBook, request_id: str | None) -> str | None:
    rec = book.get(request_id) if request_id else None
    return rec.tenant if rec is not None else None
