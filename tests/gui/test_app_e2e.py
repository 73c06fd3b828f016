"""The desktop app against a real engine: the page map shows the engine's pages, alerts
and the capacity banner come from the engine, controls change the real workers (and are
inert read-only), a dead engine shows as stale and a restarted one is picked up again."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from engine.client import RemoteError
from engine.wire.protocol import PAGE_FIELDS
from tests.gui.conftest import free_port

LONG = dict(max_new_tokens=1500, ignore_eos=True)


def _pixel(window, pool: str, page: int):
    pm = window.page_map
    # the views apply their auto-range on the first paint after a layout change: render once
    # so that the scene-to-pixel mapping below is the one the sampled frame is drawn with
    pm.graphics.viewport().grab()
    point = pm.graphics.mapFromScene(pm.scene_pos_of(pool, page))
    c = pm.graphics.viewport().grab().toImage().pixelColor(point)
    return c.red(), c.green(), c.blue()


def _status_worker(client, name: str) -> dict:
    return next(w for w in client.status()["workers"] if w["name"] == name)


def _wait_window_worker(window, qtbot, name: str, state: str) -> None:
    """Until the window's own view of the worker says `state` (buttons follow that view)."""
    qtbot.waitUntil(lambda: any(w.name == name and w.state == state for w in window.state.workers), timeout=120_000)
    window.refresh()


def test_page_map_shows_the_engines_pages_hover_and_click(start_server, open_window, qtbot):
    server = start_server()
    client = server.client()
    window = open_window(server.control)
    streams = [client.submit([256, *range(i, i + 20 + 10 * i)], tenant=f"t{i}", **LONG) for i in range(3)]
    ids = []
    for stream in streams:
        for msg in client.events(stream):
            if msg.op == "token":
                break
            ids.append(msg.get("request_id"))
    decode = "decode-0"
    qtbot.waitUntil(lambda: decode in window.state.pages.pools and
                    all(window.state.request_of_slot for _ in [0]) and
                    set(ids) <= set(window.state.requests), timeout=30_000)
    # owners and states change only at allocation and release: wait until the mirror agrees
    truth = client.page_metadata(decode)
    qtbot.waitUntil(lambda: np.array_equal(window.state.pages.pools[decode].arrays["owner"], truth["owner"]),
                    timeout=10_000)
    window.refresh()
    colours = {}
    for rid in ids:
        slot = window.state.requests[rid].slot
        page = int(np.flatnonzero(truth["owner"] == slot)[0])
        index = window.page_map._views[decode].image.image.reshape(-1)[page]
        expected = tuple(int(v) for v in window.page_map.colors.lut(None)[index, :3])
        assert _pixel(window, decode, page) == expected
        colours[rid] = expected
        text = window.page_map.describe_page(decode, page)
        assert rid in text and f"t{ids.index(rid)}" in text and "filled" in text.lower()
    assert len(set(colours.values())) == 3  # three live requests, three colours
    free_page = int(np.flatnonzero(truth["owner"] == -1)[0])
    assert _pixel(window, decode, free_page) not in colours.values()
    # click a page of the second request: it is selected everywhere
    slot = window.state.requests[ids[1]].slot
    page = int(np.flatnonzero(truth["owner"] == slot)[0])
    point = window.page_map.graphics.mapFromScene(window.page_map.scene_pos_of(decode, page))
    qtbot.mouseClick(window.page_map.graphics.viewport(), Qt.LeftButton, pos=point)
    qtbot.waitUntil(lambda: window.state.selected_request == ids[1], timeout=5_000)
    assert window.requests_table.selected_request() == ids[1]
    other = int(np.flatnonzero(truth["owner"] == window.state.requests[ids[0]].slot)[0])
    window.refresh()
    assert _pixel(window, decode, other) != colours[ids[0]]  # dimmed
    for rid in ids:
        client.cancel(rid)


def test_engine_alerts_reach_the_table_and_acknowledge(start_server, open_window, qtbot):
    server = start_server()
    client = server.client()
    window = open_window(server.control)
    with pytest.raises(RemoteError):
        client.generate([1, 2], max_new_tokens=5000)
    qtbot.waitUntil(lambda: any(a.alert_id == "admission_rejected:context_window" for a in window.state.alerts.values()),
                    timeout=10_000)
    aid = next(k for k, a in window.state.alerts.items() if a.alert_id == "admission_rejected:context_window")
    window.refresh()
    model = window.alerts_table.model
    rows = [model.index(r, c).data() for r in range(model.rowCount()) for c in range(model.columnCount())]
    assert "admission_rejected" in rows
    window.acknowledge_alerts([aid])
    qtbot.waitUntil(lambda: window.state.alerts[aid].acked, timeout=10_000)
    assert next(a for a in client.status()["alerts"] if (a.get("key") or a["id"]) == aid)["acked"] is True


def test_capacity_banner_until_a_reconfigure_fixes_it(start_server, open_window, qtbot):
    # window 2048 tokens, prefill pool 64 x 16 = 1024: the banner must show both numbers
    server = start_server(pools={"prefill": {"pages": 64}, "decode": {"pages": 256}})
    window = open_window(server.control)
    qtbot.waitUntil(lambda: window.banner.isVisible(), timeout=10_000)
    text = " ".join(window.banner.shown_lines())
    assert "2,048" in text and "1,024" in text
    window.open_reconfigure()
    dialog = window.reconfigure_dialog
    changes = {"pools": {"prefill": {"pages": 128}}}
    dialog.validate_requested.emit(changes)
    qtbot.waitUntil(lambda: not window.source.answers, timeout=10_000)
    dialog.apply_requested.emit(changes)
    qtbot.waitUntil(lambda: not window.banner.isVisible(), timeout=60_000)
    assert not window.state.exceeding_findings()


