"""engine.wire.sockets on real sockets over tcp://127.0.0.1: the options harden() sets, the
frame size limit, ROUTER behaviour, and the loopback bind policy."""

from __future__ import annotations

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from engine.wire.protocol import MAX_BUS_FRAME, MAX_CONTROL_FRAME, MAX_KV_FRAME
from engine.wire.sockets import (
    CURVE_FRAME_OVERHEAD,
    HWMS,
    SOCKET_KINDS,
    bind_endpoint,
    check_bind_policy,
    harden,
    is_curve_secured,
    is_loopback,
    send_zero_copy,
)

REPLY_MS = 1000  # a peer that has not answered within this is taken as refused


class KeepingContext(zmq.Context):
    """Keeps every socket it makes referenced until destroy(): pyzmq warns about a socket
    collected unclosed, and under filterwarnings=error that warning also skips its close()."""

    kept: list

    def socket(self, *args, **kwargs):
        sock = super().socket(*args, **kwargs)
        self.kept.append(sock)
        return sock


@pytest.fixture
def ctx():
    context = KeepingContext()
    context.kept = []
    yield context
    context.destroy(linger=0)


def connect(ctx, endpoint: str, kind=zmq.DEALER, routing_id: bytes | None = None) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.linger = 0
    if routing_id:
        sock.routing_id = routing_id
    sock.connect(endpoint)
    return sock


def echo(router: zmq.Socket, client: zmq.Socket, payload: bytes, timeout_ms: int = REPLY_MS):
    """`client` sends `payload`; `router` echoes whatever arrives. The reply, or None."""
    client.send(payload, copy=False)
    if not router.poll(timeout_ms):
        return None
    router.send_multipart(router.recv_multipart(copy=False), copy=False)
    return client.recv() if client.poll(timeout_ms) else None


def serving_router(ctx, kind="control") -> tuple[zmq.Socket, str]:
    router = harden(ctx.socket(zmq.ROUTER), kind)
    return router, bind_endpoint(router, "tcp://127.0.0.1:0")


EXPECTED_LIMITS = {"control": MAX_CONTROL_FRAME, "telemetry": MAX_BUS_FRAME, "publisher": 480,
                   "bus": MAX_BUS_FRAME, "kv": MAX_KV_FRAME}


@pytest.mark.parametrize("kind, sock_type", [
    ("control", zmq.ROUTER), ("control", zmq.DEALER), ("publisher", zmq.XPUB), ("telemetry", zmq.SUB),
    ("bus", zmq.ROUTER), ("bus", zmq.DEALER), ("kv", zmq.PUSH), ("kv", zmq.PULL)])
def test_harden_sets_the_options(ctx, kind, sock_type):
    sock = harden(ctx.socket(sock_type), kind)
    assert sock.getsockopt(zmq.MAXMSGSIZE) == EXPECTED_LIMITS[kind] + CURVE_FRAME_OVERHEAD
    assert sock.getsockopt(zmq.SNDHWM) == sock.getsockopt(zmq.RCVHWM) == HWMS[kind]
    assert sock.getsockopt(zmq.LINGER) == 0


def test_queue_limits_per_kind():
    assert SOCKET_KINDS == {"control", "telemetry", "publisher", "bus", "kv"}
    assert HWMS["kv"] == 0  # no limit: KV pages are never dropped
    assert 0 < HWMS["telemetry"] < HWMS["control"]  # a slow subscriber loses messages early


def test_harden_refuses_an_unknown_kind_and_a_bound_socket(ctx):
    with pytest.raises(ValueError, match="unknown socket kind 'gui'"):
        harden(ctx.socket(zmq.DEALER), "gui")
    router, endpoint = serving_router(ctx)
    with pytest.raises(ValueError, match="already bound"):
        harden(router, "control")


def test_a_reconnecting_client_takes_over_its_identity(ctx):
    router, endpoint = serving_router(ctx)
    first = connect(ctx, endpoint, routing_id=b"client-1")
    assert echo(router, first, b"first") == b"first"
    second = connect(ctx, endpoint, routing_id=b"client-1")
    assert echo(router, second, b"second") == b"second"  # without ROUTER_HANDOVER: never arrives
    router.send_multipart([b"client-1", b"for the newest"])
    assert second.poll(REPLY_MS) and second.recv() == b"for the newest"
    assert not first.poll(0)


def test_a_reply_to_an_unknown_identity_is_dropped_silently(ctx):
    router, _ = serving_router(ctx)
    router.send_multipart([b"nobody", b"lost"])  # ROUTER_MANDATORY on would raise EHOSTUNREACH


def test_an_oversize_frame_drops_only_its_sender(ctx):
    router, endpoint = serving_router(ctx)
    monitor = router.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    big, other = connect(ctx, endpoint), connect(ctx, endpoint)
    assert echo(router, big, b"hello") == b"hello"
    assert echo(router, big, bytes(MAX_CONTROL_FRAME + CURVE_FRAME_OVERHEAD + 1)) is None
    assert monitor.poll(5000), "the router did not drop the sender of the oversize frame"
    assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    assert echo(router, other, b"still here") == b"still here"
    assert echo(router, big, b"back again", timeout_ms=5000) == b"back again"  # reconnected
    router.disable_monitor()


def test_a_frame_of_exactly_the_limit_passes_under_curve(ctx):
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    router = harden(ctx.socket(zmq.ROUTER), "control")
    router.curve_server, router.curve_secretkey = True, server_secret  # no ZAP: size check only
    endpoint = bind_endpoint(router, "tcp://127.0.0.1:0")
    client = ctx.socket(zmq.DEALER)
    client.linger = 0
    client.curve_serverkey, client.curve_publickey, client.curve_secretkey = (
        server_public, client_public, client_secret)
    client.connect(endpoint)
    client.send(bytes(MAX_CONTROL_FRAME), copy=False)
    assert router.poll(10_000)
    assert len(router.recv_multipart(copy=False)[-1]) == MAX_CONTROL_FRAME


