"""The real engine server the end-to-end tests drive (see engine.commands.local_server)."""

from engine.commands.local_server import LocalServer as ServerProcess, write_config

__all__ = ["ServerProcess", "write_config"]
