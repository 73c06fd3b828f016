"""Which reconfigurations restart which workers (engine/server/reconfigure.py::needs_restart)."""

from __future__ import annotations

from types import SimpleNamespace

from engine.config import EngineConfig
from engine.server.reconfigure import needs_restart

WORKERS = [SimpleNamespace(name="prefill-0", role="prefill"), SimpleNamespace(name="decode-0", role="decode")]


def test_a_new_prefix_cache_scope_restarts_every_worker_and_a_defence_none():
    old = EngineConfig()
    assert needs_restart(old, old.replace(prefix_cache={"scope": "global"}), WORKERS) == {"prefill-0", "decode-0"}
    assert needs_restart(old, old.replace(defences={"scrub": False}), WORKERS) == set()
    assert needs_restart(old, old.replace(pools={"decode": {"pages": 17}}), WORKERS) == {"decode-0"}
