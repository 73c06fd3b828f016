"""The typed messages (engine/wire/messages/): each op's struct goes on the wire as the very
map its dict sender wrote, reads back as the same struct, and a bad field or an unknown op
is refused with the field, the value and what was expected."""

from __future__ import annotations

import inspect
import math
import re

import pytest

from engine.wire.messages import control, to_client, to_supervisor, to_worker
from engine.wire.messages.base import WireMessage, op_of
from engine.wire.messages.codec import header_of, open_message, read
from engine.wire.messages.registry import BUS_TO_SUPERVISOR, BUS_TO_WORKER, CONTROL, TO_CLIENT, Registry
from engine.wire.protocol import ProtocolError, error_reply, pack, reply, unpack
from engine.wire.roles import CLIENT_OPS, OP_ROLES, READ_ONLY_OPS, ROLES

REGISTRIES = (BUS_TO_WORKER, BUS_TO_SUPERVISOR, CONTROL, TO_CLIENT)
RESERVATION = {"request_id": "r1", "slot": 3, "epoch": 1, "tokens": 5, "pages": [4, 5], "page_epochs": [2, 2]}
PARAMS = {"max_new_tokens": 4, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": None, "ignore_eos": True,
          "stop_token_ids": [], "stream": True}
POOL = {"name": "decode-0", "pages": 64, "page_size": 16, "bytes_per_page": 4096}
HELLO = {"name": "decode-0", "role": "decode", "pid": 41, "token": "t0k", "device": "cpu", "kernels": "torch",
         "attention": "", "kernels_fallback": "", "threads": 2, "threads_shared": False, "pool": POOL}
STATS = {"free_pages": 60, "used_pages": 4, "bad_messages": 0, "scrubbed_pages": 2, "threads_now": 2}
ERROR = {"code": "pool_exhausted", "message": "decode pool 'decode-0' has 3 free pages; request r1 needs 9"}
DONE = {"request_id": "r1", "token_ids": [7, 8], "text": "hi", "finish_reason": "length", "error": None,
        "ttft_s": 0.25, "elapsed_s": 1.5, "prompt_len": 5, "cached_tokens": 0, "decode_worker": "decode-0", "prefill_worker": "prefill-0"}

