"""Which requests the requests table marks "with crossed data": the crossings, and the
requests a detector alert names, unless every event of that alert was stopped before any data
crossed (a vLLM transfer the verifying connector refused and vLLM recomputed)."""

from __future__ import annotations

from gui.model.alert_rows import alert_row
from gui.model.rewind import affected_at


def record(**fields) -> dict:
    return {"id": "transfer_mismatch:request:r1", "kind": "transfer_mismatch", "severity": "critical",
            "state": "firing", "time": 10.0, "first_seen": 10.0, "last_seen": 10.0, "requests": ["r1"], **fields}


def test_a_prevented_detector_alert_marks_no_request_and_one_that_let_data_through_does():
    assert affected_at([], [alert_row(record(prevented=True))], None) == {}
    assert affected_at([], [alert_row(record(prevented=False))], None) == {"r1": "named by the transfer_mismatch alert"}
    assert affected_at([], [alert_row(record())], None) == {"r1": "named by the transfer_mismatch alert"}  # not said
