"""Text prompts (engine/server/prompt_text.py): a prompt of more bytes than the window can hold
is rejected before it is tokenized, naming the bytes and the limit; tokenizing runs beside
the supervisor's loop, which answers others meanwhile (shown by a tokenizer that does not
return until the test has its answers: order, not time); a request can be cancelled while
its prompt is tokenized. Before: a 4 MiB prompt was tokenized on the loop (27 s of every
client's stream stalled, a ping waited 33 s) and only then rejected."""

from __future__ import annotations

import contextlib
import threading

import pytest

from engine.client import EngineClient
from engine.client.engine_client import RemoteError
from engine.config import EngineConfig
from engine.server.prompt_text import MAX_BYTES_PER_TOKEN
from engine.server.supervisor import Supervisor
from tests.waiting import wait_for

WINDOW = 2048


class HeldTokenizer:
    """encode() counts its calls and, while `hold` is clear, waits inside (as a long prompt would)."""

    def __init__(self):
        self.inside, self.hold, self.calls = threading.Event(), threading.Event(), []

    def encode(self, text: str) -> list[int]:
        self.calls.append(len(text))
        self.inside.set()
        assert self.hold.wait(60), "the test never let the tokenizer go"
        return [256, *text.encode()]

    def decode(self, ids):
        return ""


@pytest.fixture
def serving():
    """A supervisor (no workers) on its loop in a thread, with a HeldTokenizer."""
    sup = Supervisor(EngineConfig().replace(canaries={"enabled": False}, engine={"context_window": WINDOW}),
                     bind="tcp://127.0.0.1:0", local_role="operator")  # operators cancel only their own
    tokenizer = sup.text._tokenizer = HeldTokenizer()
    stop = threading.Event()
    pump = threading.Thread(target=lambda: sup.run(until=stop.is_set), daemon=True)
    pump.start()
    try:
        yield sup, tokenizer
    finally:
        tokenizer.hold.set()
        stop.set()
        pump.join(10)
        sup.shutdown()


@contextlib.contextmanager
def client_of(sup):
    with EngineClient(sup.control_endpoint, timeout_s=60) as client:
        yield client


def first_answer(client, stream_id):
    return next(client.events(stream_id, timeout_s=60))


def test_a_prompt_past_the_byte_limit_is_rejected_before_tokenizing(serving):
    sup, tokenizer = serving
    size = 4 << 20
    with client_of(sup) as client:
        answer = first_answer(client, client.submit(prompt="a" * size, max_new_tokens=4, request_id="big"))
    assert answer.op == "error" and answer.get("error")["code"] == "admission_rejected"
    limit = WINDOW * MAX_BYTES_PER_TOKEN
    message = answer.get("error")["message"]
    assert f"the prompt is {size:,} bytes; the limit is {limit:,}" in message
    assert f"context window {WINDOW:,} tokens x {MAX_BYTES_PER_TOKEN} bytes per token" in message
    assert tokenizer.calls == []  # never tokenized
    assert "rejected" in [e["event"] for e in sup.audit.events("big")]


def test_the_loop_answers_others_while_a_prompt_is_tokenized(serving):
    sup, tokenizer = serving
    with client_of(sup) as slow, client_of(sup) as other:
        stream = slow.submit(prompt="x" * 1_500, max_new_tokens=4, request_id="long")
        assert tokenizer.inside.wait(60)
        assert other.ping()["pong"] > 0  # answered while encode() has not returned
        assert other.call("status", brief=True)["engine"]["vocab_size"] > 0
        with pytest.raises(RemoteError, match="was already used"):  # its id is taken while it tokenizes
            other.generate(prompt_ids=[256, 1], request_id="long", max_new_tokens=1)
        assert not tokenizer.hold.is_set() and sup.book.get("long") is None  # still inside: not admitted yet
        tokenizer.hold.set()
        answer = first_answer(slow, stream)
    assert answer.op == "accepted" and answer.get("request_id") == "long", answer.get("error")
    assert sup.book.get("long").prompt_len == 1_501


def test_a_request_cancelled_while_its_prompt_is_tokenized_is_never_admitted(serving):
    sup, tokenizer = serving
    with client_of(sup) as client, client_of(sup) as stranger:
        stream = client.submit(prompt="hello", max_new_tokens=4, request_id="c1")
        assert tokenizer.inside.wait(60)
        with pytest.raises(RemoteError, match="belongs to another client"):
            stranger.cancel("c1")
        assert client.cancel("c1")["cancelled"] is True
        tokenizer.hold.set()
        answer = first_answer(client, stream)
    assert answer.op == "error" and answer.get("error")["code"] == "cancelled"
    wait_for(lambda: not sup.prompts.pending, 30, "the cancelled job to be delivered")
    assert sup.book.get("c1") is None


def test_a_tokenizer_failure_is_a_rejection_naming_it(serving):
    sup, tokenizer = serving

    def broken(text):
        raise ValueError("bad input for this tokenizer")

    tokenizer.encode = broken
    with client_of(sup) as client:
        answer = first_answer(client, client.submit(prompt="hello", request_id="t1"))
    assert answer.op == "error" and answer.get("error")["code"] == "invalid_request"
    assert "could not be tokenized: ValueError: bad input" in answer.get("error")["message"]
    assert client is not None and sup.counters.get("internal_errors", 0) == 0