# (registry, the dict as its sender writes it today, the struct that replaces it)
WIRE: list[tuple[Registry, dict, WireMessage]] = [
    # supervisor -> worker
    (BUS_TO_WORKER, {"op": "reserve", "request_id": "r1", "slot": 3, "prompt_ids": [1, 2], "params": PARAMS,
                     "tenant": "default", "cache_salt": None},
     to_worker.Reserve(request_id="r1", slot=3, prompt_ids=[1, 2], params=PARAMS)),
    (BUS_TO_WORKER, {"op": "prefill", "request_id": "r1", "slot": 3, "prompt_ids": [1, 2], "params": PARAMS,
                     "tenant": "default", "cache_salt": None, "target": {"endpoint": "ipc:///run/decode-0.kv", "reservation": RESERVATION}},
     to_worker.Prefill(request_id="r1", slot=3, prompt_ids=[1, 2], params=PARAMS,
                       target=to_worker.TransferTarget(endpoint="ipc:///run/decode-0.kv", reservation=RESERVATION))),
    (BUS_TO_WORKER, {"op": "cancel", "request_id": "r1"}, to_worker.Cancel(request_id="r1")),
    (BUS_TO_WORKER, {"op": "release", "request_id": "r1"}, to_worker.Release(request_id="r1")),
    (BUS_TO_WORKER, {"op": "forget_endpoint", "endpoint": "ipc:///run/decode-0.kv"},
     to_worker.ForgetEndpoint(endpoint="ipc:///run/decode-0.kv")),
    (BUS_TO_WORKER, {"op": "configure", "engine": {"max_batch": 8}, "defences": {"manifest_check": True},
                     "faults": {}},
     to_worker.Configure(engine={"max_batch": 8}, defences={"manifest_check": True}, faults={})),
    (BUS_TO_WORKER, {"op": "telemetry", "pages": False}, to_worker.Telemetry(pages=False)),
    (BUS_TO_WORKER, {"op": "telemetry", "pages": True}, to_worker.Telemetry(pages=True)),
    (BUS_TO_WORKER, {"op": "keyframe"}, to_worker.Keyframe()),
    (BUS_TO_WORKER, {"op": "page_metadata", "ask_id": 3}, to_worker.PageMetadata(ask_id=3)),
    (BUS_TO_WORKER, {"op": "cross_reads", "ask_id": 4}, to_worker.CrossReads(ask_id=4)),
    (BUS_TO_WORKER, {"op": "ping"}, to_worker.Ping()),
    (BUS_TO_WORKER, {"op": "stop"}, to_worker.Stop()),
    # worker -> supervisor
    (BUS_TO_SUPERVISOR, {"op": "hello", **HELLO, "name": "prefill-0", "role": "prefill"},
     to_supervisor.Hello(**{**HELLO, "name": "prefill-0", "role": "prefill", "pool": to_supervisor.PoolInfo(**POOL)})),
    (BUS_TO_SUPERVISOR, {"op": "hello", **HELLO, "transfer_endpoint": "ipc:///run/decode-0.kv"},
     to_supervisor.Hello(**{**HELLO, "pool": to_supervisor.PoolInfo(**POOL)}, transfer_endpoint="ipc:///run/decode-0.kv")),
    (BUS_TO_SUPERVISOR, {"op": "heartbeat", **STATS},
     to_supervisor.Heartbeat(free_pages=60, used_pages=4, extra={"bad_messages": 0, "scrubbed_pages": 2,
                                                                 "threads_now": 2})),
    (BUS_TO_SUPERVISOR, {"op": "heartbeat", **STATS, "running": 1, "reserved": 0, "transfers": {"complete": 3}},
     open_message(to_supervisor.Heartbeat, {**STATS, "running": 1, "reserved": 0, "transfers": {"complete": 3}})),
    (BUS_TO_SUPERVISOR, {"op": "bad_command", "error": {"code": "bad_message", "message": "field 'slot' is required"}},
     to_supervisor.BadCommand(error={"code": "bad_message", "message": "field 'slot' is required"})),
    (BUS_TO_SUPERVISOR, {"op": "reserved", "request_id": "r1", "reservation": RESERVATION,
                         "endpoint": "ipc:///run/decode-0.kv", "pages": 3, "free_pages": 61, "cached_tokens": 0},
     to_supervisor.Reserved(request_id="r1", reservation=RESERVATION, endpoint="ipc:///run/decode-0.kv", pages=3,
                            free_pages=61)),
    (BUS_TO_SUPERVISOR, {"op": "reserve_failed", "request_id": "r1", "error": ERROR, "free_pages": 3},
     to_supervisor.ReserveFailed(request_id="r1", error=ERROR, free_pages=3)),
    (BUS_TO_SUPERVISOR, {"op": "reserve_failed", "request_id": "r1", "final": True, "free_pages": 3, "error": ERROR},
     to_supervisor.ReserveFailed(request_id="r1", final=True, error=ERROR, free_pages=3)),
    (BUS_TO_SUPERVISOR, {"op": "prefilled", "request_id": "r1", "first_token": 7, "tokens": 5, "pages": 1,
                         "chunks": 1, "elapsed_s": 0.125},
     to_supervisor.Prefilled(request_id="r1", first_token=7, tokens=5, pages=1, chunks=1, elapsed_s=0.125)),
    (BUS_TO_SUPERVISOR, {"op": "prefill_failed", "request_id": "r1", "error": ERROR},
     to_supervisor.PrefillFailed(request_id="r1", error=ERROR)),
    (BUS_TO_SUPERVISOR, {"op": "transfer_done", "request_id": "r1", "ok": True},
     to_supervisor.TransferDone(request_id="r1", ok=True)),
    (BUS_TO_SUPERVISOR, {"op": "transfer_done", "request_id": "r1", "ok": False, "error": ERROR},
     to_supervisor.TransferDone(request_id="r1", ok=False, error=ERROR)),
    (BUS_TO_SUPERVISOR, {"op": "tokens", "items": [["r1", [7]], ["r2", [9, 10]]],
                         "finished": [["r2", "length", None], ["r3", "transfer_mismatch", ERROR]], "free_pages": 58},
     to_supervisor.Tokens(items=[("r1", [7]), ("r2", [9, 10])],
                          finished=[("r2", "length", None), ("r3", "transfer_mismatch", ERROR)], free_pages=58)),
    (BUS_TO_SUPERVISOR, {"op": "cancel_ack", "request_id": "r1", "sent": False},
     to_supervisor.CancelAck(request_id="r1", sent=False)),
    (BUS_TO_SUPERVISOR, {"op": "released", "request_id": "r1", "free_pages": 64},
     to_supervisor.Released(request_id="r1", free_pages=64)),
    (BUS_TO_SUPERVISOR, {"op": "pages", "pool": "decode-0", "role": "decode", "kind": "delta", "seq": 9,
                         "num_pages": 64, "page_size": 16, "time": 1700000000.5},
     to_supervisor.Pages(pool="decode-0", role="decode", kind="delta", seq=9, num_pages=64, page_size=16,
                         time=1700000000.5)),
    (BUS_TO_SUPERVISOR, {"op": "alert", "kind": "late_write_dropped", "severity": "warning", "detail": "late",
                         "pool": "decode-0", "worker": "decode-0", "requests": ["r1"], "pages": [4], "prevented": True},
     to_supervisor.Alert(kind="late_write_dropped", severity="warning", detail="late", pool="decode-0",
                         worker="decode-0", extra={"requests": ["r1"], "pages": [4], "prevented": True})),
    (BUS_TO_SUPERVISOR, {"op": "isolation", "events": [{"kind": "cross_read", "request": "r1", "reads": [[4, 2]]}]},
     to_supervisor.Isolation(events=[{"kind": "cross_read", "request": "r1", "reads": [[4, 2]]}])),
    (BUS_TO_SUPERVISOR, {"op": "cross_reads", "ask_id": 4, "reads": []}, to_supervisor.CrossReads(ask_id=4)),
    (BUS_TO_SUPERVISOR, {"op": "page_metadata", "ask_id": 3, "pool": "decode-0"},
     to_supervisor.PageMetadata(ask_id=3, pool="decode-0")),
    # client -> engine, as EngineClient, the app and the CLI write them
    (CONTROL, {"op": "status", "id": 1}, control.Status(id=1)),
    (CONTROL, {"op": "status", "id": 1, "brief": True}, control.Status(id=1, brief=True)),
    (CONTROL, {"op": "ping", "id": 2}, control.Ping(id=2)),
    (CONTROL, {"op": "keyframe", "id": 3}, control.Keyframe(id=3)),
    (CONTROL, {"op": "page_metadata", "id": 4, "pool": "decode-0"}, control.PageMetadata(id=4, pool="decode-0")),
    (CONTROL, {"op": "scope", "id": 5, "since": 100.0}, control.Scope(id=5, since=100.0)),
    (CONTROL, {"op": "scope", "id": 5, "run": "all"}, control.Scope(id=5, run="all")),
    (CONTROL, {"op": "prompt_log", "id": 6}, control.PromptLog(id=6)),
    (CONTROL, {"op": "ground_truth", "id": 7}, control.GroundTruth(id=7)),
    (CONTROL, {"op": "history", "id": 8, "since": 1.5, "after": 3, "limit": 3},
     control.History(id=8, since=1.5, after=3, limit=3)),
    (CONTROL, {"op": "submit", "id": 9, "stream": False, "max_new_tokens": 5, "ignore_eos": True,
               "prompt_ids": [256, 33, 44]},
     control.Submit(id=9, stream=False, max_new_tokens=5, ignore_eos=True, prompt_ids=[256, 33, 44])),
    (CONTROL, {"op": "submit", "id": 10, "prompt": "hello", "tenant": "acme", "client": "10.0.0.1",
               "request_id": "http-1f", "temperature": 0.7, "top_p": 0.9, "seed": 5, "data_tier": "gold"},
     control.Submit(id=10, prompt="hello", tenant="acme", client="10.0.0.1", request_id="http-1f", temperature=0.7,
                    top_p=0.9, seed=5, data_tier="gold")),
    (CONTROL, {"op": "cancel", "id": 11, "request_id": "r1"}, control.Cancel(id=11, request_id="r1")),
    (CONTROL, {"op": "audit", "id": 12, "request_id": "r1"}, control.Audit(id=12, request_id="r1")),
    (CONTROL, {"op": "canary", "id": 13}, control.Canary(id=13)),
    (CONTROL, {"op": "ack_alert", "id": 14, "ids": ["canary_leak:r2"]}, control.AckAlert(id=14, ids=["canary_leak:r2"])),
    (CONTROL, {"op": "start", "id": 15, "worker": "decode-0"}, control.Start(id=15, worker="decode-0")),
    (CONTROL, {"op": "stop", "id": 16, "worker": "decode-0"}, control.Stop(id=16, worker="decode-0")),
    (CONTROL, {"op": "restart", "id": 17, "worker": "decode-0"}, control.Restart(id=17, worker="decode-0")),
    (CONTROL, {"op": "reconfigure", "id": 18, "changes": {"engine": {"max_batch": 4}}, "apply": False},
     control.Reconfigure(id=18, changes={"engine": {"max_batch": 4}})),
    (CONTROL, {"op": "pause", "id": 19, "paused": True}, control.Pause(id=19, paused=True)),
    # engine -> client
    (TO_CLIENT, {"op": "reply", "id": 1, "result": {"pong": 1.5}}, to_client.Reply(id=1, result={"pong": 1.5})),
    (TO_CLIENT, {"op": "reply", "id": None, "result": {}}, to_client.Reply(id=None)),
    (TO_CLIENT, {"op": "error", "id": 2, "error": ERROR}, to_client.ErrorReply(id=2, error=ERROR)),
    (TO_CLIENT, {"op": "error", "id": 9, "request_id": "r1", "error": ERROR},
     to_client.ErrorReply(id=9, request_id="r1", error=ERROR)),
    (TO_CLIENT, {"op": "accepted", "id": 9, "request_id": "r1", "slot": 3},
     to_client.Accepted(id=9, request_id="r1", slot=3)),
    (TO_CLIENT, {"op": "token", "id": 9, "request_id": "r1", "token_ids": [7], "text": "h"},
     to_client.Token(id=9, request_id="r1", token_ids=[7], text="h")),
    (TO_CLIENT, {"op": "done", "id": 9, **DONE}, to_client.Done(id=9, **DONE)),
]


