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


def keep_busy(server: VllmServer, stop: threading.Event, streams: int = 9) -> None:
    """`streams` clients, each sending long requests over three shared prompt prefixes one
    after another until told to stop: vLLM's pool is never empty between them (waves that all
    ended together left it empty for a moment, and a look at that moment saw nothing)."""
    def client(k: int) -> None:
        i = k
        while not stop.is_set():
            server.complete(PREFIXES[i % 3] + f"request {i}", 200 + 20 * (i % 5), ignore_eos=True)
            i += streams

    with cf.ThreadPoolExecutor(streams) as pool:
        list(pool.map(client, range(streams)))


def test_the_app_shows_vllms_blocks_by_owner_request_with_shared_prefix_blocks_marked(qtbot):
    with VllmServer(agent={}, num_blocks=128, max_model_len=512) as server:
        window = MainWindow(theme="dark")
        qtbot.addWidget(window)
        window.resize(1280, 800)
        window.attach(TransportThread(server.agent_control), server.agent_control)
        window.show()
        qtbot.waitUntil(lambda: window.source.now.connected and "vllm" in window.state.pages.pools,
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

            seen = {}

            def busy_and_shared() -> bool:
                """What the map shows now, kept as one consistent look (the map moves on)."""
                held = np.flatnonzero(pool.arrays["state"] != PageState.FREE)
                records = [window.state.request_for_slot(int(s)) for s in np.unique(pool.arrays["owner"][held])]
                shared = pool.shared_pages()
                seen.update(owners={r.request_id for r in records if r is not None},
                            holders=pool.holders()[shared])
                return len(held) >= 40 and len(shared) >= 3 and all(r is not None for r in records)

            qtbot.waitUntil(busy_and_shared, timeout=60_000)
            assert all(rid.startswith("cmpl-") for rid in seen["owners"]) and len(seen["owners"]) >= 3
            assert (seen["holders"] >= 2).all()
            if os.environ.get("VLLM_AGENT_PNG"):
                qtbot.waitUntil(lambda: len(window.state.metrics["tokens_per_s"]) >= 5, timeout=20_000)  # plot lines
                qtbot.waitUntil(busy_and_shared, timeout=60_000)  # mid-wave again
                qtbot.wait(300)
                window.grab().save(os.environ["VLLM_AGENT_PNG"])
        finally:
            stop.set()
            load.join(120)
        window.close()
