"""Reading the hot messages: today's field_of checks against the typed msgspec read, side by side.

    python bench/wire_messages.py [--iterations 100000] [--batch 32] [--prompt 512]

For a `tokens` bus message (a decode step of --batch requests) and a `submit` of a
--prompt-token prompt, each message is unpacked from its frames and its fields read and
checked, once the old way (field_of, as WorkerEvents.on_tokens and SubmitOps.submit read
them) and once the new (engine/wire/messages/codec.py::read). Sending is measured too:
a dict packed as the senders built it, against a struct through header_of. Prints
microseconds per message and the ratio old / new (above 1: the typed path is faster).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import msgspec  # noqa: E402

from engine.wire.messages import control, to_supervisor  # noqa: E402
from engine.wire.messages.codec import header_of, read  # noqa: E402
from engine.wire.messages.registry import BUS_TO_SUPERVISOR, CONTROL  # noqa: E402
from engine.wire.protocol import field_of, pack, unpack  # noqa: E402

MAX_PROMPT_TOKENS = control.MAX_PROMPT_TOKENS


def tokens_header(batch: int) -> dict:
    return {"op": "tokens", "items": [[f"http-{i:032x}", [1000 + i]] for i in range(batch)],
            "finished": [[f"http-{0:032x}", "length", None]], "free_pages": 4096}


def submit_header(prompt: int) -> dict:
    return {"op": "submit", "id": 7, "request_id": "http-0123456789abcdef", "tenant": "acme", "client": "10.0.0.1",
            "prompt_ids": list(range(prompt)), "max_new_tokens": 64, "temperature": 0.7, "top_p": 0.9,
            "ignore_eos": False, "stream": True}


def old_tokens(frames) -> int:
    msg = unpack(frames)
    field_of(msg, "free_pages", "int")
    n = 0
    for rid, tokens in field_of(msg, "items", "list"):
        n += len(tokens)
    for rid, reason, error in field_of(msg, "finished", "list"):
        n += 1
    return n


def new_tokens(frames) -> int:
    msg = read(unpack(frames), BUS_TO_SUPERVISOR)
    n = 0
    for rid, tokens in msg.items:
        n += len(tokens)
    for rid, reason, error in msg.finished:
        n += 1
    return n


def old_submit(frames) -> int:
    msg = unpack(frames)
    field_of(msg, "request_id", "str", default="r1", max_len=128)
    field_of(msg, "tenant", "str", default="default", max_len=64)
    field_of(msg, "data_tier", "str", default=None, max_len=64)
    field_of(msg, "client", "str", default="", max_len=128)
    field_of(msg, "max_new_tokens", "int", default=16)
    float(field_of(msg, "temperature", "float", default=0.0))
    field_of(msg, "top_k", "int", default=0)
    float(field_of(msg, "top_p", "float", default=1.0))
    field_of(msg, "seed", "int", default=None)
    field_of(msg, "ignore_eos", "bool", default=False)
    tuple(field_of(msg, "stop_token_ids", "list[int]", default=[], max_len=64))
    field_of(msg, "stream", "bool", default=True)
    ids = field_of(msg, "prompt_ids", "list[int]", default=None, max_len=MAX_PROMPT_TOKENS)
    field_of(msg, "prompt", "str", default=None, max_len=8 * MAX_PROMPT_TOKENS)
    return len(ids)


def new_submit(frames) -> int:
    msg = read(unpack(frames), CONTROL)
    msg.params()
    return len(msg.prompt_ids)


def timed(fn, arg, iterations: int) -> float:
    """Microseconds per call, the best of three runs."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iterations):
            fn(arg)
        best = min(best, time.perf_counter() - start)
    return best / iterations * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=32, help="requests in one tokens message")
    parser.add_argument("--prompt", type=int, default=512, help="token ids in the submit")
    args = parser.parse_args()
    tokens, submit = tokens_header(args.batch), submit_header(args.prompt)
    tokens_struct = msgspec.convert(tokens, to_supervisor.Tokens)
    submit_struct = msgspec.convert(submit, control.Submit)
    assert header_of(tokens_struct) == {**tokens, "items": [tuple(i) for i in tokens["items"]],
                                        "finished": [tuple(f) for f in tokens["finished"]]}
    assert old_tokens(pack(tokens)) == new_tokens(pack(tokens)) and old_submit(pack(submit)) == new_submit(pack(submit))
    cases = [
        (f"read tokens ({args.batch} requests)", old_tokens, new_tokens, pack(tokens), pack(tokens)),
        (f"read submit ({args.prompt} ids)", old_submit, new_submit, pack(submit), pack(submit)),
        (f"send tokens ({args.batch} requests)", pack, lambda m: pack(header_of(m)), tokens, tokens_struct),
        (f"send submit ({args.prompt} ids)", pack, lambda m: pack(header_of(m)), submit, submit_struct),
    ]
    print(f"# wire_messages: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, msgspec {msgspec.__version__}, {args.iterations:,} iterations")
    print("| message | old (dict, field_of): us | new (msgspec struct): us | old / new |")
    print("|---|---:|---:|---:|")
    for name, old, new, old_arg, new_arg in cases:
        before, after = timed(old, old_arg, args.iterations), timed(new, new_arg, args.iterations)
        print(f"| {name} | {before:.2f} | {after:.2f} | {before / after:.2f} |")


if __name__ == "__main__":
    main()
