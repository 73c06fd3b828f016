"""`status`, `workers`, `submit`: commands that talk to a running engine via EngineClient."""

from __future__ import annotations

import json
import sys

from engine.commands.common import EXIT_FINDING, EXIT_OK, EXIT_USAGE, add_engine_args, connect, fail
from engine.commands.local import add_sampling_args, parse_ids


def register(sub) -> None:
    status = sub.add_parser("status", help="show a running engine's workers, pools and capacity")
    add_engine_args(status)
    status.add_argument("--json", action="store_true", help="print the status as one JSON line")
    status.set_defaults(func=cmd_status)

    workers = sub.add_parser("workers", help="list, start, stop or restart workers",
                             description="Without an action: list the workers.")
    add_engine_args(workers)
    workers.add_argument("action", nargs="?", choices=["list", "start", "stop", "restart"], default="list")
    workers.add_argument("name", nargs="?", help="worker name, e.g. decode-0")
    workers.add_argument("--json", action="store_true")
    workers.set_defaults(func=cmd_workers)

    canary = sub.add_parser("canary", help="fire a canary request now (a random marker others must never see)")
    add_engine_args(canary)
    canary.add_argument("--json", action="store_true")
    canary.set_defaults(func=cmd_canary)

    scope = sub.add_parser("scope", help="incident scoping: which requests received which others' data",
                           description="Affected pairs (reader, source, pages, times) from the engine's read log.")
    add_engine_args(scope)
    scope.add_argument("--since-minutes", type=float, help="only the last N minutes (default: all kept)")
    scope.add_argument("--journal", metavar="FILE",
                       help="answer from this evidence journal instead of a running engine (it may be dead)")
    scope.add_argument("--json", action="store_true")
    scope.set_defaults(func=cmd_scope)

    submit = sub.add_parser("submit", help="send a prompt to a running engine and stream the answer")
    add_engine_args(submit)
    source = submit.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text (tokenised by the engine)")
    source.add_argument("--prompt-ids", help="comma-separated prompt token ids")
    add_sampling_args(submit)
    submit.add_argument("--tenant", default="default")
    submit.add_argument("--data-tier", help="a label for the prompt log (e.g. public, confidential)")
    submit.add_argument("--request-id", help="your id for the request (default: assigned)")
    submit.add_argument("--json", action="store_true", help="end with one JSON line: token_ids, text, ...")
    submit.set_defaults(func=cmd_submit)


def _client_errors():
    from engine.client import RemoteError
    from engine.errors import PageWardenError
    from engine.evidence.journal_read import JournalError

    return (RemoteError, TimeoutError, ValueError, FileNotFoundError, PageWardenError, JournalError)


def cmd_status(args) -> int:
    try:
        with connect(args) as client:
            status = client.status()
    except _client_errors() as exc:
        return fail(args, exc, EXIT_FINDING)
    if args.json:
        print(json.dumps(status))
        return EXIT_OK
    eng = status["engine"]
    print(f"engine {eng['control']} (telemetry {eng['telemetry']}), model {eng['model']}, "
          f"up {eng['uptime_s']:.0f} s, curve {'on' if eng['curve'] else 'off'}")
    _print_workers(status["workers"])
    for finding in status["capacity"]:
        print(f"{'EXCEEDS' if finding['exceeds'] else 'ok':8}{finding['message']}")
    load = status["load"]
    print(f"queue {load['queue_depth']}, running {load['running']}, counters {status['counters']}")
    return EXIT_OK


def _print_workers(workers: list[dict]) -> None:
    print(f"{'name':12}{'role':9}{'state':10}{'pid':>8}  {'device':8}{'pages used/total':>18}  inflight")
    for w in workers:
        pool = w["pool"]
        used = f"{pool.get('used_pages') or 0}/{pool.get('pages') or '?'}"
        print(f"{w['name']:12}{w['role']:9}{w['state']:10}{str(w['pid'] or '-'):>8}  "
              f"{str(w['device'] or '-'):8}{used:>18}  {w['inflight']}")


def cmd_workers(args) -> int:
    try:
        with connect(args) as client:
            if args.action == "list":
                workers = client.status()["workers"]
                if args.json:
                    print(json.dumps({"workers": workers}))
                else:
                    _print_workers(workers)
                return EXIT_OK
            if not args.name:
                print(f"error: `workers {args.action}` needs a worker name", file=sys.stderr)
                return EXIT_USAGE
            result = getattr(client, args.action)(args.name)
    except _client_errors() as exc:
        return fail(args, exc, EXIT_FINDING)
    print(json.dumps(result) if args.json else f"{result['name']}: {result['state']}")
    return EXIT_OK


def cmd_submit(args) -> int:
    from engine.client import RemoteError

    try:
        prompt_ids = parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
        with connect(args) as client:
            stream = client.submit(
                prompt_ids, prompt=args.prompt, max_new_tokens=args.max_new_tokens,
                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                ignore_eos=args.ignore_eos, tenant=args.tenant, request_id=args.request_id, data_tier=args.data_tier,
            )
            done = None
            for msg in client.events(stream):
                if msg.op == "error":
                    error = msg.get("error") or {}
                    raise RemoteError(error.get("code", "error"), error.get("message", ""))
                if msg.op == "token" and not args.json:
                    sys.stdout.write(msg.get("text") or "")
                    sys.stdout.flush()
                if msg.op == "done":
                    done = msg.header
    except _client_errors() as exc:
        code = EXIT_USAGE if getattr(exc, "code", "") in ("invalid_request", "bad_message") else EXIT_FINDING
        return fail(args, exc, code)
    if done.get("error"):
        return fail(args, RemoteError(done["error"]["code"], done["error"]["message"]), EXIT_FINDING)
    result = {k: v for k, v in done.items() if k not in ("v", "op", "id")}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"\n[{len(done['token_ids'])} tokens, finish={done['finish_reason']}, "
              f"ttft {1e3 * (done['ttft_s'] or 0):.1f} ms, {done['elapsed_s']:.2f} s]", file=sys.stderr)
    return EXIT_OK


def cmd_canary(args) -> int:
    try:
        with connect(args) as client:
            result = client.call("canary")
    except _client_errors() as exc:
        return fail(args, exc, EXIT_FINDING)
    print(json.dumps(result) if args.json else f"canary {result['request_id']} sent (marker {result['marker']})")
    return EXIT_OK


def cmd_scope(args) -> int:
    import time

    since = time.time() - 60 * args.since_minutes if args.since_minutes else None
    try:
        if args.journal:
            from engine.evidence.journal_source import JournalSource

            with JournalSource(args.journal) as source:
                since = source.until - 60 * args.since_minutes if args.since_minutes else None
                result = source.call("scope", since=since)
        else:
            with connect(args) as client:
                result = client.call("scope", since=since)
    except _client_errors() as exc:
        return fail(args, exc, EXIT_FINDING)
    if args.json:
        print(json.dumps(result))
        return EXIT_OK
    pairs = result["pairs"]
    print(f"{len(pairs)} affected pair(s) ({result['reads']} cross-request reads logged)")
    for p in pairs:
        print(f"  {p['reader']} received data of {p['source'] or 'slot ' + str(p['source_slot'])}: "
              f"{len(p['pages'])} page(s), {p['reads']} read(s)")
    return EXIT_FINDING if pairs else EXIT_OK