@pytest.mark.parametrize("endpoint, loopback", [
    ("tcp://127.0.0.1:5555", True), ("tcp://127.0.0.1:0", True), ("tcp://127.0.0.1:*", True),
    ("tcp://127.1.2.3:5555", True), ("tcp://[::1]:5555", True), ("tcp://localhost:5555", True),
    ("tcp://LOCALHOST:5555", True), ("tcp://[::ffff:127.0.0.1]:5555", True),
    ("ipc:///tmp/pagewarden.sock", True), ("inproc://bus", True),
    ("tcp://0.0.0.0:5555", False), ("tcp://*:5555", False), ("tcp://[::]:5555", False),
    ("tcp://192.168.1.10:5555", False), ("tcp://10.0.0.1:5555", False), ("tcp://example.org:5555", False),
    ("tcp://localhost.example.org:5555", False), ("tcp://eth0:5555", False), ("tcp://lo:5555", False),
    ("tcp://127.0.0.1;10.0.0.1:5555", False), ("tcp://127.0.0.1", False), ("udp://127.0.0.1:5555", False),
    ("ws://127.0.0.1:5555", False), ("127.0.0.1:5555", False), ("", False)])
def test_is_loopback(endpoint, loopback):
    assert is_loopback(endpoint) is loopback


def test_bind_endpoint_picks_free_ports_clients_can_use(ctx):
    endpoints = set()
    for requested in ("tcp://127.0.0.1:0", "tcp://127.0.0.1:*", "tcp://localhost:0"):
        router = harden(ctx.socket(zmq.ROUTER), "control")
        endpoint = bind_endpoint(router, requested)
        assert is_loopback(endpoint) and not endpoint.endswith((":0", ":*"))
        assert echo(router, connect(ctx, endpoint), b"ping") == b"ping"
        endpoints.add(endpoint)
    assert len(endpoints) == 3


def secured_by_hand(sock: zmq.Socket) -> zmq.Socket:
    """What curve.CurveServer.secure() sets, without a ZAP handler (so it refuses everyone)."""
    sock.curve_server, sock.curve_secretkey = True, zmq.curve_keypair()[1]
    sock.zap_domain = b"pagewarden"
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    return sock


def test_bind_endpoint_keeps_plaintext_on_loopback(ctx):
    plain = harden(ctx.socket(zmq.ROUTER), "control")
    with pytest.raises(ValueError, match=r"tcp://0\.0\.0\.0:0"):
        bind_endpoint(plain, "tcp://0.0.0.0:0")
    assert plain.getsockopt(zmq.LAST_ENDPOINT) == b""  # never bound
    half = harden(ctx.socket(zmq.ROUTER), "control")
    half.curve_server, half.curve_secretkey = True, zmq.curve_keypair()[1]  # CURVE without ZAP
    assert not is_curve_secured(half)
    with pytest.raises(ValueError, match="CURVE is off"):
        bind_endpoint(half, "tcp://*:0")
    secured = secured_by_hand(harden(ctx.socket(zmq.ROUTER), "control"))
    assert is_curve_secured(secured)
    endpoint = bind_endpoint(secured, "tcp://*:0")
    assert endpoint.startswith("tcp://127.0.0.1:") and not endpoint.endswith(":0")


@pytest.mark.parametrize("endpoint, curve, allowed", [
    ("tcp://127.0.0.1:5555", False, True), ("ipc:///tmp/x", False, True),
    ("tcp://0.0.0.0:5555", False, False), ("tcp://*:5555", False, False),
    ("tcp://203.0.113.5:5555", False, False), ("tcp://0.0.0.0:5555", True, True),
    ("tcp://*:5555", True, True), ("tcp://127.0.0.1:5555", True, True)])
def test_check_bind_policy(endpoint, curve, allowed):
    if allowed:
        assert check_bind_policy(endpoint, curve) is None
    else:
        with pytest.raises(ValueError) as err:
            check_bind_policy(endpoint, curve)
        assert endpoint in str(err.value)


def test_send_zero_copy_tracks_every_frame_not_only_the_last(tmp_path):
    """pyzmq's send_multipart(copy=False, track=True) returns the last frame's tracker: a
    small last frame is copied and done at once while the large frames before it are still
    ZeroMQ's. send_zero_copy is done only when every frame is let go of. Nobody listens at
    first, so ZeroMQ keeps the queued messages (deterministic, no timing)."""
    import numpy as np

    ctx = zmq.Context()
    push, pull = ctx.socket(zmq.PUSH), ctx.socket(zmq.PULL)
    try:
        # an ipc path nobody else can take between connect and bind (a freed TCP port can
        # be: CI once lost this test to "Address already in use")
        endpoint = f"ipc://{tmp_path}/zero-copy"
        push.connect(endpoint)
        page = np.arange(1 << 20, dtype=np.uint32).view(np.uint8)  # 4 MiB: above zmq.COPY_THRESHOLD
        tags = b"t" * 64  # below it: copied at once
        last_only = push.send_multipart([page, tags], copy=False, track=True)
        every = send_zero_copy(push, [page, tags])
        assert last_only.done  # pyzmq's answer, while ZeroMQ still holds `page` (twice)
        assert not every.done
        pull.bind(endpoint)
        for _ in range(2):
            got = pull.recv_multipart()
            assert got[0] == page.tobytes() and got[1] == tags
        every.wait(10)
        assert every.done
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        ctx.term()
