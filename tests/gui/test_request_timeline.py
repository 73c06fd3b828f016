"""The per-request timeline in the app (issue 15): phases as the engine stamped them."""

from __future__ import annotations

import os

from engine.wire.protocol import Message
from gui.model.engine_state import MAX_TIMELINE, EngineState


def request_msg(phase: str, t: float, **extra) -> Message:
    return Message({"topic": "requests", "request_id": "r1", "slot": 3, "tenant": "acme", "prompt_len": 40,
                    "phase": phase, "time": t, "arrival": 100.0, **extra})


def test_phases_are_stamped_with_the_engine_time():
    state = EngineState()
    for phase, t in [("queued", 100.01), ("reserving", 100.2), ("reserving", 100.25), ("awaiting_prefill", 100.3),
                     ("prefilling", 100.4), ("decoding", 100.9), ("finished", 102.0)]:
        state.apply(Message({**request_msg(phase, t).header, **({"ttft_s": 0.95} if phase == "decoding" else {})}))
    row = state.requests["r1"]
    assert row.timeline == [("queued", 100.0), ("reserving", 100.2), ("awaiting_prefill", 100.3),
                            ("prefilling", 100.4), ("decoding", 100.9), ("finished", 102.0)]
    assert row.first_token_at == 100.95


def test_a_request_seen_late_says_so_and_the_timeline_is_bounded():
    state = EngineState()
    state.apply(request_msg("decoding", 105.0))
    assert state.requests["r1"].timeline == [("arrived", 100.0), ("decoding", 105.0)]
    for i in range(200):
        state.apply(request_msg("decoding" if i % 2 else "prefilling", 106.0 + i))
    timeline = state.requests["r1"].timeline
    assert len(timeline) == MAX_TIMELINE and timeline[0] == ("arrived", 100.0) and timeline[-1][1] == 305.0


def test_the_selected_request_timeline_in_the_window(start_server, open_window, qtbot):
    server = start_server()
    window = open_window(server.control)
    client = server.client(timeout_s=120)
    reply = client.generate([5, 6, 7, 8] * 10, max_new_tokens=8, request_id="timeline-1", tenant="acme")
    assert reply["finish_reason"]
    qtbot.waitUntil(lambda: "timeline-1" in window.state.requests and window.state.requests["timeline-1"].done,
                    timeout=20_000)
    view = window.request_timeline
    assert view.rows() == []
    window.state.select_request("timeline-1")
    window.refresh()
    labels = [label for label, _, _ in view.rows()]
    assert labels[0] == "queued" and labels[-1] == "finished", labels
    assert "prefill + transfer" in labels and "decoding" in labels
    starts = [start for _, start in window.state.requests["timeline-1"].timeline]
    assert starts == sorted(starts)
    assert "timeline-1" in view.header.text() and "first token after" in view.header.text()
    assert "prefill + transfer" in view.table.toPlainText()
    if os.environ.get("TIMELINE_PNG"):  # a picture to look at
        window.find_box.setText("acme")
        window.refresh()
        qtbot.wait(300)
        window.grab().save(os.environ["TIMELINE_PNG"])
