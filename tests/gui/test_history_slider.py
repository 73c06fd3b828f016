"""The history slider (issue 15): the incident's pages are gone from the live map within
seconds of the leak; the slider shows them as they were, with the requests of that time."""

from __future__ import annotations

import os
import random
import threading

import numpy as np

from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections
from engine.wire.page_tags import PageState


def held(pools) -> int:
    return sum(int(np.count_nonzero(p.arrays["state"] != PageState.FREE)) for p in pools.values())


def test_history_shows_the_leaked_pages_after_they_are_freed(start_server, open_window, qtbot):
    scenario = SCENARIOS["incident-placeholder"]
    sections = config_sections(scenario)
    sections["canaries"] = {"enabled": False}
    sections["defences"] = {"manifest_check": False, "writer_tag_check": False}
    server = start_server("--allow-faults", **sections)
    window = open_window(server.control)
    bar, page_map = window.history_bar, window.page_map
    assert bar.live and page_map.frame is None

    client = server.client(timeout_s=300)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (run_workload(client, scenario.workload(random.Random(3), 0.25)),
                                              done.set()), daemon=True)
    worker.start()  # the window records while the workload runs
    qtbot.waitUntil(done.is_set, timeout=240_000)
    qtbot.waitUntil(lambda: "ownership_violation:prefill-0" in window.state.alerts
                    or any(a.kind == "ownership_violation" for a in window.state.alerts.values()), timeout=30_000)
    qtbot.waitUntil(lambda: held(window.state.pages.pools) == 0, timeout=30_000)  # the live map is empty again
    window.refresh()

    history = window.state.history
    assert len(history) >= 3, history.times()
    busiest = max(range(len(history)), key=lambda i: held(history.frame(i).pools))
    then = held(history.frame(busiest).pools)
    assert then > 0
    assert bar.slider.maximum() == len(history) and bar.slider.value() == len(history)  # the right end: live

    bar.slider.setValue(busiest)  # as an operator drags it
    frame = page_map.frame
    assert frame is not None and not bar.live and frame.time == history.times()[busiest]
    assert sum(view.image.used_pages for view in page_map._views.values()) == then
    titles = [view.title_text for view in page_map._views.values()]
    assert all("history: as at" in t for t in titles), titles
    assert "pages held then" in bar.label.full_text()
    if os.environ.get("HISTORY_PNG"):  # docs/screenshot-history.png is made this way
        window.bottom_tabs.setCurrentIndex(1)
        window.refresh()
        qtbot.wait(300)
        window.grab().save(os.environ["HISTORY_PNG"])

    # hover names the request that held the page then
    pool, page = next((name, int(np.flatnonzero(p.arrays["state"] != PageState.FREE)[0]))
                      for name, p in frame.pools.items() if (p.arrays["state"] != PageState.FREE).any())
    slot = int(frame.pools[pool].arrays["owner"][page])
    text = page_map.describe_page(pool, page)
    assert f"request {frame.request_of_slot(slot)} (slot {slot})" in text, text
    assert frame.request_of_slot(slot) in window.state.requests

    # new frames keep coming while the past is shown: the handle stays on the same moment
    kept = frame.time
    bar._sync()
    assert page_map.frame.time == kept and history.times()[bar.slider.value()] == kept

    # an alert's moment
    alert = next(a for a in window.state.alerts.values() if a.kind == "ownership_violation")
    assert bar.show_time(alert.first_seen)
    assert page_map.frame.time <= alert.first_seen + 1e-6
    assert not bar.show_time(history.times()[0] - 10)  # before the history: nothing changes

    bar.live_button.click()
    assert bar.live and page_map.frame is None
    assert sum(view.image.used_pages for view in page_map._views.values()) == 0
    assert not any("history" in view.title_text for view in page_map._views.values())
