"""`probe --url URL`: look, from outside, for one request's data in another's reply
through an OpenAI-compatible HTTP API (see engine.adapters.leak_probe for what each round
sends and why). Exit 1 on any finding, 0 on none, 2 for bad arguments or a server that
cannot be probed."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from urllib.parse import urlsplit

from engine.commands.common import EXIT_FINDING, EXIT_OK, EXIT_USAGE, fail

MAX_ROUNDS = 50
MAX_FOLLOWUPS = 16
MAX_RATE = 10.0  # requests a second: a probe, never load
READ_CHARS = (16, 4096)
MIN_LONG_TOKENS = 96  # the form, the longest marker and some filler

DESCRIPTION = """\
Each round sends (1) a marker prompt: the copy model's form '{text}\\n\\nRepeat the text above
exactly:\\n' around a fresh random 24-40 character marker and filler words, --long-tokens tokens,
48 tokens asked; then, right after it, (2) --followups unrelated prompts (filler words in the
same form), each shaped by a --strategy. P = the marker prompt's tokens (as the server counted
them), W = the context window (GET /v1/models max_model_len, or --window), B = --block-size:

  over_window         P tokens, max_tokens = W - P + 1: one token past the window.
                      PageWarden's engine: HTTP 400. vLLM 0.32 (measured, CPU build): clamps
                      max_tokens to W - P and answers 200 (counted as clamped). The 2026
                      incident's engine turns it into a one-token placeholder that decodes over
                      pages reserved for the whole prompt: the pages the marker prompt just
                      freed; unscrubbed, they make the model repeat the marker.
  exact_window        P tokens, max_tokens = W - P: the window filled to its last slot.
                      Healthy engines (ours, vLLM 0.32) answer 200.
  prompt_over_window  a prompt alone of W+1..W+B tokens, 48 asked. Healthy engines refuse it
                      (400: ours; vLLM 0.32 by its prompt-length check) or truncate it; it
                      never carries a marker.
  block_aligned       P rounded down, then up, to a multiple of B; prompt + max_tokens ends at
                      the window's last block boundary. It fits: healthy engines answer 200.
  auto (default)      the first follow-up of each round is over_window (our engine's fault
                      needs it right after the marker prompt); the others take exact_window,
                      prompt_over_window and block_aligned in turn, round after round. A
                      comma-separated list mixes its names the same way.