def _label(case: tuple) -> str:
    return f"{case[0].direction}:{case[1]['op']}"


@pytest.mark.parametrize("registry, old, message", WIRE, ids=[_label(c) for c in WIRE])
def test_each_struct_goes_on_the_wire_as_its_dict_did_and_reads_back(registry, old, message):
    wire = unpack(pack(old))
    assert unpack(pack(header_of(message))).header == wire.header  # the same msgpack map, key for key
    assert read(wire, registry) == message


def test_the_examples_cover_every_op_of_every_registry():
    covered = {(case[0].direction, case[1]["op"]) for case in WIRE}
    assert covered == {(registry.direction, op) for registry in REGISTRIES for op in registry}


def test_the_protocols_own_replies_are_the_reply_structs():
    assert unpack(reply(5, {"a": 1})).header == unpack(pack(header_of(to_client.Reply(id=5, result={"a": 1})))).header
    assert unpack(error_reply(None, "bad_message", "no")).header == unpack(pack(header_of(
        to_client.ErrorReply(id=None, error={"code": "bad_message", "message": "no"})))).header


def test_each_message_is_declared_with_its_op_direction_and_purpose():
    for registry in REGISTRIES:
        for op, cls in registry.ops.items():
            assert re.fullmatch(r"[a-z][a-z_]*", op) and op_of(cls) == op, cls  # an explicit tag, not the class name
            assert cls.direction == registry.direction and cls.description, cls
            assert not cls.__struct_config__.forbid_unknown_fields, cls  # a newer peer's fields are ignored
            params = inspect.signature(cls).parameters.values()
            assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), cls  # kw_only on each class


