"""`serve`: run the supervisor headless (a GPU box that operators attach to)."""

from __future__ import annotations

import json
import signal
import sys

from engine.commands.common import EXIT_OK, add_model_args, fail, load_config
from engine.http.options import add_http_args, check_http_args, start_http
from engine.wire.roles import DEFAULT_LOCAL_ROLE, ROLES


def register(sub) -> None:
    serve = sub.add_parser(
        "serve", help="run the engine server (supervisor + prefill/decode workers)",
        description="Start the supervisor, which spawns the configured prefill and decode workers. "
        "Binds to loopback unless --curve is given.",
    )
    add_model_args(serve)
    serve.add_argument("--bind", default="tcp://127.0.0.1:5650", help="control endpoint (port 0: any free port)")
    serve.add_argument("--telemetry-bind", help="telemetry endpoint (default: control port + 1; a random port when the control port is 0)")
    serve.add_argument("--curve", action="store_true", help="require CurveZMQ with a client-key allowlist")
    serve.add_argument("--keys", help="key directory for --curve (from `keys generate`)")
    serve.add_argument("--local-role", choices=ROLES, default=DEFAULT_LOCAL_ROLE,
                       help="every client's role without --curve (loopback only; default admin). With "
                            "--curve a key's role is its allowlist sub-directory: clients/viewer/, "
                            "clients/operator/, clients/admin/ (a key directly in clients/ is admin)")
    serve.add_argument("--allow-faults", action="store_true",
                       help="allow turning defences off and faults on (reproducing incidents; never in production)")
    serve.add_argument("--json", action="store_true", help="print a JSON line with the endpoints when ready")
    serve.add_argument("--alert-webhook", metavar="URL",
                       help="forward alerts to an Alertmanager-compatible receiver: POST URL/api/v2/alerts "
                       "(overrides [alerts] webhook_url; '' turns it off)")
    add_http_args(serve)
    serve.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from engine.errors import PageWardenError
    from engine.parent_watch import die_with_parent_from_env
    from engine.server.supervisor import Supervisor

    die_with_parent_from_env()  # started by LocalServer: end (SIGTERM, a clean stop) with it
    from engine.server.memory_trace import install_from_env

    install_from_env()  # a soak's allocation sites, only when PAGEWARDEN_TRACEMALLOC names a file

    curve = None
    try:
        config = load_config(args)
        if args.alert_webhook is not None:
            from engine.config import check_http_url

            config = config.replace(alerts={"webhook_url": check_http_url("--alert-webhook", args.alert_webhook)})
        check_http_args(args)
        if args.curve:
            import zmq

            from engine.wire.curve import CurveServer

            if not args.keys:
                raise ValueError("--curve needs --keys DIR (create one with `python main.py keys generate DIR`)")
            curve = CurveServer(zmq.Context(), args.keys)
        supervisor = Supervisor(config, bind=args.bind, telemetry_bind=args.telemetry_bind, curve=curve,
                                allow_faults=args.allow_faults, local_role=args.local_role)
    except (PageWardenError, ValueError, FileNotFoundError, OSError) as exc:
        if curve is not None:
            curve.stop()
        return fail(args, exc)
    stop = lambda *_: setattr(supervisor, "stopping", True)  # noqa: E731
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    supervisor.start_workers()
    try:
        supervisor.wait_started()  # "ready" means ready: a worker that cannot start is an error here
    except PageWardenError as exc:
        supervisor.shutdown()
        return fail(args, exc)
    for finding in supervisor.findings:
        if finding.exceeds:
            print(f"WARNING: {finding.message()}", file=sys.stderr)
    http = metrics = None
    try:
        http = start_http(args, supervisor.control_endpoint)
        metrics = start_http(args, supervisor.control_endpoint, only_metrics=True)
    except (OSError, ValueError, TimeoutError) as exc:
        if http:
            http.stop()
        supervisor.shutdown()
        return fail(args, exc)
    ready = {"ready": True, "control": supervisor.control_endpoint, "telemetry": supervisor.telemetry_endpoint,
             "curve": curve is not None, "workers": list(supervisor.workers), "http": http and http.url,
             "metrics": metrics and metrics.url, "alert_webhook": supervisor.forwarder.shown_url or None}
    if args.json:
        print(json.dumps(ready), flush=True)
    else:
        print(f"PageWarden engine: control {supervisor.control_endpoint}, telemetry "
              f"{supervisor.telemetry_endpoint}, workers {', '.join(supervisor.workers)}"
              + (f", HTTP {http.url} (no CURVE)" if http else "")
              + (f", metrics {metrics.url}/metrics" if metrics else "")
              + (f", alerts to {supervisor.forwarder.shown_url}" if supervisor.forwarder.shown_url else ""),
              flush=True)
    try:
        supervisor.run()
    finally:
        for front in (http, metrics):
            if front:
                front.stop()
        supervisor.shutdown()
    return EXIT_OK
