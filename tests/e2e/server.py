"""The real engine server the end-to-end tests drive (see engine.client.local_server)."""

from engine.client.local_server import LocalServer as ServerProcess
from engine.client.local_server import write_config

__all__ = ["ServerProcess", "write_config"]
