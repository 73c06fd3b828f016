"""A stand-in Alertmanager for tests: POST /api/v2/alerts on loopback, every body kept.

`answers` is a list of HTTP statuses for the first POSTs (then 200); `hold` is an Event that,
while clear, holds each POST open (a receiver that hangs).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class AlertmanagerReceiver:
    def __init__(self, answers=(), hold: threading.Event | None = None):
        self.posts: list[list[dict]] = []  # each delivered body (a list of alerts)
        self.answers = list(answers)
        self.hold = hold
        self.arrived = threading.Event()  # set at each POST's arrival, before hold
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.arrived.set()
                if receiver.hold is not None:
                    receiver.hold.wait(30)
                with receiver.lock:
                    status = receiver.answers.pop(0) if receiver.answers else 200
                    if self.path == "/api/v2/alerts" and status == 200:
                        receiver.posts.append(json.loads(body))
                self.send_response(status if self.path == "/api/v2/alerts" else 404)
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

    def close(self) -> None:
        if self.hold is not None:
            self.hold.set()
        self.server.shutdown()
        self.server.server_close()
