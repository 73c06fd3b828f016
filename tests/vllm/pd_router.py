"""A minimal prefill/decode router for two vLLM instances: vLLM's documented disaggregated flow.

Each request goes to the producer (prefill) with max_tokens 1 and kv_transfer_params
{"do_remote_decode": true}; the kv_transfer_params it returns (the inner connector's, plus
PageWarden's manifest) go with the same request to the consumer (decode) with the real
max_tokens. Both halves carry the same X-Request-Id, as vLLM's own toy proxy sends: the one
name the two instances share (vLLM appends random characters to its internal ids).
"""

from __future__ import annotations

import json
import urllib.request


def post(url: str, body: dict, request_id: str, timeout_s: float = 120.0) -> dict:
    req = urllib.request.Request(f"{url}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "X-Request-Id": request_id})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read())


def body(prompt, max_tokens: int, **fields) -> dict:
    return {"model": "pagewarden-copy", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **fields}


def prefill(producer: str, prompt, request_id: str) -> dict | None:
    """The producer's kv_transfer_params for this prompt (None: it returned none)."""
    reply = post(producer, body(prompt, 1, kv_transfer_params={"do_remote_decode": True}), request_id)
    return reply.get("kv_transfer_params")


def decode(consumer: str, prompt, max_tokens: int, request_id: str, params: dict | None, **fields) -> dict:
    if params is not None:
        fields["kv_transfer_params"] = params
    return post(consumer, body(prompt, max_tokens, **fields), request_id)


def complete(producer: str, consumer: str, prompt, max_tokens: int, request_id: str, test: dict | None = None,
             **fields) -> dict:
    """One request through the pair: the consumer's completion, with the params the producer
    returned. `test` ({"fault": bool, "verify": bool}) goes to a consumer started with the
    verifying connector's test_fault "per_request" (tests only)."""
    params = prefill(producer, prompt, request_id)
    sent = params if test is None or params is None else {**params, "pagewarden_test": test}
    reply = decode(consumer, prompt, max_tokens, request_id, sent, **fields)
    reply["sent_kv_transfer_params"] = params
    return reply