def test_roles_follow_from_the_control_structs():
    assert OP_ROLES == {
        **dict.fromkeys(("status", "ping", "keyframe", "page_metadata", "scope", "prompt_log", "ground_truth",
                         "history"), "viewer"),
        **dict.fromkeys(("submit", "cancel", "audit", "canary", "ack_alert"), "operator"),
        **dict.fromkeys(("start", "stop", "restart", "reconfigure"), "admin"),
    }
    assert CLIENT_OPS == tuple(OP_ROLES) and READ_ONLY_OPS == tuple(op for op in OP_ROLES if OP_ROLES[op] == "viewer")
    assert all(cls.least_role in ROLES for cls in CONTROL.ops.values())
    assert "pause" in CONTROL and "pause" not in CLIENT_OPS  # the vLLM agent's bench switch only


def test_the_agent_answers_the_viewer_ops_it_declares():
    from engine.vllm_agent.agent_server import ANSWERED_OPS

    assert ANSWERED_OPS == ("status", "ping", "keyframe", "page_metadata")


@pytest.mark.parametrize("registry, header, text", [
    (CONTROL, {"op": "submit", "request_id": 123}, "field 'request_id' = 123: Expected `str | null`, got `int`"),
    (CONTROL, {"op": "submit", "tenant": "t" * 65}, "field 'tenant' = 'tttttttttttttttttttttttttt"),
    (CONTROL, {"op": "submit", "tenant": "t" * 65}, "Expected `str` of length <= 64"),
    (CONTROL, {"op": "submit", "temperature": math.nan}, "field 'temperature' = nan: Expected a finite number"),
    (CONTROL, {"op": "submit", "max_new_tokens": "ten"}, "field 'max_new_tokens' = 'ten': Expected `int`, got `str`"),
    (CONTROL, {"op": "submit", "stop_token_ids": list(range(65))},
     "field 'stop_token_ids' = [0, 1, 2, 3, 4, 5, 6, 7, ...]: Expected `array` of length <= 64"),
    (CONTROL, {"op": "history", "limit": 0}, "field 'limit' = 0: Expected `int` >= 1"),
    (CONTROL, {"op": "pause", "paused": "yes"}, "field 'paused' = 'yes': Expected `bool`, got `str`"),
    (CONTROL, {"op": "cancel"}, "field 'request_id' is required"),
    (BUS_TO_WORKER, {"op": "reserve", "request_id": "r1", "slot": -1, "prompt_ids": [1]},
     "field 'slot' = -1: Expected `int` >= 0"),
    (BUS_TO_WORKER, {"op": "reserve", "request_id": "r1", "slot": True, "prompt_ids": [1]},
     "field 'slot' = True: Expected `int`, got `bool`"),
    (BUS_TO_WORKER, {"op": "prefill", "request_id": "r1", "slot": 1, "prompt_ids": [1], "target": {"reservation": {}}},
     "field 'target.endpoint' is required"),
    (BUS_TO_WORKER, {"op": "prefill", "request_id": "r1", "slot": 1, "prompt_ids": [],
                     "target": {"endpoint": "e", "reservation": {}}},
     "field 'prompt_ids' = []: Expected `array` of length >= 1"),
    (BUS_TO_SUPERVISOR, {"op": "tokens", "items": [["r1", [7, "x"]]], "finished": [], "free_pages": 1},
     "field 'items[0][1][1]' = 'x': Expected `int`, got `str`"),
    (BUS_TO_SUPERVISOR, {"op": "tokens", "items": [], "finished": []}, "field 'free_pages' is required"),
    (BUS_TO_SUPERVISOR, {"op": "heartbeat", "free_pages": 1.5, "used_pages": 0},
     "field 'free_pages' = 1.5: Expected `int`, got `float`"),
])
def test_a_bad_field_is_refused_naming_the_field_the_value_and_the_expectation(registry, header, text):
    with pytest.raises(ProtocolError) as err:
        read(header, registry)
    assert text in str(err.value)
    assert len(str(err.value)) < 200  # a long value is shown short


