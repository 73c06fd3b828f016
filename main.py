"""PageWarden command line: `python main.py COMMAND --help` for each command.

Commands import what they need when they run, so `--help` and `capacity` stay fast.
"""

from __future__ import annotations

import argparse
import sys

from engine.commands import evidence, keys, kv_events, local, probe, remote, reproduce, serve


def add_gui_args(parser) -> None:
    parser.add_argument("--attach", metavar="ADDR", help="attach to a running engine instead of hosting one")
    parser.add_argument("--attach-kv-events", nargs="+", metavar="ADDR",
                        help="watch vLLM / SGLang KV-event streams (--kv-events-config publisher zmq), one ADDR "
                        "per data-parallel rank, instead of hosting or attaching to an engine")
    parser.add_argument("--replay", nargs="+", metavar="ADDR",
                        help="with --attach-kv-events: each ADDR's replay endpoint, same order ('-' for none)")
    parser.add_argument("--dialect", choices=["auto", "vllm", "sglang"],
                        help="with --attach-kv-events: the wire dialect (default auto: every known variant)")
    parser.add_argument("--fleet", metavar="URL",
                        help="open the Fleet view of the engines a Prometheus scrapes (http://prometheus:9090); "
                        "without --attach no engine is hosted")
    parser.add_argument("--fleet-refresh", type=float, metavar="SECONDS",
                        help="with --fleet: refresh every SECONDS (default: Prometheus's scrape interval)")
    parser.add_argument("--server-key", help="the engine's public key file (CURVE)")
    parser.add_argument("--client-keys", help="this client's key file or directory (CURVE)")
    parser.add_argument("--readonly", action="store_true", help="show only: every control action disabled")
    parser.add_argument("--config", help="config of the hosted engine (default: resources/configs/default.toml)")
    parser.add_argument("--allow-faults", action="store_true",
                        help="start the hosted engine with --allow-faults (reproducing incidents)")
    parser.add_argument("--theme", choices=["system", "dark", "light"], default="system")
    parser.add_argument("--demo-load", action="store_true", help="start the demo load at once")
    parser.add_argument("--screenshot", metavar="FILE", help="with --quit-after: save the window as a PNG")
    parser.add_argument("--quit-after", type=float, metavar="SECONDS", help="close the window after SECONDS")


def cmd_gui(args) -> int:
    from gui.app import run_gui

    return run_gui(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python main.py",
        description="PageWarden: prove that an inference engine gives each request only its own data.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    gui = sub.add_parser("gui", help="the desktop app (the default): host an engine or attach to one",
                         description="Open the PageWarden window. Without --attach or --attach-kv-events it hosts a "
                         "local engine.")
    add_gui_args(gui)
    gui.set_defaults(func=cmd_gui)
    local.register(sub)
    serve.register(sub)
    remote.register(sub)
    evidence.register(sub)
    keys.register(sub)
    reproduce.register(sub)
    kv_events.register(sub)
    probe.register(sub)
    from gui.snapshot import command as snapshot

    snapshot.register(sub)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """No command means the desktop app, hosting a local engine."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["gui"])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
