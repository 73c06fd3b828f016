"""Key files for a CURVE client (what the GUI and the CLI need to attach remotely)."""

from engine.server.auth import load_client_keys, load_public_key

__all__ = ["load_client_keys", "load_public_key"]