def test_an_unknown_op_is_refused_naming_it_and_the_known_ones():
    with pytest.raises(ProtocolError, match=r"unknown op 'explode' for the control socket; known: status, ping, "):
        read({"op": "explode"}, CONTROL)
    with pytest.raises(ProtocolError, match=r"unknown op 'reserved' for a worker; known: reserve, prefill"):
        read({"op": "reserved", "request_id": "r1"}, BUS_TO_WORKER)  # declared, but the other way
    with pytest.raises(ProtocolError, match=r"unknown op None for the supervisor"):
        read({"topic": "metrics"}, BUS_TO_SUPERVISOR)


def test_null_reads_as_left_out_and_unknown_keys_are_ignored():
    submit = read({"op": "submit", "v": 1, "tenant": None, "seed": None, "from_the_future": [1]}, CONTROL)
    assert isinstance(submit, control.Submit) and submit.tenant == "default" and submit.seed is None
    assert submit.params()["max_new_tokens"] == 16
    with pytest.raises(ProtocolError, match="field 'request_id' = None: Expected `str`, got `null`"):
        read({"op": "release", "request_id": None}, BUS_TO_WORKER)  # no default to fall back on


def test_a_field_left_at_its_default_is_left_off_where_senders_leave_it_off():
    assert header_of(control.Submit(prompt_ids=[1], stream=True)) == {"op": "submit", "prompt_ids": [1]}
    assert header_of(to_supervisor.TransferDone(request_id="r1", ok=True)) == {"op": "transfer_done",
                                                                                "request_id": "r1", "ok": True}
    assert header_of(to_worker.Telemetry())["pages"] is False  # a sender that always writes it still does


