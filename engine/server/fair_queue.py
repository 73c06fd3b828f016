"""FairQueue: the line of admitted requests, served round robin between clients.

First come, first served let one client's 1,000 queued requests (each within its budget) sit in
front of another client's next request for the whole time they took. Here each client has its
own line and the head of the queue is the next client's oldest request, in turn: a request
waits for at most one request of each other client with work queued, however many they have.

Two levels, so that no one gains a larger share by naming more clients: the first is the
connection (its CURVE key, or its loopback connection), the second a sub-client the
connection names (the HTTP front names each HTTP peer). Connections take turns; within a
connection, its sub-clients take turns.

The interface is the deque's that it replaces, by request id: head (queue[0]), popleft,
appendleft (a request that goes back keeps its place: the head of its own line, and its
client first in turn), remove, len, in, and iteration (in service order).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator

Key = tuple[str, str]  # (connection, sub-client)


class FairQueue:
    def __init__(self) -> None:
        # connection -> (sub-client -> its line); both OrderedDicts hold the turn order
        self._lines: OrderedDict[str, OrderedDict[str, deque[str]]] = OrderedDict()
        self._key_of: dict[str, Key] = {}

    def append(self, request_id: str, key: Key) -> None:
        self._line(key).append(request_id)
        self._key_of[request_id] = key

    def appendleft(self, request_id: str, key: Key) -> None:
        """Back to the very head: its line's first, its sub-client and connection first in turn."""
        self._line(key).appendleft(request_id)
        self._key_of[request_id] = key
        self._lines.move_to_end(key[0], last=False)
        self._lines[key[0]].move_to_end(key[1], last=False)

    def __getitem__(self, index: int) -> str:
        if index != 0:
            raise IndexError("FairQueue gives only its head (queue[0])")
        if not self._lines:
            raise IndexError("the queue is empty")
        subs = next(iter(self._lines.values()))
        return next(iter(subs.values()))[0]

    def popleft(self) -> str:
        """The head; its sub-client and its connection go to the back of their turns."""
        conn, subs = next(iter(self._lines.items()))
        sub, line = next(iter(subs.items()))
        request_id = line.popleft()
        del self._key_of[request_id]
        if line:
            subs.move_to_end(sub)
        else:
            del subs[sub]
        if subs:
            self._lines.move_to_end(conn)
        else:
            del self._lines[conn]
        return request_id

    def remove(self, request_id: str) -> None:
        conn, sub = self._key_of.pop(request_id)
        line = self._lines[conn][sub]
        line.remove(request_id)
        if not line:
            del self._lines[conn][sub]
            if not self._lines[conn]:
                del self._lines[conn]

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._key_of

    def __len__(self) -> int:
        return len(self._key_of)

    def __bool__(self) -> bool:
        return bool(self._key_of)

    def __iter__(self) -> Iterator[str]:
        """The ids in the order popleft would give them (a copy: the queue may change meanwhile)."""
        copy = FairQueue()
        copy._lines = OrderedDict((conn, OrderedDict((sub, deque(line)) for sub, line in subs.items()))
                                  for conn, subs in self._lines.items())
        copy._key_of = dict(self._key_of)
        return iter([copy.popleft() for _ in range(len(copy))])

    def clients(self) -> int:
        """Connections with requests in line."""
        return len(self._lines)

    def _line(self, key: Key) -> deque[str]:
        conn, sub = key
        return self._lines.setdefault(conn, OrderedDict()).setdefault(sub, deque())
