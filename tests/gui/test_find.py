"""Find a request or tenant across the maps and tables (issue 15, "Find")."""

from __future__ import annotations

import numpy as np

from engine.wire.page_tags import NO_WRITER, PageState, pack_tag
from engine.wire.protocol import Message
from gui.model.engine_state import EngineState
from gui.model.find import Find


def test_find_queries():
    assert Find("").matches("r1", "acme") and not Find("  ").active
    assert Find("ACM").matches("r1", "acme") and Find("r1").matches("r12", "x")
    assert Find("tenant:acme").matches("r1", "acme") and not Find("tenant:acm").matches("r1", "acme")
    assert Find("request:r1").matches("r1", None) and not Find("request:r1").matches("r12", None)
    assert not Find("globex").matches("r1", "acme") and not Find("x").matches(None, None)


def request(rid: str, slot: int, tenant: str, phase: str = "decoding") -> Message:
    return Message({"topic": "requests", "request_id": rid, "slot": slot, "tenant": tenant, "phase": phase,
                    "prompt_len": 10, "time": 1.0})


def test_find_across_the_window(start_server, open_window, qtbot):
    """A real window: the tables show only matches, the maps veil the other pages (a page
    matches by its owner or by its writer: whose data it holds), and the find box (Ctrl+F)
    drives it."""
    server = start_server()
    window = open_window(server.control)
    client = server.client(timeout_s=120)
    for i, tenant in enumerate(["acme", "globex", "acme"]):
        client.generate([5, 6, 7, 8] * 8, max_new_tokens=4, request_id=f"find-{i}", tenant=tenant)
    qtbot.waitUntil(lambda: all(f"find-{i}" in window.state.requests for i in range(3)), timeout=20_000)
    window.requests_table.filter.setCurrentIndex(1)  # All: finished ones too
    window.refresh()

    window.find_box.setText("tenant:acme")
    window.refresh()
    shown = [r.request_id for r in window.requests_table.model.rows]
    assert sorted(r for r in shown if r.startswith("find-")) == ["find-0", "find-2"] and all(
        window.state.requests[r].tenant == "acme" for r in shown)
    assert "match tenant 'acme'" in window.requests_table.count_label.text()

    # the map: pages held by matching requests stay clear, the others are veiled. The
    # requests above are done, so plant pages in the mirror as a live engine would show them.
    pool = next(iter(window.state.pages.pools.values()))
    acme, globex = window.state.requests["find-0"].slot, window.state.requests["find-1"].slot
    pool.arrays["owner"][:5] = [acme, acme, globex, -1, globex]
    pool.arrays["state"][:5] = [PageState.WRITTEN, PageState.WRITTEN, PageState.WRITTEN, PageState.FREE,
                                PageState.WRITTEN]
    # page 4 is globex's, but acme's request wrote what it holds (the data of a leak)
    pool.arrays["writer"][:5] = [pack_tag(acme, 1), pack_tag(acme, 1), pack_tag(globex, 1), NO_WRITER,
                                 pack_tag(acme, 1)]
    pool.note_changes(np.arange(5, dtype=np.int32))
    window.state.events.mark("pages")
    window.refresh()
    view = window.page_map._views[pool.name]
    assert view.found == 3 and view.dim.isVisible()
    veil = view.dim.image.reshape(-1, 4)
    assert list(veil[0]) == [0, 0, 0, 0] and veil[2][3] > 0 and veil[3][3] > 0
    assert list(veil[4]) == [0, 0, 0, 0], "a page holding acme's data must match tenant:acme"
    assert "3 pages match the find" in view.title_text

    window.find_box.clear()
    window.refresh()
    assert view.found is None and not view.dim.isVisible()
    assert len(window.requests_table.model.rows) >= 3


def test_alerts_follow_the_find(qtbot):
    state = EngineState()
    for rid, slot, tenant in [("a1", 1, "acme"), ("g1", 2, "globex")]:
        state.apply(request(rid, slot, tenant))
    state.apply(Message({"topic": "alerts", "id": "x1", "kind": "ownership_violation", "severity": "critical",
                         "state": "firing", "requests": ["g1", "a1"], "first_seen": 1.0, "last_seen": 1.0}))
    state.apply(Message({"topic": "alerts", "id": "x2", "kind": "admission_rejected", "severity": "info",
                         "state": "firing", "requests": ["g1"], "first_seen": 1.0, "last_seen": 1.0}))
    from gui.widgets.alerts_table import AlertsTable

    table = AlertsTable(state)
    qtbot.addWidget(table)
    table.filter.setCurrentIndex(0)
    state.set_find("tenant:acme")
    state.events.flush()
    assert [a.id for a in table.model.rows] == ["x1"]
    state.set_find("")
    state.events.flush()
    assert sorted(a.id for a in table.model.rows) == ["x1", "x2"]
