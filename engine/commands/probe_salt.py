"""`probe --salt-check`: does the server's prefix cache keep different cache_salt values
apart, and does the same salt hit? (engine.adapters.salt_check says how it is judged.)
Exit 0 salt isolation holds, 1 cache shared across salts, 2 bad arguments or a server that
cannot be checked, 3 no prefix cache seen or inconclusive."""

from __future__ import annotations

import json

from engine.commands.common import EXIT_FINDING, EXIT_OK, fail

EXIT_UNDECIDED = 3  # the check ran but cannot say that isolation holds


def cmd_salt_check(args, key: str | None) -> int:
    """Run the check with `args` (already through probe's check_args) and the API key `key`."""
    from engine.adapters.openai_http import ProbeError
    from engine.adapters.salt_check import HOLDS, PAIRS, PREFIX_TOKENS, SHARED, open_salt_check

    try:
        for name, value, (low, high) in (("--pairs", args.pairs, PAIRS), ("--prefix-tokens", args.prefix_tokens,
                                                                           PREFIX_TOKENS)):
            if not low <= value <= high:
                raise ValueError(f"{name} {value} is outside {low}..{high}")
        check = open_salt_check(args.url, model=args.model, window=args.window, pairs=args.pairs,
                                prefix_tokens=args.prefix_tokens, no_salt=args.no_salt, rate=args.rate,
                                timeout_s=args.timeout, api_key=key)
        report = check.run()
    except (ValueError, ProbeError) as exc:
        return fail(args, exc)
    for pair in report.pairs:
        print(f"pair {pair.number} {pair.kind}: cold {pair.cold_ttft_s * 1000:.1f} ms (cached {pair.cold_cached}), "
              f"second {pair.second_ttft_s * 1000:.1f} ms (cached {pair.second_cached})")
    print("\n".join(report.lines()), flush=True)
    if args.json:
        print(json.dumps({"url": args.url, "mode": "salt_check", **report.to_dict()}))
    if report.verdict == SHARED:
        return EXIT_FINDING
    return EXIT_OK if report.verdict == HOLDS else EXIT_UNDECIDED