def test_worker_controls_change_the_real_worker_and_readonly_blocks_them(start_server, open_window, qtbot,
                                                                         monkeypatch):
    server = start_server()
    client = server.client()
    window = open_window(server.control)
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    pid = _status_worker(client, "decode-0")["pid"]
    window.workers_panel.select_worker("decode-0")
    window.refresh()
    assert window.workers_panel.ask("stop", "decode-0")
    qtbot.waitUntil(lambda: _status_worker(client, "decode-0")["state"] == "stopped", timeout=30_000)
    _wait_window_worker(window, qtbot, "decode-0", "stopped")
    assert window.workers_panel.ask("start", "decode-0")
    qtbot.waitUntil(lambda: _status_worker(client, "decode-0")["state"] == "ready", timeout=120_000)
    new_pid = _status_worker(client, "decode-0")["pid"]
    assert new_pid != pid
    _wait_window_worker(window, qtbot, "decode-0", "ready")
    assert window.workers_panel.ask("restart", "decode-0")
    qtbot.waitUntil(lambda: _status_worker(client, "decode-0")["pid"] not in (pid, new_pid)
                    and _status_worker(client, "decode-0")["state"] == "ready", timeout=120_000)

    viewer = open_window(server.control, readonly=True)
    viewer.workers_panel.select_worker("decode-0")
    viewer.refresh()
    assert not any(viewer.workers_panel.enabled().values())
    assert all(not a.isEnabled() for a in viewer.actions() if a.property("control"))
    before = _status_worker(client, "decode-0")["pid"]
    viewer.worker_actions["stop"].trigger()  # the shortcut's action is inert
    assert viewer.request("stop", worker="decode-0") is None
    time.sleep(1.0)
    after = _status_worker(client, "decode-0")
    assert (after["state"], after["pid"]) == ("ready", before)


def test_dead_engine_shows_stale_and_a_restarted_one_is_picked_up(start_server, open_window, qtbot):
    bind = f"tcp://127.0.0.1:{free_port()}"
    server = start_server(bind=bind)
    window = open_window(server.control)
    qtbot.waitUntil(lambda: "decode-0" in window.state.pages.pools, timeout=20_000)
    qtbot.waitUntil(lambda: not window.status_line.stale, timeout=10_000)
    killed = time.monotonic()
    server.kill()
    qtbot.waitUntil(lambda: window.status_line.stale, timeout=10_000)
    stale_after = time.monotonic() - killed
    assert stale_after < 10  # generous here (a test does not time); bench/gui_stale.py measures it
    restarted = start_server(bind=bind)
    client = restarted.client()
    qtbot.waitUntil(lambda: window.source.now.connected and not window.status_line.stale, timeout=60_000)
    client.generate([256, 5, 6, 7], max_new_tokens=3, ignore_eos=True)
    for pool in ("prefill-0", "decode-0"):
        qtbot.waitUntil(lambda p=pool: p in window.state.pages.pools and not window.state.pages.stale_pools()
                        and all(np.array_equal(window.state.pages.pools[p].arrays[k], client.page_metadata(p)[k])
                                for k in PAGE_FIELDS), timeout=30_000)


def test_attaching_with_curve_keys(start_server, open_window, tmp_path):
    from engine.wire.curve import generate_keys
    from gui.app import load_keys

    keys = tmp_path / "keys"
    generate_keys(keys)
    server_key, client_keys = load_keys(str(keys / "server.key"), str(keys / "clients" / "client.key"))
    server = start_server("--curve", "--keys", str(keys),
                          client_kwargs={"server_key": server_key, "client_keys": client_keys})
    window = open_window(server.control, server_key=server_key, client_keys=client_keys)
    assert window.state.engine.get("curve") is True
    assert {w.name for w in window.state.workers} == {"prefill-0", "decode-0"}


def test_the_prefix_cache_scope_set_in_the_dialog_restarts_the_real_workers(start_server, open_window, qtbot):
    """The operator picks a scope in the reconfigure dialog, validates, applies: the engine
    restarts both workers under it (a scope only takes hold in a new worker)."""
    server = start_server()
    client = server.client()
    window = open_window(server.control)
    pids = {name: _status_worker(client, name)["pid"] for name in ("prefill-0", "decode-0")}
    window.open_reconfigure()
    dialog = window.reconfigure_dialog
    assert dialog.prefix_scope.currentData() == "tenant"
    dialog.prefix_scope.setCurrentIndex(dialog.prefix_scope.findData("off"))
    dialog.validate_button.click()
    qtbot.waitUntil(dialog.apply_button.isEnabled, timeout=20_000)
    assert "prefill-0" in dialog.result_view.toPlainText() and "decode-0" in dialog.result_view.toPlainText()
    dialog.apply_button.click()
    qtbot.waitUntil(lambda: client.status()["config"]["prefix_cache"]["scope"] == "off", timeout=30_000)
    qtbot.waitUntil(lambda: all(_status_worker(client, n)["pid"] != pid and _status_worker(client, n)["state"] == "ready"
                                for n, pid in pids.items()), timeout=120_000)