def test_open_messages_keep_every_key_they_do_not_name():
    header = {"op": "alert", "v": 1, "kind": "canary_leak", "detail": "d", "requests": ["a"], "source": "c", "x": None}
    alert = read(header, BUS_TO_SUPERVISOR)
    assert isinstance(alert, to_supervisor.Alert) and alert.severity == "warning" and alert.pool is None
    assert alert.extra == {"requests": ["a"], "source": "c", "x": None}
    assert alert.fields() == {"requests": ["a"], "source": "c", "x": None}
    heartbeat = read({"op": "heartbeat", **STATS, "running": 2}, BUS_TO_SUPERVISOR)
    assert isinstance(heartbeat, to_supervisor.Heartbeat) and heartbeat.stats() == {**STATS, "running": 2}
    with pytest.raises(ValueError, match=r"extra field\(s\) \['kind'\] are declared fields"):
        header_of(to_supervisor.Alert(kind="a", extra={"kind": "b"}))


def test_a_hello_keeps_all_but_its_token_for_the_supervisor():
    hello = read({"op": "hello", **HELLO}, BUS_TO_SUPERVISOR)
    assert isinstance(hello, to_supervisor.Hello)
    assert hello.info() == {"op": "hello", **{k: v for k, v in HELLO.items() if k != "token"}}
