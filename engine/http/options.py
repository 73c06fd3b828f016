"""`serve`'s HTTP flags and the rule that HTTP stays on loopback unless asked otherwise.

HTTP here has no CURVE: no encryption and no client authentication. A non-loopback
--http-host is refused unless --http-allow-remote says the operator put it behind
something that provides both.
"""

from __future__ import annotations

from engine.http.template_worker import MAX_RENDER_CPU_S
from engine.wire.sockets import is_loopback_host

MAX_PORT = 65535
MAX_RENDER_CPU_FLAG_S = 3_600.0  # the largest --chat-render-cpu-s: an hour for one prompt is never a template


def add_http_args(parser) -> None:
    parser.add_argument("--http-port", type=int, metavar="N",
                        help="also serve the OpenAI-compatible API (/v1/completions, /v1/models) on port N "
                        "(0: any free port; the --json ready line gains 'http' with the URL)")
    parser.add_argument("--metrics-port", type=int, metavar="N",
                        help="serve Prometheus metrics (GET /metrics) alone on port N, on --http-host "
                        "(0: any free port; the --json ready line gains 'metrics'). With --http-port, "
                        "/metrics is on that port too")
    parser.add_argument("--http-host", default="127.0.0.1",
                        help="address for --http-port (default 127.0.0.1). HTTP has no CURVE: no encryption, "
                        "no client authentication; a non-loopback host is refused without --http-allow-remote")
    parser.add_argument("--http-allow-remote", action="store_true",
                        help="allow a non-loopback --http-host although HTTP has no CURVE (put TLS and "
                        "authentication in front of it)")
    parser.add_argument("--chat-render-cpu-s", type=float, default=MAX_RENDER_CPU_S, metavar="S",
                        help="CPU seconds one chat template render may use before the request is refused with "
                        f"a 400 (default {MAX_RENDER_CPU_S:g}; real templates take milliseconds)")


def check_http_args(args) -> None:
    """Raises ValueError naming the value and the limit for a bad port or a refused host."""
    ports = [(flag, value) for flag, value in (("--http-port", args.http_port),
                                               ("--metrics-port", getattr(args, "metrics_port", None)))
             if value is not None]
    cpu_s = getattr(args, "chat_render_cpu_s", MAX_RENDER_CPU_S)
    if not 0 < cpu_s <= MAX_RENDER_CPU_FLAG_S:
        raise ValueError(f"--chat-render-cpu-s {cpu_s:g} is outside (0, {MAX_RENDER_CPU_FLAG_S:g}] seconds")
    if not ports:
        return
    for flag, value in ports:
        if not 0 <= value <= MAX_PORT:
            raise ValueError(f"{flag} {value} is outside 0..{MAX_PORT} (0 picks a free port)")
    if not is_loopback_host(args.http_host) and not args.http_allow_remote:
        raise ValueError(f"--http-host {args.http_host} is not a loopback address and HTTP has no CURVE "
                         "(no encryption, no client authentication); pass --http-allow-remote to serve it anyway")


def start_http(args, control_endpoint: str, *, only_metrics: bool = False):
    """The running HttpFrontend for `serve`'s flags (--http-port; with only_metrics,
    --metrics-port), or None without that flag. With --curve the frontend is a CURVE client
    with DIR/clients/client.key_secret. Raises OSError (port taken) or ValueError (keys)."""
    port = getattr(args, "metrics_port", None) if only_metrics else args.http_port
    if port is None:
        return None
    from engine.http.frontend import HttpFrontend

    curve = None
    if getattr(args, "curve", False):
        from pathlib import Path

        from engine.wire.curve import load_client_keys, load_public_key

        curve = (load_public_key(Path(args.keys) / "server.key"), *load_client_keys(args.keys))
    frontend = HttpFrontend(control_endpoint, args.http_host, port, curve=curve, only_metrics=only_metrics,
                            render_cpu_s=getattr(args, "chat_render_cpu_s", MAX_RENDER_CPU_S))
    frontend.start()
    return frontend
