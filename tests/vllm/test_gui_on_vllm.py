"""The desktop app attached to a real vLLM 0.32 with PageWarden's agent on: vLLM's blocks by
owner request, prefix-shared blocks marked, engine controls off. VLLM_AGENT_PNG=path saves
the screenshot (docs/screenshot-vllm-agent.png is one)."""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading

import numpy as np
import pytest
from PySide6.QtGui import QAction

from engine.wire.page_tags import PageState
from gui.main_window import MainWindow
from gui.transport import TransportThread
from tests.vllm.vllm_server import VllmServer

pytestmark = [pytest.mark.vllm, pytest.mark.gui]

PREFIXES = ("the quick brown fox jumps over the lazy dog and runs far away " * 2,
            "lorem ipsum dolor sit amet consectetur adipiscing elit sed do " * 2,
            "river stone light cloud north south green amber quiet early " * 2)


def keep_busy(server: VllmServer, stop: threading.Event) -> None:
    """Waves of long requests over three shared prompt prefixes, until told to stop."""
    def one(i: int) -> None:
        if not stop.is_set():
            server.complete(PREFIXES[i % 3] + f"request {i}", 200 + 20 * (i % 5), ignore_eos=True)

    with cf.ThreadPoolExecutor(9) as pool:
        i = 0
        while not stop.is_set():
            list(pool.map(one, range(i, i + 9)))
            i += 9


def test_the_app_shows_vllms_blocks_by_owner_request_with_shared_prefix_blocks_marked(qtbot):
    with VllmServer(agent={}, num_blocks=128, max_model_len=512) as server:
        window = MainWindow(theme="dark")
        qtbot.addWidget(window)
        window.resize(1280, 800)
        window.attach(TransportThread(server.agent_control), server.agent_control)
        window.show()
        qtbot.waitUntil(lambda: window.connection == "connected" and "vllm" in window.state.pages.pools,
                        timeout=60_000)
        assert window.engine_readonly and not window.readonly  # the engine said so; the user did not
        controls = [a for a in window.findChildren(QAction) if a.property("control")]
        assert controls and not any(a.isEnabled() for a in controls)
        assert "read-only" in window.windowTitle() and "vLLM 0.32.0" in window.windowTitle()

        stop = threading.Event()
        load = threading.Thread(target=keep_busy, args=(server, stop), daemon=True)
        load.start()
        try:
            pool = window.state.pages.pools["vllm"]

            def busy_and_shared() -> bool:
                held = np.flatnonzero(pool.arrays["state"] != PageState.FREE)
                return len(held) >= 40 and len(pool.shared_pages()) >= 3 and all(
                    window.state.request_for_slot(int(s)) is not None for s in np.unique(pool.arrays["owner"][held]))

            qtbot.waitUntil(busy_and_shared, timeout=60_000)
            qtbot.wait(300)  # one repaint of the map at 10 Hz
            held = np.flatnonzero(pool.arrays["state"] != PageState.FREE)
            owners = {window.state.request_for_slot(int(s)).request_id for s in pool.arrays["owner"][held]}
            assert all(rid.startswith("cmpl-") for rid in owners) and len(owners) >= 3
            assert (pool.holders()[pool.shared_pages()] >= 2).all()
            if os.environ.get("VLLM_AGENT_PNG"):
                qtbot.waitUntil(lambda: len(window.state.metrics["tokens_per_s"]) >= 5, timeout=20_000)  # plot lines
                qtbot.waitUntil(busy_and_shared, timeout=60_000)  # mid-wave again
                qtbot.wait(300)
                window.grab().save(os.environ["VLLM_AGENT_PNG"])
        finally:
            stop.set()
            load.join(120)
        window.close()
