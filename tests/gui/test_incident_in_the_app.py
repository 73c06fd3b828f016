"""The incident, reproduced against a hosted engine and watched in the app: the alert,
the quarantined pages in the page map, and the affected pair in the alert's scope."""

from __future__ import annotations

import os
import random
import time

import numpy as np

from engine.client import EngineClient
from engine.client.local_server import write_config
from engine.config import EngineConfig
from engine.guard.reproduce import run_workload
from engine.guard.scenarios import SCENARIOS, config_sections
from engine.wire.page_tags import PageState
from tests.gui.waits import connected_and_ready

CONNECT_MS = 180_000



def test_incident_placeholder_in_the_app(qtbot, tmp_path):
    from gui.app import App
    from main import parse

    scenario = SCENARIOS["incident-placeholder"]
    config = write_config(tmp_path / "incident.toml", EngineConfig().replace(canaries={"enabled": False}),
                          **config_sections(scenario))
    app = App(parse(["gui", "--config", str(config), "--allow-faults", "--theme", "dark"]))
    qtbot.addWidget(app.window)
    app.start()
    window = app.window
    window.show()
    client = None
    try:
        qtbot.waitUntil(lambda: connected_and_ready(window), timeout=CONNECT_MS)
        client = EngineClient(window.source.now.label, timeout_s=300)
        rng = random.Random(7)
        # phase 1: the manifest check is off, the writer-tag check catches the placeholders
        client.reconfigure({"defences": {"manifest_check": False}}, apply=True)
        run_workload(client, scenario.workload(rng, 0.5))
        decode = "decode-0"
        qtbot.waitUntil(lambda: decode in window.state.pages.pools and
                        (window.state.pages.pools[decode].arrays["state"] == PageState.QUARANTINED).any(),
                        timeout=20_000)
        window.refresh()
        quarantined = int(np.flatnonzero(window.state.pages.pools[decode].arrays["state"] == PageState.QUARANTINED)[0])
        index = window.page_map._views[decode].image.image.reshape(-1)[quarantined]
        from gui.model.page_colors import QUARANTINED_PAGE

        assert index == QUARANTINED_PAGE  # the alarm colour in the map
        assert any(a.alert_id == "ownership_violation:decode-0" for a in window.state.alerts.values())
        # issue 15, item 3: every defence that is off and every fault that is on, named
        qtbot.waitUntil(lambda: "Manifest check" in " ".join(window.faults_banner.shown_lines()), timeout=20_000)
        weakened = " ".join(window.faults_banner.shown_lines())
        assert window.faults_banner.isVisible() and "Faults ON: placeholder on reject" in weakened
        assert "Writer-tag check" not in weakened  # still on in phase 1
        # phase 2: the writer-tag check off too: the placeholders read other requests' stale pages

        phase2 = time.time()
        client.reconfigure({"defences": {"manifest_check": False, "writer_tag_check": False}}, apply=True)
        run_workload(client, scenario.workload(rng, 0.5))
        truth = client.call("ground_truth")["reads"]
        assert truth, "the incident did not happen"
        firing = lambda a: (not a.acked and a.kind == "ownership_violation"  # noqa: E731
                            and a.state == "firing" and a.last_seen >= phase2)
        qtbot.waitUntil(lambda: any(firing(a) for a in window.state.alerts.values()), timeout=20_000)
        window.bottom_tabs.setCurrentIndex(1)
        window.refresh()
        model = window.alerts_table.model
        # the alert firing now (phase 1's, whose reads were all prevented, has an empty scope)
        row = next(i for i, a in enumerate(model.rows) if firing(a))
        window.alerts_table.view.selectRow(row)
        seen = []
        qtbot.waitUntil(lambda: bool(window.alert_detail.pairs) and not seen.append(window.alert_detail.pairs[0]),
                        timeout=20_000)
        pair = seen[0]
        readers = {t["reader"] for t in truth}
        assert pair["reader"] in readers and pair["source"]
        text = window.alert_detail.view.toPlainText()
        assert "affected pair" in text and pair["reader"] in text and pair["source"] in text
        # issue 15, item 2: the data-crossed banner, the Alerts tab badge, a desktop notification
        qtbot.waitUntil(lambda: window.crossing_banner.isVisible(), timeout=20_000)
        banner = " ".join(window.crossing_banner.shown_lines())
        assert "new pair(s) of requests" in banner and "received data of" in banner
        qtbot.waitUntil(lambda: any(title == "Data crossed between requests" for title, _ in window.notifier.sent),
                        timeout=5_000)
        assert "\u26a0" in window.bottom_tabs.tabText(1)
        window.crossing_banner.ack_button.click()
        window.refresh()  # the frame: every view following "crossings" repaints
        assert not window.crossing_banner.isVisible() and "\u26a0" not in window.bottom_tabs.tabText(1)
        pairs_before, sent_before = window.state.crossings.pairs, len(window.notifier.sent)
        # a second leak while the alert is still firing: new pairs bring the banner back
        run_workload(client, scenario.workload(rng, 0.5))
        qtbot.waitUntil(lambda: window.crossing_banner.isVisible(), timeout=30_000)
        assert window.state.crossings.pairs > pairs_before
        qtbot.waitUntil(lambda: any(title == "Data crossed between requests"
                                    for title, _ in window.notifier.sent[sent_before:]), timeout=10_000)
        if os.environ.get("CROSSED_PNG"):
            window.refresh()
            window.grab().save(os.environ["CROSSED_PNG"])
        if os.environ.get("INCIDENT_PNG"):  # a picture for the docs, once the notifications faded
            qtbot.wait(7000)
            window.refresh()
        window.grab().save(os.environ.get("INCIDENT_PNG", str(tmp_path / "incident.png")))
    finally:
        if client is not None:
            client.close()
        window.close()
        app.stop_hosted()
