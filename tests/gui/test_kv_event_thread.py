"""KV-event mode: the watcher's sockets live on one thread of their own, never the GUI's
(issue 13, part 4); the state it writes is read under a lock."""

from __future__ import annotations

import threading

from engine.adapters.kv_event_watch import KvEventWatcher
from gui.model.shared_kv_state import SharedKvEventState
from tests.gui.test_kv_event_attach import (  # noqa: F401 - fixtures
    GPU0,
    attach,
    chain,
    publishers,
    result,
    stored,
    wait_blocks,
    window,
)


def test_the_watcher_is_polled_and_closed_on_one_thread_that_is_not_the_gui(qtbot, window, publishers,  # noqa: F811
                                                                              monkeypatch):
    polled, closed = set(), set()
    poll, close = KvEventWatcher.poll, KvEventWatcher.close

    def recording_poll(self, timeout_ms):
        polled.add(threading.get_ident())
        return poll(self, timeout_ms)

    def recording_close(self):
        closed.add(threading.get_ident())
        return close(self)

    monkeypatch.setattr(KvEventWatcher, "poll", recording_poll)
    monkeypatch.setattr(KvEventWatcher, "close", recording_close)
    pub = publishers()
    attach(qtbot, window, pub)
    result(qtbot, pub.run(lambda p: p.publish([stored(chain(1, 8), None, range(128))])))
    wait_blocks(qtbot, window, GPU0, 8)
    window.leave_kv_events()
    gui = threading.get_ident()
    assert len(polled) == 1 and gui not in polled
    assert closed == polled  # closed where it was polled


def test_a_reader_holding_the_lock_keeps_the_writer_out():
    state = SharedKvEventState()
    with state.lock:
        writer = threading.Thread(target=state.record_duplicate)
        writer.start()
        writer.join(0.2)
        assert writer.is_alive() and state.duplicates == 0
    writer.join(5)
    assert state.duplicates == 1
