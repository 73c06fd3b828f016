"""TelemetryPublisher: the supervisor's PUB side (an XPUB, so it knows who listens).

Every topic carries its own sequence number; `pages/<pool>` messages keep the sequence of
the worker that owns the pool, so a subscriber can tell it missed a delta and ask for a
keyframe. Page telemetry is computed by the workers only while someone subscribes to it.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import zmq

from engine.wire.protocol import pack
from engine.wire.sockets import drain
from engine.wire.states import PAGES_PREFIX, pages_topic

if TYPE_CHECKING:
    import numpy.typing as npt

    Arrays = dict[str, npt.NDArray[Any]]  # a bulk message's arrays, by name

RECENT_MESSAGES = 50_000
# Distinct topics subscribed at once. libzmq keeps every subscription in a trie (~24 bytes
# per byte of topic, topics are at most MAX_SUBSCRIPTION_FRAME long) and cannot drop one
# peer's; past the limit the owner resets the publisher (TelemetryPublisher.reset, used by
# the supervisor and the vLLM agent): ~3 MB at most. The app subscribes to a handful of
# topics (one per pool, plus ~8).
MAX_SUBSCRIPTIONS = 256
REBIND_GIVE_UP_S = 5.0  # libzmq's I/O thread frees the old listener within milliseconds


def release_freed_memory() -> None:
    """Give freed heap pages back to the OS (glibc's malloc_trim), so that memory a reset
    freed shows in RSS; a no-op where there is no glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _small(value: object) -> bool:
    return isinstance(value, (int, float, str, bool)) or value is None


def _summary(arrays: Arrays | None) -> dict[str, Any]:
    """A bulk message in the event log: which arrays, how many elements, not their bytes."""
    if not arrays:
        return {}
    return {"bulk": {name: int(getattr(a, "size", len(a))) for name, a in arrays.items()}}


class TelemetryPublisher:
    def __init__(self, sock: zmq.Socket[bytes], limit: int = MAX_SUBSCRIPTIONS) -> None:
        self.sock = sock
        self.seq: dict[str, int] = {}
        self.subscriptions: set[bytes] = set()
        self.bad_subscriptions = 0
        self.limit = limit
        self.refused_subscriptions = 0  # new topics past the limit
        self.resets = 0  # times the publisher was replaced because of them
        self.over_limit = False  # a topic was refused since the last reset: reset now
        # What was published, for incident snapshots: small headers whole, bulk frames
        # summarised (their array names and sizes). Kept whether or not anyone listens.
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_MESSAGES)

    def publish(self, topic: str, header: dict[str, Any], arrays: Arrays | None = None) -> int:
        seq = self.seq.get(topic, 0) + 1
        self.seq[topic] = seq
        message = {"topic": topic, "seq": seq, "time": time.time(), **header}
        self.recent.append({**message, **_summary(arrays)} if arrays else message)
        self._send(topic, pack(message, arrays))
        return seq

    def since(self, since: float) -> list[dict[str, Any]]:
        return [m for m in self.recent if m["time"] >= since]

    def relay_pages(self, header: dict[str, Any], arrays: Arrays) -> None:
        """Forward a worker's `pages` message as topic pages/<pool>, keeping the worker's
        per-pool sequence number; the arrays are views of the received frames (no copy)."""
        topic = pages_topic(header["pool"])
        out = {k: v for k, v in header.items() if k not in ("op", "v")}
        out["topic"] = topic
        if self.wants_pages():  # only then do workers send page telemetry at all
            self.recent.append({"time": time.time(), **{k: v for k, v in out.items() if _small(v)},
                                **_summary(arrays)})
        self._send(topic, pack(out, arrays))

    def _send(self, topic: str, frames: list[bytes | memoryview]) -> None:
        try:
            self.sock.send_multipart([topic.encode(), *frames], copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # a PUB never blocks; a slow subscriber sees a sequence gap

    def drain_subscriptions(self) -> bool:
        """Read (un)subscribe messages; returns True when interest in pages changed. Stops at
        the first topic past the limit (`over_limit`): the owner resets the publisher then,
        and every subscription libzmq took meanwhile would only be freed with it."""
        before = self.wants_pages()
        for frames in drain(self.sock, copy=True):
            frame = frames[0]
            if frame[:1] == b"\x01":
                if frame[1:] not in self.subscriptions and len(self.subscriptions) >= self.limit:
                    self.refused_subscriptions += 1  # libzmq holds it already: only a reset frees it
                    self.over_limit = True
                    break
                self.subscriptions.add(frame[1:])
            elif frame[:1] == b"\x00":
                self.subscriptions.discard(frame[1:])
            else:
                self.bad_subscriptions += 1  # not a subscription: count and drop
        return self.wants_pages() != before

    def replace(self, sock: zmq.Socket[bytes]) -> None:
        """Publish on a fresh socket (after a reset): no subscription is held until the
        subscribers, reconnecting, send theirs again."""
        self.sock = sock
        self.subscriptions.clear()
        self.over_limit = False
        self.resets += 1

    def reset(self, make_socket: Callable[[], zmq.Socket[bytes]], endpoint: str,
              give_up_s: float = REBIND_GIVE_UP_S) -> zmq.Socket[bytes]:
        """More distinct subscriptions than `limit`: libzmq holds each one and cannot drop a
        single peer's, so close the publisher (freeing them all), bind `make_socket()` at the
        same `endpoint` and publish on it. Subscribers reconnect and subscribe again by
        themselves (they see a sequence gap); a peer that floods again is refused again.
        Returns the new socket (the caller polls it). Raises zmq.ZMQError when `endpoint`
        cannot be bound again within `give_up_s`; the new socket is published on all the same
        (unbound: every message dropped), so publishing never fails."""
        self.sock.close(linger=0)
        sock = make_socket()
        self.replace(sock)
        deadline = time.monotonic() + give_up_s
        while True:  # the old listener is closed by libzmq's I/O thread, soon after close()
            try:
                sock.bind(endpoint)
                break
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        release_freed_memory()
        return sock

    def capped_detail(self) -> str:
        """The `telemetry_subscriptions_capped` alert's text after a reset."""
        return (f"more than {self.limit} distinct telemetry subscriptions ({self.refused_subscriptions} refused "
                "in all): the publisher was reset; subscribers reconnect and see a sequence gap")

    def describe(self, limit: int = 64) -> dict[str, Any]:
        """For status: the topics someone subscribes to (a client can wait until its own
        subscription is live instead of sleeping), and the frames that were not one."""
        topics = sorted(t.decode(errors="replace")[:80] for t in self.subscriptions)
        return {"subscriptions": topics[:limit], "subscription_count": len(topics),
                "subscription_limit": self.limit, "refused_subscriptions": self.refused_subscriptions,
                "publisher_resets": self.resets, "bad_subscriptions": self.bad_subscriptions}

    def wants_pages(self) -> bool:
        prefix = PAGES_PREFIX.encode()
        return any(prefix.startswith(s) or s.startswith(prefix.rstrip(b"/")) for s in self.subscriptions)
