"""GUI tests against a real engine on loopback: the window attaches through its real
transport thread; nothing of the engine is mocked."""

from __future__ import annotations

import socket

import pytest

from engine.client.local_server import LocalServer as ServerProcess
from engine.client.local_server import write_config
from gui.main_window import MainWindow
from gui.transport import TransportThread
from tests.gui.waits import connected_and_ready

CONNECT_TIMEOUT_MS = 120_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def start_server(tmp_path):
    servers = []

    def start(*extra, bind="tcp://127.0.0.1:0", client_kwargs=None, **sections) -> ServerProcess:
        server = ServerProcess(write_config(tmp_path / f"gui-{len(servers)}.toml", **sections), *extra, bind=bind)
        servers.append(server)
        server.wait_workers(server.client(**(client_kwargs or {})))
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def open_window(qtbot):
    windows = []

    def open_(endpoint: str, *, readonly: bool = False, telemetry_endpoint: str | None = None,
              server_key=None, client_keys=None) -> MainWindow:
        window = MainWindow(readonly=readonly, theme="dark")
        qtbot.addWidget(window)
        transport = TransportThread(endpoint, telemetry_endpoint=telemetry_endpoint, server_key=server_key,
                                    client_keys=client_keys)
        window.attach(transport, endpoint)
        window.show()
        qtbot.waitUntil(lambda: connected_and_ready(window), timeout=CONNECT_TIMEOUT_MS)
        windows.append(window)
        return window

    yield open_
    for window in windows:
        window.close()
