"""One place that configures every ZeroMQ socket: frame size limits, queue limits, linger,
ROUTER behaviour, and the rule that an endpoint stays on loopback unless CURVE is on.

libzmq copies socket options into a listener or connection when bind/connect runs, so an
option set afterwards does not apply to it: harden() and curve.CurveServer.secure() refuse a
socket that is already bound or connected.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Literal, cast, overload

import zmq

from engine.wire.protocol import MAX_BUS_FRAME, MAX_CONTROL_FRAME, MAX_KV_FRAME

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

SOCKET_KINDS = frozenset({"control", "telemetry", "publisher", "bus", "kv"})

# The supervisor's telemetry XPUB ("publisher") only ever receives subscriptions: a topic is
# a few bytes, and libzmq keeps every subscription in a trie that costs ~48 bytes per byte of
# topic (a 1 MiB prefix cost 48 MiB). 480 bytes (+ the CURVE slack: 513) still lets the CURVE
# handshake's INITIATE command in, which libzmq checks against the same limit (256 did not).
MAX_SUBSCRIPTION_FRAME = 480

# Largest frame payload per kind (ZMQ_MAXMSGSIZE is checked per frame, on the wire; a peer
# sending a larger one is disconnected). "telemetry" is the subscriber's side (page frames).
FRAME_LIMITS = {"control": MAX_CONTROL_FRAME, "telemetry": MAX_BUS_FRAME, "publisher": MAX_SUBSCRIPTION_FRAME,
                "bus": MAX_BUS_FRAME, "kv": MAX_KV_FRAME}
# CURVE wraps each frame in a MESSAGE command 33 bytes longer, and libzmq checks MAXMSGSIZE
# against that: without this slack a frame of exactly the limit is refused under CURVE.
CURVE_FRAME_OVERHEAD = 33
# SNDHWM/RCVHWM in messages. Telemetry: a slow subscriber loses messages (PUB drops at the
# HWM; sequence numbers show the gap) instead of growing memory. kv: 0 = no limit, never
# dropped (a ROUTER would drop at any finite HWM); flow control is the sender's job.
HWMS = {"control": 1000, "telemetry": 100, "publisher": 100, "bus": 1000, "kv": 0}


DRAIN_LIMIT = 10_000  # messages taken from one socket per drain


@overload
def drain(sock: zmq.Socket[bytes], limit: int = ..., *, copy: Literal[False] = ...) -> Iterator[list[zmq.Frame]]: ...
@overload
def drain(sock: zmq.Socket[bytes], limit: int = ..., *, copy: Literal[True]) -> Iterator[list[bytes]]: ...
@overload
def drain(sock: zmq.Socket[bytes], limit: int = ..., *,
          copy: bool) -> Iterator[list[bytes]] | Iterator[list[zmq.Frame]]: ...
def drain(sock: zmq.Socket[bytes], limit: int = DRAIN_LIMIT, *,
          copy: bool = False) -> Iterator[list[bytes]] | Iterator[list[zmq.Frame]]:
    """Yield each multipart message waiting on `sock`, without blocking, at most `limit` of
    them: a busy socket cannot starve the others, and the next poll reports what is left
    (zmq.Poller is level-triggered). The one non-blocking receive loop of every process."""
    for _ in range(limit):
        try:
            yield sock.recv_multipart(zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return


def send_zero_copy(sock: zmq.Socket[bytes], frames: Sequence[Buffer]) -> zmq.MessageTracker:
    """Send one multipart message without copying its frames; the returned tracker is done
    only when ZeroMQ has let go of EVERY frame, so their memory may be reused after that.

    pyzmq's send_multipart(copy=False, track=True) returns the tracker of the last frame
    alone. When that frame is small it is copied (under zmq.COPY_THRESHOLD, 64 KiB) and its
    tracker is done at once, while ZeroMQ's I/O thread is still reading the large frames
    before it: a sender that frees (scrubs, reuses) that memory then ships torn bytes. The
    prefill worker did exactly that with pages over 64 KiB (the 135M-shape checkpoint's)."""
    trackers = [sock.send(frame, zmq.SNDMORE, copy=False, track=True) for frame in frames[:-1]]
    trackers.append(sock.send(frames[-1], 0, copy=False, track=True))
    return zmq.MessageTracker(*trackers)


def require_fresh(sock: zmq.Socket[bytes], what: str) -> None:
    """Raise ValueError (starting with `what`) when `sock` is already bound or connected."""
    last = cast(bytes, sock.getsockopt(zmq.LAST_ENDPOINT))  # a bytes option; the stubs say int | bytes
    if last:
        raise ValueError(f"{what}: the socket is already bound or connected ({last.decode()}); "
                         "options set now would not apply to that endpoint")


def harden(sock: zmq.Socket[bytes], kind: str) -> zmq.Socket[bytes]:
    """Set MAXMSGSIZE, SNDHWM/RCVHWM, LINGER 0 for `kind` (one of SOCKET_KINDS) and, on a
    ROUTER, ROUTER_MANDATORY off (unroutable replies are dropped, never raise) and
    ROUTER_HANDOVER on (a reconnecting client takes over its identity). Returns `sock`.
    Call it before bind/connect. Raises ValueError for an unknown kind or a socket already
    bound or connected."""
    if kind not in SOCKET_KINDS:
        raise ValueError(f"unknown socket kind {kind!r}; expected one of {sorted(SOCKET_KINDS)}")
    require_fresh(sock, f"harden({kind!r})")
    sock.setsockopt(zmq.MAXMSGSIZE, FRAME_LIMITS[kind] + CURVE_FRAME_OVERHEAD)
    sock.setsockopt(zmq.SNDHWM, HWMS[kind])
    sock.setsockopt(zmq.RCVHWM, HWMS[kind])
    sock.setsockopt(zmq.LINGER, 0)
    if sock.type == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    return sock


def is_loopback(endpoint: str) -> bool:
    """True when `endpoint` can only be reached from this machine: ipc://, inproc://, or tcp
    on 127.0.0.0/8, [::1] or localhost. Wildcards (*, 0.0.0.0, [::]), interface names, other
    hosts, other transports and anything unparseable give False. Never raises."""
    transport, sep, rest = str(endpoint).partition("://")
    if not sep:
        return False
    if transport in ("ipc", "inproc"):
        return True
    if transport != "tcp" or ";" in rest:  # "src;dst" connect syntax: not a bind address
        return False
    host, colon, port = rest.rpartition(":")
    return bool(colon and port) and is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    """True for a host only this machine reaches: localhost, 127.0.0.0/8, ::1 (bracketed or
    not, IPv4-mapped too). Any other name may resolve anywhere: False. Never raises."""
    host = str(host or "").strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def is_curve_secured(sock: zmq.Socket[bytes]) -> bool:
    """True when `sock` is a CURVE server that asks a ZAP handler (non-empty ZAP domain) and
    fails closed without one (ZAP_ENFORCE_DOMAIN): what curve.CurveServer.secure() sets."""
    return bool(sock.getsockopt(zmq.CURVE_SERVER) and sock.getsockopt(zmq.ZAP_DOMAIN)
                and sock.getsockopt(zmq.ZAP_ENFORCE_DOMAIN))


def check_bind_policy(endpoint: str, curve_enabled: bool) -> None:
    """Allow a bind on a loopback endpoint always, elsewhere only with CURVE (and its ZAP
    allowlist) on. Raises ValueError naming the endpoint otherwise."""
    if not curve_enabled and not is_loopback(endpoint):
        raise ValueError(
            f"refusing to bind {endpoint}: it is not a loopback address and CURVE is off. "
            "Bind to tcp://127.0.0.1:PORT, or turn CURVE on (python main.py keys generate DIR)")


def _client_address(endpoint: str) -> str:
    """A wildcard bind address as a client on this machine would connect to it."""
    for wildcard, local in (("tcp://0.0.0.0:", "tcp://127.0.0.1:"), ("tcp://[::]:", "tcp://[::1]:")):
        if endpoint.startswith(wildcard):
            return local + endpoint[len(wildcard):]
    return endpoint


def bind_endpoint(sock: zmq.Socket[bytes], endpoint: str) -> str:
    """Bind `sock` to `endpoint` under check_bind_policy (CURVE counts as on when
    is_curve_secured(sock)); port 0 or * picks a free port. Returns the endpoint actually bound
    (LAST_ENDPOINT), a wildcard host replaced by loopback so a local client can connect to it.
    Raises ValueError (policy) or zmq.ZMQError (the bind itself, e.g. address in use)."""
    secured = is_curve_secured(sock)
    check_bind_policy(endpoint, secured)
    sock.bind(endpoint)
    actual = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    if not secured and not is_loopback(actual):  # e.g. "localhost" resolving elsewhere
        sock.unbind(actual)
        check_bind_policy(actual, False)
    return _client_address(actual)
