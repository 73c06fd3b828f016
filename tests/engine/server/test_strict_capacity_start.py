"""I6 at start: with engine.strict_capacity on, a context window that no pool can hold refuses
the start itself, naming the window, the pool and its capacity, before any socket is bound or
worker started; without it the same config starts and warns (capacity_exceeds_window)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from engine.config import REPO_ROOT, EngineConfig
from engine.errors import ConfigError
from engine.server.supervisor import Supervisor

# 16 decode pages of 16 tokens hold 256 tokens; the window is 2,048
SMALL = {"pools": {"prefill": {"pages": 16}, "decode": {"pages": 16}}, "canaries": {"enabled": False}}


def test_strict_capacity_refuses_the_start_naming_the_shortfall():
    config = EngineConfig().replace(engine={"strict_capacity": True, "context_window": 2048, "page_size": 16},
                                    **SMALL)
    with pytest.raises(ConfigError, match=r"strict capacity: context window 2,048 tokens exceeds .*decode"):
        Supervisor(config, bind="tcp://127.0.0.1:0")


def test_serve_exits_with_the_reason(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[engine]\nstrict_capacity = true\ncontext_window = 2048\npage_size = 16\n'
                      '[pools.prefill]\npages = 16\n[pools.decode]\npages = 16\n[canaries]\nenabled = false\n')
    done = subprocess.run([sys.executable, "main.py", "serve", "--config", str(config), "--bind", "tcp://127.0.0.1:0"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "strict capacity" in done.stderr and "2,048" in done.stderr, done.stderr[-2000:]
