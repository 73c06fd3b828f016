"""AlertDetail over an EngineState fed real protocol messages: the runbook of the selected
alert's kind, the tenants in scope, and the scope copied as text and as JSON."""

from __future__ import annotations

import json
import time

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from engine.wire.alert_kinds import BY_NAME
from gui.model.engine_state import EngineState
from gui.widgets.alert_detail import AlertDetail
from tests.gui.test_side_widgets import request, send


def detail_with(kind: str, qtbot) -> tuple[AlertDetail, EngineState]:
    state = EngineState()
    send(state, "alerts", id=f"{kind}:decode-0", kind=kind, severity=BY_NAME[kind].severity, state="firing",
         detail="request r2 read page 4 written by r1 <b>", requests=["r2"], pages=[4], acked=False, time=time.time())
    detail = AlertDetail(state)
    qtbot.addWidget(detail)
    detail.show_alert(state.alerts[f"{kind}:decode-0"])
    return detail, state


def test_the_detail_shows_the_runbook_of_the_selected_alerts_kind(qtbot):
    for kind in ("ownership_violation", "capacity_exceeds_window", "worker_crashed"):
        detail, _ = detail_with(kind, qtbot)
        text = detail.view.toPlainText()
        assert "What to do next" in text
        for step in BY_NAME[kind].runbook:
            assert step in text, (kind, step)
    assert "<b>" in text  # the alert's own text is escaped, not markup


def test_tenants_in_scope_and_the_scope_copied_as_text_and_json(qtbot):
    detail, state = detail_with("ownership_violation", qtbot)
    assert not detail.copy_text_button.isEnabled()  # no scope yet
    send(state, "requests", **request("r9", 9))  # tenant t0, known to the window only
    now = time.time()
    detail.show_scope([
        {"reader": "r2", "reader_slot": 2, "source": "r1", "source_slot": 1, "pages": [["decode-0", 4]],
         "first": now - 3, "last": now - 2, "reads": 5, "reader_tenant": "globex", "source_tenant": "acme"},
        {"reader": "r9", "reader_slot": 9, "source": None, "source_slot": 7, "pages": [["decode-0", 8]],
         "first": now - 1, "last": now, "reads": 1},
    ])
    text = detail.view.toPlainText()
    assert "Tenants in scope" in text
    assert "tenant globex received tenant acme's data" in text
    assert "tenant t0 received data of a request of no known tenant" in text
    assert text.index("What to do next") < text.index("Tenants in scope")

    assert detail.copy_text_button.isEnabled() and detail.copy_json_button.isEnabled()
    qtbot.mouseClick(detail.copy_text_button, Qt.LeftButton)
    copied = QApplication.clipboard().text()
    assert copied.startswith("Incident scope of alert ownership_violation:decode-0")
    lines = copied.splitlines()
    assert lines[1].startswith("tenant globex received tenant acme's data: 1 request pair(s)")
    assert "r2 received data of r1 (pages decode-0:4; 5 read(s)" in lines[1]
    assert "r9 received data of an unknown request (slot 7)" in lines[2]

    qtbot.mouseClick(detail.copy_json_button, Qt.LeftButton)
    doc = json.loads(QApplication.clipboard().text())
    assert doc["alert"]["id"] == "ownership_violation:decode-0" and doc["alert"]["kind"] == "ownership_violation"
    assert [(t["reader_tenant"], t["writer_tenant"]) for t in doc["tenant_pairs"]] == [("globex", "acme"), ("t0", None)]
    assert [p["reader"] for p in doc["pairs"]] == ["r2", "r9"] and doc["tenant_pairs"][0]["pairs"][0]["source"] == "r1"


def test_no_scope_to_copy_without_an_alert(qtbot):
    detail = AlertDetail(EngineState())
    qtbot.addWidget(detail)
    assert not detail.copy_json_button.isEnabled() and detail.copy_scope("json") == ""
    assert "Select an alert" in detail.view.toPlainText()
