"""What the CPU-kernel tests share."""

from __future__ import annotations

import pytest

from kernels import cpu_extension


@pytest.fixture
def built(monkeypatch):
    """The kernels as the engine gets them: PAGEWARDEN_CPU_KERNELS unset, built (or cached).
    The module's own tests apply it to every test (pytestmark); a test may replace
    cpu_extension.extension, and the cache cleared on the way out is this one's."""
    monkeypatch.delenv(cpu_extension.ENV_VAR, raising=False)
    extension = cpu_extension.extension
    extension.cache_clear()
    yield extension()
    extension.cache_clear()
