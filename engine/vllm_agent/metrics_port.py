"""The agent's /metrics, on a port of its own: the same families as a PageWarden engine's.

vLLM's own /metrics is served by its API server process, and the agent lives in the engine
core process, so the agent cannot add to it without changing vLLM: it serves its own, on
`kv_connector_extra_config` "metrics" ("127.0.0.1:PORT"; off when not given). The agent's
thread renders the text once a second (MetricsPort.update); the HTTP thread only hands out
the latest bytes, so a scrape never touches the agent's state and costs vLLM nothing.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from engine.http.prometheus_text import CONTENT_TYPE
from engine.wire.sockets import is_loopback_host


def parse_address(value: str, *, allow_remote: bool = False) -> tuple[str, int]:
    """"HOST:PORT" -> (host, port). Loopback only unless allow_remote ("metrics_allow_remote":
    HTTP has no CURVE, the same rule as serve's --http-host). Raises ValueError naming the value."""
    host, _, port = str(value).rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"metrics address {value!r}: expected HOST:PORT with a port in 0..65535")
    host = host.strip("[]")
    if not is_loopback_host(host) and not allow_remote:
        raise ValueError(f"metrics address {value!r} is not a loopback address and HTTP has no CURVE: put it "
                         f"behind a proxy and set \"metrics_allow_remote\": true to serve it there")
    return host, int(port)


class MetricsPort:
    def __init__(self, address: str, *, allow_remote: bool = False):
        self._text = b""
        text = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics here")
                    return
                body = text._text
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # scrapes are not worth a log line each
                return

        self.server = ThreadingHTTPServer(parse_address(address, allow_remote=allow_remote), Handler)
        self.server.daemon_threads = True
        host, port = self.server.server_address[:2]
        self.url = f"http://{host}:{port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="pagewarden-agent-metrics",
                                        daemon=True)
        self._thread.start()

    def update(self, text: bytes) -> None:
        """The latest exposition (the agent's thread, once a second)."""
        self._text = text

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
