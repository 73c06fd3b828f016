"""WindowSource: the one place that opens and closes what the window shows.

`now` (a Qt-free Source) says what that is and how it is linked; this object holds what
is open to show it: the TransportThread of a live engine (kept running behind a snapshot,
so that Close returns to its session as it was), the KV-event thread, the opened bundle.
Opening a source closes the one before, each thread once; a closed transport's late
signals are dropped here (every slot checks its sender), so they never reach the next
source's state. Each change emits `changed(before, after)`; the window recomputes what
depends on the source there.
"""

from __future__ import annotations

import zmq
from PySide6.QtCore import QObject, Signal

from engine.adapters.kv_attach import KvAttach
from engine.adapters.kv_event_decode import KvEventError
from gui.kv_event_thread import KvEventThread
from gui.model.engine_state import EngineState
from gui.model.shared_kv_state import SharedKvEventState
from gui.model.source import Kind, Link, Source

TRANSPORT_LINKS = {"connecting": Link.CONNECTING, "connected": Link.CONNECTED, "reconnecting": Link.LOST}


class WindowSource(QObject):
    changed = Signal(object, object)  # before, after: Source
    telemetry = Signal(list)  # from the live link (shown, or behind a snapshot)
    status = Signal(dict)
    stream_event = Signal(object)
    unanswered_error = Signal(str, object)  # op, error map: an error answer nobody asked to hear
    kv_failed = Signal(str)  # a KV-event socket error (the watch goes on)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.now = Source()
        self.transport = None  # a TransportThread: the engine shown, or the one behind a snapshot
        self.snapshot = None  # an OpenedSnapshot while one is shown
        self.live_state: EngineState | None = None  # the engine's state while a snapshot is shown over it
        self.kv_attach: KvAttach | None = None
        self.kv_thread: KvEventThread | None = None  # owns the watcher and its sockets
        self.answers: dict[int, object] = {}  # ticket -> on_answer(result, error), for this transport only

    # ---- opening and closing: the only code that starts or stops a source ----------------
    def open_live(self, transport, endpoint: str, *, hosted: bool = False) -> None:
        """Show the engine behind `transport` (a TransportThread, not yet started)."""
        self._close_kv()
        self._close_transport()
        self._drop_snapshot()
        self.transport = transport
        transport.telemetry.connect(self._on_telemetry)
        transport.status.connect(self._on_status)
        transport.reply.connect(self._on_reply)
        transport.stream_event.connect(self._on_stream_event)
        transport.connection.connect(self._on_connection)
        self._set(Source(Kind.LIVE, endpoint, Link.CONNECTING, hosted=hosted))
        transport.start()

    def open_snapshot(self, opened, shown: EngineState) -> None:
        """Show an OpenedSnapshot; a live engine goes on behind it, with `shown` (the state
        the window showed) as its state until the snapshot closes."""
        self._close_kv()
        if self.snapshot is None:
            self.live_state = shown if self.transport is not None else None
        self.snapshot = opened
        self._set(Source(Kind.SNAPSHOT, opened.path.name, Link.READ_ONLY,
                         taken=str(opened.manifest.get("created_utc") or "?"), behind=self.now.listened))

    def close_snapshot(self) -> EngineState | None:
        """Back to the engine behind the snapshot; returns its state (None: no engine, nothing shown)."""
        if self.snapshot is None:
            return None
        live, behind = self.live_state, self.now.behind
        self._drop_snapshot()
        self._set(behind if behind is not None and live is not None else Source())
        return live

    def open_kv_events(self, attach: KvAttach) -> None:
        """Watch `attach`'s endpoints in place of anything else. Raises KvEventError (naming
        the address) when the watcher cannot be made; nothing changes then."""
        try:
            watcher = attach.watcher(SharedKvEventState())
        except zmq.ZMQError as exc:
            raise KvEventError(f"cannot connect to {', '.join(attach.endpoints)}: {exc}") from exc
        self._close_transport()
        self._drop_snapshot()
        self._close_kv()
        self.kv_attach, self.kv_thread = attach, KvEventThread(watcher, self)
        self.kv_thread.failed.connect(self.kv_failed)
        self._set(Source(Kind.KV_EVENTS, ", ".join(attach.endpoints), Link.READ_ONLY))
        self.kv_thread.start()

    def close(self) -> None:
        """Nothing shown any more: every thread stopped, every socket closed."""
        self._close_kv()
        self._close_transport()
        self._drop_snapshot()
        self._set(Source())

    def _close_transport(self) -> None:
        transport, self.transport = self.transport, None
        self.answers.clear()  # its late answers reach nobody (the next one counts tickets from 1 again)
        self.live_state = None
        if transport is not None:
            transport.stop()

    def _close_kv(self) -> None:
        thread, self.kv_thread = self.kv_thread, None
        if thread is not None:
            thread.stop()  # closes the watcher on its own thread

    def _drop_snapshot(self) -> None:
        self.snapshot = None
        self.live_state = None  # only a snapshot keeps a live state aside

    # ---- the link's state ------------------------------------------------------------------
    def set_link(self, words: str) -> None:
        """The transport's word for its link ("connecting", "connected", "reconnecting")."""
        self._set(self.now.with_link(TRANSPORT_LINKS[words]))

    def set_engine_read_only(self, read_only: bool) -> None:
        self._set(self.now.with_engine_read_only(read_only))

    def set_note(self, note: str) -> None:
        """Words the status line says instead of the link's until it changes ("hosted engine starting")."""
        self._set(self.now.with_note(note))

    def _set(self, after: Source) -> None:
        before, self.now = self.now, after
        if after != before:
            self.changed.emit(before, after)

    # ---- commands and what comes back --------------------------------------------------------
    def request(self, op: str, on_answer=None, **fields) -> int | None:
        """Send `op` over the live link (None: there is none); on_answer(result, error) gets
        its answer. The window checks Source.allows first."""
        if self.transport is None:
            return None
        ticket = self.transport.request(op, **fields)
        if on_answer is not None:
            self.answers[ticket] = on_answer
        return ticket

    def _current(self) -> bool:
        return self.transport is not None and self.sender() is self.transport

    def _on_telemetry(self, batch: list) -> None:
        if self._current():
            self.telemetry.emit(batch)

    def _on_status(self, status: dict) -> None:
        if self._current():
            self.status.emit(status)

    def _on_stream_event(self, msg) -> None:
        if self._current():
            self.stream_event.emit(msg)

    def _on_connection(self, words: str) -> None:
        if self._current():
            self.set_link(words)

    def _on_reply(self, ticket: int, op: str, result) -> None:
        """An answer goes to what its request asked for, else (an error) to unanswered_error."""
        if not self._current():
            return
        on_answer = self.answers.pop(ticket, None)
        error = result.get("error") if isinstance(result, dict) else None
        if on_answer is not None:
            on_answer(result, error)
        elif error:
            self.unanswered_error.emit(op, error)
