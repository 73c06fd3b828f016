"""vLLM's own view of its KV events, for tests: runs under vLLM's interpreter and decodes with
vLLM's own msgspec types (vllm.distributed.kv_events.KVEventBatch), not with PageWarden's decoder.

    python vllm_kv_truth.py ENDPOINT

Subscribes to ENDPOINT, prints "ready" once connected and folds every batch. Each line on stdin
asks for one JSON line: the blocks held (stored minus removed, by hash), the batches seen, the
first and last sequence numbers and the gaps between them (0 when nothing was lost). It ends at
the end of stdin.
"""

from __future__ import annotations

import json
import sys
import threading

import msgspec
import zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch


def main(endpoint: str) -> None:
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    held: set = set()
    batches, first, last, gaps = 0, None, None, 0
    asked, stop = threading.Event(), threading.Event()

    def read_stdin() -> None:
        for _line in sys.stdin:
            asked.set()
        stop.set()

    threading.Thread(target=read_stdin, daemon=True).start()
    print("ready", flush=True)
    while not stop.is_set():
        if asked.is_set() and not sub.poll(200):  # answer once the stream has been quiet a moment
            asked.clear()
            print(json.dumps({"blocks": len(held), "batches": batches, "first_seq": first, "last_seq": last,
                              "gaps": gaps}), flush=True)
        if not sub.poll(50):
            continue
        _topic, seq_bytes, payload = sub.recv_multipart()
        seq = int.from_bytes(seq_bytes, "big")
        if last is not None and seq != last + 1:
            gaps += 1
        first = seq if first is None else first
        last = seq
        batches += 1
        for event in decoder.decode(payload).events:
            if isinstance(event, BlockStored):
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                held.clear()


if __name__ == "__main__":
    main(sys.argv[1])
