"""End-to-end fixtures: real supervisor and worker processes on loopback."""

from __future__ import annotations

import pytest

from tests.e2e.server import ServerProcess, write_config


@pytest.fixture
def start_server(tmp_path):
    """start_server(engine={...}, pools={...}, workers={...}) -> a ready ServerProcess."""
    servers = []

    def start(*extra: str, wait: bool = True, **sections) -> ServerProcess:
        config = write_config(tmp_path / f"config-{len(servers)}.toml", **sections)
        server = ServerProcess(config, *extra)
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
    server = ServerProcess(config)
    server.wait_workers(server.client())
    yield server
    server.stop()
