"""`watch-kv-events ADDR ...`: attach to vLLM / SGLang KV-cache event streams for N seconds
and report the blocks each data-parallel rank holds and the health of every stream."""

from __future__ import annotations

import json
import sys

from engine.commands.common import EXIT_OK, EXIT_USAGE, fail

MAX_SECONDS = 7 * 24 * 3600
NO_REPLAY = ("-", "none")  # a --replay placeholder for an ADDR that has no replay endpoint


def register(sub) -> None:
    watch = sub.add_parser(
        "watch-kv-events", help="watch vLLM / SGLang KV-cache event streams (--kv-events-config) for N seconds",
        description="Subscribe to each ADDR (an engine's KV-event PUB endpoint, e.g. tcp://gpu-box:5557; vLLM "
        "and SGLang offset the port by the data-parallel rank), decode every batch, keep the blocks each rank "
        "holds, take the history the replay endpoint still buffers on connecting, detect sequence gaps and fill "
        "them from the replay endpoint, then print a summary. "
        "Exit 0 when watched, 2 for bad arguments.",
    )
    watch.add_argument("addresses", nargs="+", metavar="ADDR", help="tcp://HOST:PORT or ipc://PATH")
    watch.add_argument("--replay", nargs="+", metavar="ADDR", default=[],
                       help="replay ROUTER endpoint of each ADDR, in the same order ('-' for none)")
    watch.add_argument("--dialect", choices=["auto", "vllm", "sglang"], default="auto",
                       help="wire dialect (default auto: accepts every known vLLM and SGLang variant)")
    watch.add_argument("--seconds", type=float, required=True, help="how long to watch")
    watch.add_argument("--json", action="store_true", help="end with one JSON line: the summary")
    watch.set_defaults(func=cmd_watch_kv_events)


def check_args(args) -> list[str | None]:
    """The replay list, one entry per ADDR; ValueError naming the bad value and the limit."""
    if not 0 < args.seconds <= MAX_SECONDS:
        raise ValueError(f"--seconds {args.seconds:g} is out of range; it must be more than 0 and at most "
                         f"{MAX_SECONDS} (a week)")
    if len(args.replay) > len(args.addresses):
        raise ValueError(f"--replay has {len(args.replay)} addresses for {len(args.addresses)} ADDR; give at most "
                         "one per ADDR, in the same order ('-' for none)")
    return [None if r.lower() in NO_REPLAY else r for r in args.replay]


def format_table(summary: dict) -> str:
    """A short human report of a watch summary."""
    lines = [f"watched {', '.join(summary['endpoints'])} for {summary['seconds']:g} s"]
    if not summary["ranks"]:
        lines.append("no KV events received")
    for rank, info in summary["ranks"].items():
        media = ", ".join(f"{m} {n}" for m, n in info["by_medium"].items()) or "none"
        lines.append(f"rank {rank:>3}  {info['blocks']:>8,} blocks  ({media})")
    events = summary["events"]
    lines.append("events   " + "  ".join(f"{name} {events.get(name, 0):,}" for name in
                                        ("BlockStored", "BlockRemoved", "AllBlocksCleared")))
    lines.append(f"stream   gaps {summary['gaps']} (unfilled {summary['gaps_unfilled']})  replays "
                 f"{summary['replays']} (failed {summary['replay_failures']})  history {summary['history_fetches']} "
                 f"(failed {summary['history_failures']}, {summary['history_batches']:,} batches)  refused "
                 f"{summary['refused']} live, {summary['replay_refused']} replayed  restarts {summary['restarts']}  "
                 f"sequence jumps {summary['seq_jumps']}  disconnects {summary['disconnects']}")
    lines.append(f"bound    {summary['blocks']:,} blocks held of at most {summary['block_limit']:,}; "
                 f"{summary['over_block_limit']} batches refused for that limit")
    lines += [f"refused: {message}" for message in summary["recent_refusals"]]
    lines += [f"refused replay answer: {message}" for message in summary["recent_replay_refusals"]]
    lines += [f"notice: {message}" for message in summary["notices"]]
    return "\n".join(lines)


def cmd_watch_kv_events(args) -> int:
    from engine.adapters.kv_event_decode import KvEventError
    from engine.adapters.kv_event_watch import KvEventWatcher

    try:
        replay = check_args(args)
        watcher = KvEventWatcher(args.addresses, replay, args.dialect)
    except (ValueError, KvEventError) as exc:
        return fail(args, exc, EXIT_USAGE)
    with watcher:
        try:
            watcher.run_for(args.seconds)
        except KeyboardInterrupt:
            print("interrupted: summary so far", file=sys.stderr)
        summary = {**watcher.state.summary(), "endpoints": watcher.endpoints, "seconds": args.seconds}
    print(json.dumps(summary) if args.json else format_table(summary))
    return EXIT_OK
