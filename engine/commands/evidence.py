"""`evidence --journal FILE`: who received whose data, from the evidence journal alone.

The engine may be dead, restarted or on another machine: the journal (SQLite) is the record.
"""

from __future__ import annotations

import json
import time

from engine.commands.common import EXIT_FINDING, EXIT_OK, EXIT_USAGE, fail

SHOWN = 50  # pairs, episodes and requests printed per list (each list says how many it left out)


def register(sub) -> None:
    evidence = sub.add_parser(
        "evidence", help="who received whose data, from an evidence journal (the engine may be dead)",
        description="Read an engine's evidence journal ([audit] journal; `status` names it): the runs, every "
                    "alert episode, the affected pairs with their tenants, the requests rejected or served from a "
                    "placeholder. Exit 1 when any data crossed between requests.")
    evidence.add_argument("--journal", required=True, metavar="FILE", help="the journal (a .sqlite file)")
    evidence.add_argument("--run", help="one run only (default: every run in the journal)")
    evidence.add_argument("--since-minutes", type=float, help="only the last N minutes before the journal's end")
    evidence.add_argument("--json", action="store_true", help="print one JSON object")
    evidence.set_defaults(func=cmd_evidence)


def summarize(source, since: float | None) -> dict:
    """The answer to "who received whose data": from a JournalSource."""
    status = source.status()
    pairs = source.call("scope", since=since)["pairs"]
    requests = source.call("history", since=since)["requests"]
    tenants: dict[tuple, dict] = {}
    for pair in pairs:
        key = (pair.get("reader_tenant"), pair.get("source_tenant"))
        row = tenants.setdefault(key, {"reader_tenant": key[0], "source_tenant": key[1], "pairs": 0, "reads": 0,
                                       "readers": set()})
        row["pairs"] += 1
        row["reads"] += pair["reads"]
        row["readers"].add((pair.get("run"), pair["reader"]))
    by_tenant = [{**row, "readers": len(row["readers"])} for row in tenants.values()]
    by_tenant.sort(key=lambda r: -r["reads"])
    alerts = [a for a in status["alerts"] if since is None or (a.get("last_seen") or 0) >= since]
    return {
        "journal": status["engine"]["journal"], "runs": status["engine"]["runs"],
        "pairs": pairs, "reads": sum(p["reads"] for p in pairs),
        "readers": len({(p.get("run"), p["reader"]) for p in pairs}), "tenants": by_tenant,
        "alerts": alerts,
        "rejected": [r["request_id"] for r in requests if r["phase"] == "rejected"],
        "placeholders": [r["request_id"] for r in requests if r.get("placeholder")],
        "prunes": status["evidence"]["prunes"],
    }


def cmd_evidence(args) -> int:
    from engine.evidence.journal_read import JournalError
    from engine.evidence.journal_source import JournalSource

    if args.since_minutes is not None and not args.since_minutes > 0:
        return fail(args, ValueError(f"--since-minutes {args.since_minutes} must be a positive number"), EXIT_USAGE)
    try:
        with JournalSource(args.journal, run=args.run) as source:
            since = source.until - 60 * args.since_minutes if args.since_minutes else None
            result = summarize(source, since)
    except JournalError as exc:
        return fail(args, exc, EXIT_USAGE)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as exc:  # rows of the wrong shape
        return fail(args, JournalError(f"{args.journal} holds rows this version cannot read "
                                       f"({type(exc).__name__}: {exc})"), EXIT_USAGE)
    if args.json:
        print(json.dumps(result))
        return EXIT_FINDING if result["pairs"] else EXIT_OK
    _print(result)
    return EXIT_FINDING if result["pairs"] else EXIT_OK


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "?"


def _cut(items: list, what: str) -> list:
    if len(items) > SHOWN:
        print(f"  (+{len(items) - SHOWN:,} more {what} not shown; --json lists them all)")
    return items[:SHOWN]


def _print(result: dict) -> None:
    print(f"evidence journal {result['journal']}")
    for run in result["runs"]:
        end = (f"ended {_when(run['ended'])}" if run["clean"] else
               "did not end cleanly (crashed or killed): its last second may be missing")
        print(f"  run {run['run']}: started {_when(run['started'])}, {end}")
    for prune in result["prunes"]:
        print(f"  pruned {prune['rows']:,} rows older than {_when(prune['older_than'])} ({prune['reason']})")
    alerts = result["alerts"]
    print(f"{len(alerts)} alert episode(s)")
    for a in _cut(alerts, "episodes"):
        flags = " [previous run]" if a.get("previous_run") else ""
        print(f"  {a.get('key')}: {a.get('severity')} {a.get('state')}, x{a.get('count')}, {_when(a.get('first_seen'))}"
              f" - {_when(a.get('last_seen'))}{flags}")
    print(f"{len(result['rejected'])} request(s) rejected by admission; {len(result['placeholders'])} served from a "
          f"placeholder")
    pairs = result["pairs"]
    if not pairs:
        print("no data crossed between requests in the journal")
        return
    print(f"DATA CROSSED: {result['readers']} response(s) received other requests' data: {len(pairs)} pair(s), "
          f"{result['reads']:,} reads")
    for row in result["tenants"]:
        print(f"  tenant {row['reader_tenant'] or '?'} received tenant {row['source_tenant'] or '?'}'s data: "
              f"{row['readers']} response(s), {row['pairs']} pair(s), {row['reads']:,} reads")
    for p in _cut(pairs, "pairs"):
        source = p["source"] or f"slot {p['source_slot']}"
        print(f"  {p['reader']} ({p.get('reader_tenant') or '?'}) received data of {source} "
              f"({p.get('source_tenant') or '?'}): {len(p['pages'])} page(s), {p['reads']:,} read(s), "
              f"{_when(p['first'])} - {_when(p['last'])}")
