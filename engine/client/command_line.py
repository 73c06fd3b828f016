"""What every client command line shares (the CLI's and the snapshot exporter's): exit
codes, error printing, --engine and the CURVE key flags, and connecting."""

from __future__ import annotations

import json
import sys

EXIT_OK, EXIT_FINDING, EXIT_USAGE = 0, 1, 2


def fail(args, error, code: int = EXIT_USAGE) -> int:
    """Print the error (and, with --json, one JSON error line). Returns the exit code."""
    if hasattr(error, "to_wire"):
        wire = error.to_wire()
    elif hasattr(error, "code"):
        wire = {"code": error.code, "message": str(error)}
    else:
        wire = {"code": "error", "message": str(error)}
    print(f"error: {wire['message']}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"error": wire}))
    return code


def add_engine_args(parser) -> None:
    """--engine ADDR and the CURVE key flags of a client command."""
    parser.add_argument("--engine", default="tcp://127.0.0.1:5650", help="the engine's control endpoint")
    parser.add_argument("--server-key", help="the server's public key file (CURVE)")
    parser.add_argument("--client-key", help="this client's key file or key directory (CURVE)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for an answer")


def connect(args):
    """An EngineClient for --engine, with CURVE when key files are given."""
    from engine.client import EngineClient

    server_key = client_keys = None
    if args.server_key or args.client_key:
        from engine.wire.curve import load_client_keys, load_public_key

        if not (args.server_key and args.client_key):
            raise ValueError("CURVE needs both --server-key and --client-key")
        server_key = load_public_key(args.server_key)
        client_keys = load_client_keys(args.client_key)
    return EngineClient(args.engine, server_key=server_key, client_keys=client_keys, timeout_s=args.timeout)
