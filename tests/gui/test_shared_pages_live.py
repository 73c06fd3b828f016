"""Our own engine's shared pages in the window: a real server with requests of two tenants
opening with one system prompt. The decode pool's cached pages are hatched on the map, the hover
names the prefix cache, how many hold the page and whose salt it carries; colour by tenant
paints each tenant's cached prefix in that tenant's colour. SHARED_LIVE_PNG keeps a screenshot."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from engine.wire.page_tags import SHARED_OWNER
from gui import theme
from gui.model.page_colors import MODES

pytestmark = [pytest.mark.gui, pytest.mark.e2e]

SYSTEM = b"You are the support assistant of a small bank. Answer in one short line. " * 3
NEW = 200  # long enough that the requests still hold their pages when the window looks


def _prompt(question: bytes) -> list[int]:
    return [256, *SYSTEM, *b"\nQ: ", *question, *b"\nA:"]


def test_the_map_hatches_our_cached_pages_and_names_whose_salt_they_carry(start_server, open_window, qtbot,
                                                                          tmp_path):
    server = start_server(engine={"page_size": 16, "context_window": 1024},
                          pools={"prefill": {"pages": 128}, "decode": {"pages": 256}})
    window = open_window(server.control)
    window.setPalette(theme.build_palette("dark"))
    window.resize(1024, 700)
    client = server.client()
    # one request per tenant first, so that the next ones find their tenant's prefix cached
    for tenant in ("acme", "globex"):
        client.generate(_prompt(tenant.encode()), max_new_tokens=2, ignore_eos=True, tenant=tenant)
    ends: list[dict] = []

    def run(tenant: str, question: bytes) -> None:
        c = server.client()
        try:
            ends.append(c.generate(_prompt(question), max_new_tokens=NEW, ignore_eos=True, tenant=tenant))
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(t, f"{t} question {i}".encode()))
               for i, t in enumerate(("acme", "acme", "globex", "globex", "acme"))]
    for t in threads:
        t.start()
    page_map = window.page_map
    pool = "decode-0"

    def shared_held() -> np.ndarray:
        view = page_map._views.get(pool)
        mirror = window.state.pages.pools.get(pool)
        if view is None or mirror is None or "refs" not in mirror.arrays:
            return np.empty(0, dtype=np.int64)
        return np.flatnonzero((mirror.arrays["owner"] == SHARED_OWNER) & (mirror.arrays["refs"] > 1))

    try:
        qtbot.waitUntil(lambda: len(shared_held()) >= 2 and window.page_map._views[pool].shared_pages.size >= 2,
                        timeout=60_000)
        view, mirror = page_map._views[pool], window.state.pages.pools[pool]
        held = shared_held()
        assert set(held.tolist()) <= set(view.shared_pages.tolist())  # hatched
        text = page_map.describe_page(pool, int(held[0]))
        assert "owner: the prefix cache" in text and "written by request" in text, text
        assert "'s salt" in text and "shared by" in text and "requests (prefix cache)" in text, text
        writer_tenants = {page_map.describe_page(pool, int(p)).split("carries tenant ")[1].split("'s salt")[0]
                          for p in held}
        assert writer_tenants <= {"acme", "globex"} and writer_tenants, writer_tenants
        # colour by tenant: a shared page takes its writer's tenant colour, never the neutral one
        page_map.mode_box.setCurrentIndex(MODES.index("tenant"))
        assert page_map.colors.mode == "tenant"
        window.refresh()
        qtbot.wait(50)
        assert int(mirror.arrays["writer"][held[0]]) >> 32 > 0
        path = Path(os.environ.get("SHARED_LIVE_PNG") or tmp_path / "shared-live.png")
        assert window.grab().save(str(path))
    finally:
        for t in threads:
            t.join(timeout=120)
    assert len(ends) == 5 and all(e["cached_tokens"] > 0 for e in ends), [e.get("cached_tokens") for e in ends]
