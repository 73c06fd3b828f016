"""Every operation on the bus between the supervisor and its workers, declared once.

The supervisor sends only TO_WORKER ops (`Supervisor.to_worker` refuses any other) and handles
exactly TO_SUPERVISOR ops (`WorkerEvents.on_<op>`, one each; tests/engine/wire/test_bus_ops.py
holds the two lists to the handlers); a worker sends only TO_SUPERVISOR ops (`WorkerLoop.send`)
and answers TO_WORKER ops (`WorkerLoop.on_bus`, then its role's `handle`). Adding an op is an
entry here plus its sender and its handler. What each carries is said beside it; the header
fields are read with `field_of`, which names a missing or mistyped one.
"""

from __future__ import annotations

TO_WORKER = {
    "reserve": "decode: reserve pages for a request (request_id, prompt_len, max_new_tokens, ...)",
    "prefill": "prefill: compute a request's prompt and ship its pages to the decode worker's endpoint",
    "cancel": "either: stop a request now (request_id)",
    "release": "decode: give back a request's pages (request_id)",
    "forget_endpoint": "prefill: close the transfer socket of a decode worker that went away",
    "configure": "either: live settings (engine keys, defences, faults), applied between steps",
    "telemetry": "either: send page telemetry or not (pages: bool), as the telemetry socket has viewers",
    "keyframe": "either: send a pages keyframe now (a viewer asked)",
    "page_metadata": "either: the pool's page arrays for a snapshot (ask_id)",
    "cross_reads": "either: the cross-request reads it saw (ask_id), for reproduction's ground truth",
    "ping": "either: nothing; an answerable message",
    "stop": "either: finish and exit",
}

TO_SUPERVISOR = {
    "hello": "a started worker: its name, role, pool, kernels and spawn token",
    "heartbeat": "liveness and stats (free and used pages, ...), every 0.5 s",
    "bad_command": "a bus message it could not read",
    "reserved": "decode: pages reserved for a request (reservation, free_pages)",
    "reserve_failed": "decode: no room for a request",
    "prefilled": "prefill: the prompt is computed and its transfer sent",
    "prefill_failed": "prefill: the prompt could not be computed or shipped",
    "transfer_done": "decode: a transfer arrived and its manifest check passed or failed",
    "tokens": "decode: new tokens of running requests",
    "cancel_ack": "either: a cancelled request is stopped",
    "released": "decode: a request's pages went back",
    "pages": "page telemetry (keyframe or delta arrays), relayed to viewers",
    "alert": "an alert the worker raised (kind, severity, detail, ...)",
    "isolation": "what the I1 check found in a decode step",
    "cross_reads": "the answer to cross_reads (ask_id, reads)",
    "page_metadata": "the answer to page_metadata (ask_id, arrays)",
}


def check_op(op: str, allowed: dict[str, str], direction: str) -> None:
    """A send of an undeclared op is a programming error, found before it reaches the bus."""
    if op not in allowed:
        raise ValueError(f"bus op {op!r} is not declared {direction} in engine/wire/bus_ops.py")
