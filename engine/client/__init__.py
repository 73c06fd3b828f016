"""The one way into an engine: submit, stream, status, control, subscribe.

The GUI and the CLI use this package; it imports no torch (an import contract).
"""

from engine import __version__
from engine.client.engine_client import EngineClient, RemoteError
from engine.client.page_mirror import PageMirror, PoolMirror
from engine.client.subscriber import TelemetrySubscriber

__all__ = ["EngineClient", "PageMirror", "PoolMirror", "RemoteError", "TelemetrySubscriber", "__version__"]
