"""Test-wide settings: no display, the Triton interpreter on machines without CUDA."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Engines started by tests keep their evidence journals in a directory of this run, never in the
# user's own state directory ([audit] journal = "auto" names one file per engine endpoint).
if "PAGEWARDEN_STATE_DIR" not in os.environ:
    import tempfile

    os.environ["PAGEWARDEN_STATE_DIR"] = tempfile.mkdtemp(prefix="pagewarden-test-state-")
# Must precede the first import of a module holding @triton.jit functions.
if not os.path.exists("/dev/nvidia0"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from engine.client.local_server import LocalServer, write_config  # noqa: E402
from tests.hf_checkpoints import ARCH_CASES, write_random_checkpoint  # noqa: E402


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path_factory, monkeypatch):
    """Each test's engines keep their journals apart: an engine that finds an earlier test's
    journal would show that test's alerts as its previous run (which is the feature)."""
    monkeypatch.setenv("PAGEWARDEN_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def checkpoint_dirs(tmp_path_factory) -> dict[str, Path]:
    """One random HF checkpoint per case of ARCH_CASES, written by transformers itself."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: write_random_checkpoint(root / name, **case) for name, case in ARCH_CASES.items()}


@pytest.fixture(scope="session")
def tiny_model():
    """The embedded default model on CPU in float32, shared (engines get their own pools)."""
    from engine.config import DEFAULT_MODEL_DIR
    from engine.model.load import load_model

    return load_model(DEFAULT_MODEL_DIR, dtype="float32", device="cpu")


@pytest.fixture
def make_engine(tiny_model):
    """make_engine(context_window=..., prefill_pages=..., decode_pages=..., **engine_keys)."""
    from engine.config import EngineConfig
    from engine.core import Engine

    def make(*, prefill_pages: int = 256, decode_pages: int = 256, defences=None, faults=None,
             prefix_cache: str = "tenant", **engine_keys) -> Engine:
        config = EngineConfig().replace(
            model={"device": "cpu", "dtype": "float32"},
            engine={"kernels": "torch", **engine_keys},
            pools={"prefill": {"pages": prefill_pages}, "decode": {"pages": decode_pages}},
            defences=defences or {}, faults=faults or {}, prefix_cache={"scope": prefix_cache},
        )
        return Engine(config, tiny_model)

    return make


# ---- end-to-end: real supervisor and worker processes on loopback (marker e2e) ----
@pytest.fixture
def start_server(tmp_path):
    """start_server(engine={...}, pools={...}, workers={...}) -> a ready LocalServer."""
    servers = []

    def start(*extra: str, wait: bool = True, **sections) -> LocalServer:
        config = write_config(tmp_path / f"config-{len(servers)}.toml", **sections)
        server = LocalServer(config, *extra)
        servers.append(server)
        if wait:
            server.wait_workers(server.client())
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    """One default server for a module's read-mostly tests."""
    config = write_config(tmp_path_factory.mktemp("shared") / "config.toml")
    server = LocalServer(config)
    server.wait_workers(server.client())
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _qt_objects_die_between_tests(request):
    """After a Qt test (once pytest-qt has closed its widgets), destroy what it left: the
    widgets' deferred deletes, then Python's cyclic garbage. Left to the collector, a
    previous test's pyqtgraph objects were collected at an arbitrary moment of a later test,
    and a QGraphicsView painting then crashed in QPainter::restore (CI run 4, 2026-12-05;
    reproduced 3 times in 3 by repeating tests/gui/test_side_widgets.py 40 times in one
    process, never with this collection or with the collector disabled). Not root-caused
    below PySide/pyqtgraph; the product makes its views once per window, but the page map
    replaces its pool rows at run time, which is the same pattern (not yet stress-tested)."""
    yield
    if "qtbot" not in request.fixturenames:
        return
    import gc

    from PySide6.QtCore import QCoreApplication, QEvent

    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    gc.collect()


# tests/vllm/ start a real vLLM from its own venv (`make test-vllm`); the main suite never needs it
collect_ignore = [] if os.environ.get("PAGEWARDEN_VLLM_TESTS") == "1" else ["vllm"]


def pytest_collection_modifyitems(items):
    """gui: every test that takes qtbot; e2e: every test that starts a server through the
    fixtures above (modules that start one themselves say pytestmark = pytest.mark.e2e)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if "qtbot" in names:
            item.add_marker(pytest.mark.gui)
        if names & {"start_server", "shared_server"}:
            item.add_marker(pytest.mark.e2e)
