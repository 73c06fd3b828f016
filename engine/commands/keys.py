"""`keys generate DIR`: CurveZMQ key files for a remote engine and its clients (0600)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.commands.common import EXIT_OK, fail


def register(sub) -> None:
    keys = sub.add_parser("keys", help="create CurveZMQ key files for remote use",
                          description="Create server and client key files for `serve --curve`.")
    keys_sub = keys.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    gen = keys_sub.add_parser("generate", help="write server.key(_secret) and clients/client*.key(_secret)")
    gen.add_argument("dir", help="directory to write the keys into")
    gen.add_argument("--clients", type=int, default=1, help="how many client key pairs (default 1)")
    gen.add_argument("--force", action="store_true", help="overwrite existing key files")
    gen.add_argument("--json", action="store_true")
    gen.set_defaults(func=cmd_keys_generate)


def cmd_keys_generate(args) -> int:
    from engine.wire.curve import generate_keys

    try:
        written = generate_keys(Path(args.dir), clients=args.clients, overwrite=args.force)
    except (FileExistsError, ValueError, OSError) as exc:
        return fail(args, exc)
    if args.json:
        print(json.dumps({k: str(v) if not isinstance(v, (list, dict)) else v for k, v in written.items()},
                         default=str))
    else:
        print(f"keys written to {args.dir} (0600): give clients their clients/<name>.key_secret "
              f"and the server's server.key; the server admits only keys in {args.dir}/clients")
    return EXIT_OK