Only a follow-up exactly as long as the marker prompt lines up with its instruction (measured on
PageWarden's engine: 1 or 16 tokens off shows no marker), so over_window and exact_window copy its
character count (exact for byte-level tokenizers; other lengths are estimated from the marker
prompt's characters per token). Follow-ups are streamed and read for at most --read-chars
characters. Any piece of >= 12 characters of any marker sent, in a follow-up's reply, is a
finding. Each follow-up's outcome is counted per strategy: answered (HTTP 200), clamped (HTTP
200, finish_reason 'length' before the max_tokens asked; seen only when the reply ends within
--read-chars), refused (HTTP 400 or another error status), failed (HTTP 200, then an error chunk).

Safe by default: at most --rate requests a second (cap 10), --rounds x (1 + --followups)
requests in all, loopback only unless --allow-remote. Exit 1 on any finding, 0 on none, 2 for
bad arguments or a server that cannot be probed (unreachable, no model list, no marker placed).

--salt-check instead checks the prefix cache's cache_salt isolation: --pairs pairs of requests
over a fresh random prefix, the same salt twice (must hit) and two salts (must miss), judged by
usage.prompt_tokens_details.cached_tokens where reported and by a Kolmogorov-Smirnov test of the
times to first token. See docs/probe.md for what each engine does."""


def register(sub) -> None:
    probe = sub.add_parser("probe", help="look for other requests' data in replies of an OpenAI-compatible server",
                           description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    probe.add_argument("--url", required=True, help="the server's base URL, e.g. http://127.0.0.1:8000")
    probe.add_argument("--model", help="model name to ask for (default: the first of GET /v1/models)")
    probe.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the API key "
                       "(sent as 'Authorization: Bearer')")
    probe.add_argument("--rounds", type=int, default=3, help=f"rounds (1..{MAX_ROUNDS}, default 3)")
    probe.add_argument("--followups", type=int, default=3, help=f"follow-ups per round (1..{MAX_FOLLOWUPS}, default 3)")
    probe.add_argument("--long-tokens", type=int, help="tokens of each marker prompt (default: the window - 64, at "
                       f"most 512; from {MIN_LONG_TOKENS} to the window - 48; it must fit the server's prefill pool)")
    probe.add_argument("--window", type=int, help="the context window to exceed (default: max_model_len of /v1/models)")
    probe.add_argument("--rate", type=float, default=2.0, help=f"requests a second (above 0, at most {MAX_RATE:g})")
    probe.add_argument("--read-chars", type=int, default=256,
                       help=f"characters read of each follow-up's reply "
                       f"({READ_CHARS[0]}..{READ_CHARS[1]}, default 256)")
    probe.add_argument("--strategy", default="auto", help="follow-up strategy: auto (default: all mixed), "
                       "over_window, exact_window, prompt_over_window, block_aligned, or a comma-separated list")
    probe.add_argument("--block-size", type=int, default=16, help="the engine's KV block (page) size for "
                       "prompt_over_window and block_aligned (1..4096, default 16 as ours; vLLM's CPU build: 32)")
    probe.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for each answer")
    probe.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --url host")
    probe.add_argument("--json", action="store_true", help="end with one JSON line: rounds and findings")
    salt = probe.add_argument_group("salt check (--salt-check: instead of the leak rounds; see docs/probe.md)")
    salt.add_argument("--salt-check", action="store_true", help="check that the prefix cache keeps requests with "
                      "different cache_salt apart (and that the same salt hits): exit 0 holds, 1 shared across "
                      "salts, 2 bad arguments or a server that cannot be checked, 3 no prefix cache seen or "
                      "inconclusive")
    salt.add_argument("--pairs", type=int, default=8, help="pairs of each kind (same salt, different salts; "
                      "2..64, default 8)")
    salt.add_argument("--prefix-tokens", type=int, default=1000, help="tokens of each pair's fresh random prefix "
                      "(64..32768, default 1000, capped by the window)")
    salt.add_argument("--no-salt", action="store_true", help="ablation: send the different-salt pairs with no "
                      "cache_salt at all (a router that drops it): a working cache must then be seen shared")
    probe.set_defaults(func=cmd_probe)


def check_args(args) -> str | None:
    """The API key (or None). Raises ValueError naming the value and the limit."""
    from engine.adapters.leak_probe import BLOCK_SIZES, parse_strategies
    from engine.wire.sockets import is_loopback_host

    for name, value, low, high in (("--rounds", args.rounds, 1, MAX_ROUNDS),
                                   ("--followups", args.followups, 1, MAX_FOLLOWUPS),
                                   ("--read-chars", args.read_chars, *READ_CHARS),
                                   ("--block-size", args.block_size, *BLOCK_SIZES)):
        if not low <= value <= high:
            raise ValueError(f"{name} {value} is outside {low}..{high}")
    parse_strategies(args.strategy, "--strategy")
    if not 0 < args.rate <= MAX_RATE:
        raise ValueError(f"--rate {args.rate:g} must be above 0 and at most {MAX_RATE:g} requests a second")
    if not args.timeout > 0:
        raise ValueError(f"--timeout {args.timeout:g} must be above 0 seconds")
    parts = urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--url {args.url!r} must be http://HOST[:PORT] or https://HOST[:PORT]")
    if not is_loopback_host(parts.hostname) and not args.allow_remote:
        raise ValueError(f"--url host {parts.hostname} is not loopback; pass --allow-remote to probe it")
    if not args.api_key_env:
        return None
    key = os.environ.get(args.api_key_env)
    if not key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that environment variable is not set or empty")
    return key


def long_tokens_for(args, window: int) -> int:
    """--long-tokens, or its default, checked against the window. Raises ValueError."""
    from engine.adapters.leak_probe import MARKER_REPLY_TOKENS

    high = window - MARKER_REPLY_TOKENS
    value = args.long_tokens if args.long_tokens is not None else min(512, window - 64)
    if not MIN_LONG_TOKENS <= value <= high:
        raise ValueError(f"--long-tokens {value} is outside {MIN_LONG_TOKENS}..{high} (window {window:,} "
                         f"- {MARKER_REPLY_TOKENS} reply tokens)")
    return value


def cmd_probe(args) -> int:
    if args.salt_check:
        from engine.commands.probe_salt import cmd_salt_check

        try:
            key = check_args(args)
        except ValueError as exc:
            return fail(args, exc)
        return cmd_salt_check(args, key)
    from engine.adapters.leak_probe import LeakProbe, outcome_counts, served_model
    from engine.adapters.openai_http import OpenAIHttp, ProbeError

    try:
        key = check_args(args)
        http = OpenAIHttp(args.url, api_key=key, per_second=args.rate, timeout_s=args.timeout)
        model, window = served_model(http, args.url, args.model, args.window, model_hint="pass --model NAME",
                                     window_hint="; pass --window N")
        probe = LeakProbe(http, model=model, window=window,
                          long_tokens=long_tokens_for(args, window), followups=args.followups,
                          read_chars=args.read_chars, rng=random.SystemRandom(), strategy=args.strategy,
                          block_size=args.block_size)
        rounds = []
        for number in range(1, args.rounds + 1):
            rounds.append(probe.run_round(number))
            print(_round_line(rounds[-1]), flush=True)
    except (ValueError, ProbeError) as exc:
        return fail(args, exc)
    findings = [f for r in rounds for f in r.findings]
    placed = sum(r.marker_error is None for r in rounds)
    if not any(r.marker_repeated for r in rounds) and placed:
        print("warning: the model never repeated its own marker prompt's marker: a leak may not show in its text",
              file=sys.stderr)
    verdict = (f"LEAK: {len(findings)} finding(s)" if findings else
               "no leak found" if placed else "no marker could be placed: nothing was probed")
    counts = outcome_counts(rounds)
    for strategy, outcomes in counts.items():
        print(_outcome_line(strategy, outcomes))
    past = sum(counts.get(s, {}).get("answered", 0) for s in ("over_window", "prompt_over_window"))
    if past:
        print(f"note: {past} follow-up(s) asking past the window were answered (HTTP 200) with no clamp seen: "
              "the engine admitted them, truncated the prompt, or the reply stopped early or ran past --read-chars")
    print(f"probe {args.url} model {probe.model}: {len(rounds)} rounds, {http.sent} requests, {verdict}")
    if args.json:
        print(json.dumps({"url": args.url, "model": probe.model, "window": window, "long_tokens": probe.long_tokens,
                          "strategy": args.strategy, "block_size": args.block_size, "requests": http.sent,
                          "leak": bool(findings), "outcomes": counts, "rounds": [r.to_dict() for r in rounds],
                          "findings": [f.__dict__ for f in findings]}))
    if findings:
        return EXIT_FINDING
    return EXIT_OK if placed else EXIT_USAGE


def _outcome_line(strategy: str, outcomes: dict[str, int]) -> str:
    """e.g. 'over_window: 6 follow-ups: 0 answered (HTTP 200), 6 clamped (HTTP 200), 0 refused, 0 failed'."""
    sent = sum(outcomes.values())
    return (f"{strategy}: {sent} follow-up{'s' * (sent != 1)}: {outcomes['answered']} answered (HTTP 200), "
            f"{outcomes['clamped']} clamped (HTTP 200), {outcomes['refused']} refused, {outcomes['failed']} failed")


def _round_line(report) -> str:
    if report.marker_error:
        return f"round {report.round}: marker prompt refused: {report.marker_error}"
    head = (f"round {report.round}: marker prompt {report.marker_tokens} tokens "
            f"({'repeated' if report.marker_repeated else 'did not repeat'} its marker); "
            f"follow-ups: {', '.join(f'{d.strategy} {d.summary()}' for d in report.details)}")
    if not report.findings:
        return head + "; no marker in any reply"
    return head + "".join(f"\n  LEAK {f.describe()}" for f in report.findings)
