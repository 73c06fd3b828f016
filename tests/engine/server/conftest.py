"""Fixtures the supervisor's tests share."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.server.supervisor import Supervisor


@pytest.fixture
def supervisor():
    """A supervisor with no worker started, canaries off, on a random loopback port."""
    sup = Supervisor(EngineConfig().replace(canaries={"enabled": False}), bind="tcp://127.0.0.1:0")
    yield sup
    sup.shutdown()
