"""`python main.py snapshot`: export an incident snapshot from a running engine (no window)."""

from __future__ import annotations

import json
import time

from engine.client.command_line import EXIT_FINDING, EXIT_OK, EXIT_USAGE, add_engine_args, connect, fail


def register(sub) -> None:
    snap = sub.add_parser("snapshot", help="export an incident snapshot bundle (zip) from a running engine",
                          description="Writes one zip: manifest, state, page metadata, page-map PNGs, metrics, "
                                      "telemetry events, a Chrome trace and an HTML report (docs/SNAPSHOT.md). "
                                      "No prompt or output text is ever written.")
    add_engine_args(snap)
    snap.add_argument("--out", required=True, help="the bundle to write (FILE.zip)")
    snap.add_argument("--since", type=float, metavar="MINUTES", help="only the last MINUTES (default: all kept)")
    snap.add_argument("--json", action="store_true", help="end with one JSON line: path, files, warnings")
    snap.add_argument("--journal", metavar="FILE",
                      help="build the bundle from this evidence journal alone (the engine may be dead): its "
                           "alerts, crossings, requests and page-map keyframes; --since counts back from its end")
    snap.add_argument("--run", help="with --journal: one engine run only (default: every run in the journal)")
    snap.set_defaults(func=cmd_snapshot)


def cmd_snapshot(args) -> int:
    from engine.client import RemoteError
    from engine.evidence.journal_read import JournalError
    from gui.snapshot.bundle import read_bundle, write_bundle
    from gui.snapshot.collect import collect

    if args.since is not None and not args.since > 0:
        return fail(args, ValueError(f"--since {args.since} must be a positive number of minutes"), EXIT_USAGE)
    if not args.out.endswith(".zip"):
        return fail(args, ValueError(f"--out {args.out!r} must name a .zip file"), EXIT_USAGE)
    since = time.time() - 60 * args.since if args.since else None
    try:
        if args.journal:
            from engine.evidence.journal_source import JournalSource

            with JournalSource(args.journal, run=args.run) as source:
                since = source.until - 60 * args.since if args.since else source.runs[0]["started"] - 1.0
                snap = collect(source, since=since, endpoint=source.newest["control"] or "")
        else:
            with connect(args) as client:
                snap = collect(client, since=since, endpoint=args.engine)
    except (RemoteError, TimeoutError, ValueError, FileNotFoundError, JournalError) as exc:
        return fail(args, exc, EXIT_FINDING)
    try:
        path = write_bundle(snap, args.out)
    except OSError as exc:
        return fail(args, ValueError(f"cannot write {args.out}: {exc}"), EXIT_USAGE)
    opened = read_bundle(path)  # what a reviewer will get, checked
    pairs = opened.state["scope"]["pairs"]
    readers = {p["reader"] for p in pairs}
    print(f"wrote {path}: {len(opened.manifest['files'])} files, {len(opened.state['requests'])} requests, "
          f"{len(opened.state['alerts'])} alerts, {len(readers)} responses affected")
    for warning in opened.warnings:
        print(f"warning: {warning}")
    if args.json:
        print(json.dumps({"path": str(path), "files": [f["name"] for f in opened.manifest["files"]],
                          "affected": sorted(readers), "warnings": opened.warnings}))
    return EXIT_OK
