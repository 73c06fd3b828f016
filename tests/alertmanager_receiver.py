"""A stand-in Alertmanager for tests: POST /api/v2/alerts on loopback, every body kept.

`answers` is a list of answers for the first POSTs (then `then`, 200 unless told): an HTTP
status, or an Answer with a body and headers (a receiver that streams a huge body, or
redirects). `hold` is an Event that, while clear, holds each POST open (a receiver that hangs).
A POST to any path ending with /api/v2/alerts is taken (a base URL with a path); the query
string is not looked at; every request's path (a GET's too), query included, is kept in `paths`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

API_PATH = "/api/v2/alerts"


@dataclass(frozen=True)
class Answer:
    """An answer: `status`, then `body` written `repeat` times (Content-Length says the total:
    Answer(500, b"x" * 65536, 16384) streams 1 GiB without holding it), with `headers`."""
    status: int
    body: bytes = b""
    repeat: int = 1
    headers: dict = field(default_factory=dict)


class AlertmanagerReceiver:
    def __init__(self, answers=(), hold: threading.Event | None = None, then: int | Answer = 200):
        self.posts: list[list[dict]] = []  # each delivered body (a list of alerts)
        self.paths: list[str] = []  # each request's path and query, in order of arrival
        self.written: list[int] = []  # body bytes written per answer before it ended (or the client left)
        self.answers = [a if isinstance(a, Answer) else Answer(a) for a in answers]
        self.then = then if isinstance(then, Answer) else Answer(then)
        self.hold = hold
        self.arrived = threading.Event()  # set at each POST's arrival, before hold
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.paths.append(self.path)
                receiver.arrived.set()
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                ours = urlsplit(self.path).path.endswith(API_PATH)
                with receiver.lock:
                    answer = (receiver.answers.pop(0) if receiver.answers else receiver.then) if ours else Answer(404)
                    if answer.status == 200:
                        receiver.posts.append(json.loads(body))
                written = 0
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(answer.body) * answer.repeat))
                    self.end_headers()
                    for _ in range(answer.repeat):
                        self.wfile.write(answer.body)
                        written += len(answer.body)
                except OSError:  # the client closed the connection: the rest is never sent
                    self.close_connection = True
                with receiver.lock:
                    receiver.written.append(written)

            def do_GET(self):  # (only a client following a redirect with a GET asks this)
                with receiver.lock:
                    receiver.paths.append(self.path)
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, name: str | None = None) -> list[dict]:
        """Every alert received (resends included), oldest first; only `name`'s when given."""
        with self.lock:
            return [a for body in self.posts for a in body if name is None or a["labels"]["alertname"] == name]

    def wait_for(self, predicate, timeout_s: float = 30.0) -> list[dict]:
        """Poll until predicate(alerts()) is true; returns alerts(). AssertionError on timeout."""
        deadline = time.monotonic() + timeout_s
        while not predicate(alerts := self.alerts()):
            assert time.monotonic() < deadline, f"the receiver did not get what was expected: {alerts}"
            time.sleep(0.02)
        return alerts

    def wait_written(self, count: int, timeout_s: float = 60.0) -> list[int]:
        """Poll until `count` answers have ended; returns the bytes of body each wrote."""
        deadline = time.monotonic() + timeout_s
        while len(written := list(self.written)) < count:
            assert time.monotonic() < deadline, f"{len(written)} answers ended, not {count}: {written}"
            time.sleep(0.02)
        return written

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()
