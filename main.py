"""PageWarden command line: `python main.py COMMAND --help` for each command.

Commands import what they need when they run, so `--help` and `capacity` stay fast.
"""

from __future__ import annotations

import argparse
import sys

from engine.commands import keys, local, remote, serve
from engine.commands.common import EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python main.py",
        description="PageWarden: prove that an inference engine gives each request only its own data.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    local.register(sub)
    serve.register(sub)
    remote.register(sub)
    keys.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        # Until the desktop app exists, no command means: show what there is.
        parser.print_help()
        return EXIT_OK
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
