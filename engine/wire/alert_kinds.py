"""Every alert kind the engine (or the app, for its own probe) can raise: declared once.

The supervisor's AlertBook refuses a kind not declared here, reproduction counts the
detectors from it, and the GUI and snapshot schema read the severities. Adding an alert
kind is one entry here plus the code that fires it (and its test).
"""

from __future__ import annotations

from typing import NamedTuple

SEVERITIES = ("info", "warning", "error", "critical")  # lowest first


class AlertKind(NamedTuple):
    name: str
    severity: str  # the usual severity (a caller may raise or lower it for one alert)
    detects_cross_reads: bool  # a detector of cross-request reads: reproduction scores it
    isolation: bool  # an isolation failure (not an admission decision or a worker condition)
    help: str
    runbook: tuple[str, ...]  # what an operator does next, a few short steps in order
    # a request read (or answered with) data not its own: unless the alert says it was
    # prevented, the data reached a response (the incident report counts it as crossed)
    reaches_reply: bool = False
    # its very firing says the defence stopped the data (it carries no `prevented` field)
    prevented_by_firing: bool = False


# Steps several isolation kinds share (the alert detail shows the incident scope below the runbook)
_SNAPSHOT_NOW = ("Export an incident snapshot now (right-click the alert: Export incident snapshot…, or Ctrl+E), "
                 "before the pages are reused and scrubbed")
_NOTIFY_TENANTS = ("Read \"Tenants in scope\" below: each line says which tenant received whose data. Notify "
                   "those tenants' owners; Copy scope as JSON for the incident ticket")
_DRAIN = ("Stop new traffic to this engine (drain it at the load balancer) until the cause is fixed; "
          "Stop in the Workers panel fails the pool's running requests at once")
_DEFENCES_ON = ("Check the Faults banner: every defence that is off or fault that is on is a suspect. Keep "
                "writer_tag_check, manifest_check, deferred_release and scrub on (Reconfigure, Ctrl+R)")

ALERT_KINDS = (
    AlertKind("ownership_violation", "critical", True, True,
              "a request read or wrote a token slot another request (or nobody) wrote (I1)",
              (_SNAPSHOT_NOW, _DRAIN, _DEFENCES_ON, _NOTIFY_TENANTS,
               "Read the alert's prevented field: true, the reads were masked and the requests named aborted; "
               "false (writer_tag_check off, or report_only), their replies went out: treat those replies as "
               "leaked"), reaches_reply=True),
    AlertKind("transfer_mismatch", "critical", True, True, "a KV transfer did not match its manifest (I3)",
              (_SNAPSHOT_NOW,
               "The request was failed (transfer_mismatch) unless manifest_check is off: then its decode may have "
               "read pages it was not sent. Check the Faults banner for manifest_check off or short_transfer on",
               _NOTIFY_TENANTS,
               "If it repeats with every defence on and no fault, it is an engine bug: file it with the snapshot "
               "and the prefill worker's name")),
    AlertKind("transfer_timeout", "critical", True, True, "a KV transfer did not complete in time",
              ("Check the sending prefill worker in the Workers panel: a crashed or silent worker "
               "(worker_crashed, worker_unresponsive) explains a lost transfer",
               "The request failed with transfer_timeout (clients got a 503 and may retry)",
               "If deferred_release is off (Faults banner) the late write can still land in reused pages: "
               "watch for late_write_landed and export a snapshot (Ctrl+E)",
               "Repeating under load: lower max_batch or max_prefill_tokens (Reconfigure, Ctrl+R)")),
    AlertKind("late_write_landed", "critical", True, True,
              "a transfer wrote pages after their reservation ended (I4 off: written anyway)",
              (_SNAPSHOT_NOW,
               "Turn deferred_release back on and early_release off (Reconfigure, Ctrl+R)",
               _DRAIN,
               _NOTIFY_TENANTS)),
    AlertKind("late_write_dropped", "warning", True, True, "a late transfer write was dropped (I4)",
              ("No data crossed: deferred_release dropped the write. Nobody needs notifying",
               "Find why the transfer was late: a slow, crashed or restarting prefill worker (Workers panel), "
               "or a transfer_timeout alert for the same request",
               "Check the Faults banner for early_release; if no fault is on and it repeats, export a snapshot "
               "(Ctrl+E) and file it"), prevented_by_firing=True),
    AlertKind("canary_leak", "critical", True, True, "a request touched pages a canary wrote",
              (_SNAPSHOT_NOW,
               "The path that leaked the canary's pages leaks real tenants' pages too: treat it as an "
               "ownership violation",
               _DRAIN,
               _DEFENCES_ON,
               _NOTIFY_TENANTS,
               "After the fix, fire a canary (python main.py canary) and confirm no alert follows"),
              reaches_reply=True),
    AlertKind("canary_marker_in_output", "critical", True, True, "a canary's marker text came out in a reply",
              (_SNAPSHOT_NOW,
               _DRAIN,
               "The alert names the request whose reply held the marker: that reply carried another request's "
               "content, and other replies in this window may too",
               _NOTIFY_TENANTS,
               _DEFENCES_ON,
               "After the fix, fire a canary (python main.py canary) and confirm no alert follows"),
              reaches_reply=True),
    AlertKind("admission_rejected", "info", True, False, "a request was refused before any allocation (I2)",
              ("Usually expected: a request larger than the window or the pools was refused before allocating "
               "anything; the client got a 400 naming the limit",
               "If the detail says \"let through\" or \"placeholder\", the admission defence is off or "
               "placeholder_on_reject is on: fix both (Reconfigure, Ctrl+R) and export a snapshot (Ctrl+E)",
               "Many refusals from one client: tell it the limit, or raise context_window only if the pools "
               "hold it (see the Capacity banner)")),
    AlertKind("capacity_exceeds_window", "critical", False, False,
              "the advertised context window exceeds what the pools can hold",
              ("A request of the full advertised window would not fit in the named pool",
               "Reconfigure (Ctrl+R): lower context_window to what the detail says fits, or add pages to that pool",
               "Set engine.strict_capacity = true so an engine in this state refuses to start",
               "The alert resolves, and the Capacity banner hides, once every pool holds the window")),
    AlertKind("worker_crashed", "critical", False, False, "a worker process exited",
              ("Read the exit code or signal in the detail (signal 9: killed, often out of memory; check the "
               "host's kernel log)",
               "The worker's last 40 log lines travel with the alert (log_tail): export a snapshot (Ctrl+E) "
               "to keep them",
               "Its running requests failed (worker_crashed, a 503 to clients); they may retry",
               "The restart policy ([workers] restart, restart_limit, restart_backoff_ms) starts it again; after "
               "restart_limit crashes in a row it stays down: fix the cause, then Start it in the Workers panel")),
    AlertKind("worker_restarted", "warning", False, False, "a crashed worker was started again by the restart policy",
              ("The worker_crashed alert before this one holds the cause (exit code, log tail)",
               "The detail counts crashes in a row against restart_limit: a crash loop ends with the worker down",
               "If it keeps crashing, Stop it in the Workers panel and fix the cause (memory, device, model path) "
               "first")),
    AlertKind("worker_unresponsive", "warning", False, False, "a worker stopped answering heartbeats",
              ("The worker is busy (a long prefill, a kernel compile) or hung: check its state and in-flight "
               "requests in the Workers panel",
               "One long prompt at a time: lower max_prefill_tokens (Reconfigure, Ctrl+R)",
               "Still silent after a minute: Restart it in the Workers panel (its running requests fail)",
               "The alert resolves when heartbeats come back or the worker exits")),
    AlertKind("reconfigure_rolled_back", "error", False, False,
              "a worker restarted for a reconfigure crashed before it was ready: the old config is back",
              ("Nothing runs the new configuration: the previous one is back on every worker",
               "The detail names the worker and why it crashed; its worker_crashed alert holds the log tail",
               "Usual causes: pools too large for the device's memory, a model path or dtype the worker cannot "
               "load. Fix that value and Reconfigure (Ctrl+R) again")),
    AlertKind("block_table_mismatch", "critical", False, True,
              "a request's block table does not cover exactly its computed tokens (vLLM agent)",
              (_SNAPSHOT_NOW,
               "vLLM's scheduler holds more or fewer blocks for the request than its tokens need: a block too "
               "few means tokens written into no block or another's; one too many is a block no one else can use",
               "Not caused by PageWarden (the agent only reads): file it against vLLM with the snapshot, the "
               "vLLM version and the flags the server was started with",
               _NOTIFY_TENANTS,
               _DRAIN), reaches_reply=True),
    AlertKind("cross_tenant_share", "critical", True, True,
              "a vLLM prefix-cache block reached requests of different cache salts (vLLM agent)",
              ("Read the detail: requests of different cache_salts shared a block, which vLLM never does while "
               "it hashes the salt. Restart vLLM with --no-enable-prefix-caching until it is fixed",
               _SNAPSHOT_NOW,
               _NOTIFY_TENANTS,
               "Salts are secrets: the alert names each by the first 8 hex digits of its SHA-256. Hash your "
               "tenants' salts the same way to tell whose they are; file a crossing against vLLM with the "
               "snapshot and its version")),
    AlertKind("prefix_cache_shared", "warning", False, False,
              "a vLLM prefix-cache block reached requests of different tenants under one salt, or none (vLLM agent)",
              ("A finding of configuration, not a crossing: each tenant's cache hits (its time to first token) "
               "reveal the other's prompts, token by token (InputSnatch, PROMPTPEEK)",
               "Send a per-tenant cache_salt in every request (vLLM's API takes it in the body), or route each "
               "tenant to its own instance",
               "Check the agent's tenant_field names the request field that says the tenant",
               "Verify with the probe's cache_salt check (Tools → Probe an OpenAI endpoint…) once salts are set")),
    AlertKind("cache_salt_shared", "critical", False, False,
              "requests with different cache_salt values reused each other's prefix cache (the app's cache_salt check)",
              ("Read the detail: how many different-salt requests reported cached tokens (or ran as fast as hits), "
               "and whether the check ran with --no-salt (an ablation: then the sharing was asked for)",
               "Until fixed, any tenant can time another's prompts through the shared cache: turn prefix caching off "
               "on that endpoint (vLLM: --no-enable-prefix-caching) or route each tenant to its own instance",
               "Check that every hop (gateway, router, proxy) forwards each request's cache_salt unchanged: a hop that "
               "drops it puts all tenants in one cache namespace",
               "Check the engine honours cache_salt (vLLM 0.9 or later, on /v1/completions and /v1/chat/completions)",
               "Run the check again (Tools → Probe an OpenAI endpoint…, Check cache_salt isolation) until it says "
               "salt isolation holds")),
    AlertKind("internal_error", "error", False, False, "the server failed to handle a message",
              ("One message failed (its client got internal_error); the engine went on serving",
               "The subject names where and the exception type, the detail the message: export a snapshot "
               "(Ctrl+E) and file a bug with both",
               "Repeating for one peer: that client sends something the engine mishandles; the alert names the "
               "peer")),
    AlertKind("telemetry_subscriptions_capped", "warning", False, False,
              "more distinct telemetry subscriptions than the limit: the publisher was reset",
              ("Viewers reconnected and saw a sequence gap; press F5 in a viewer whose page maps look stale",
               "Find the client that subscribes to many distinct topics (one per request?) and make it "
               "subscribe by prefix, or attach fewer viewers")),
    AlertKind("journal_failing", "error", False, False,
              "the evidence journal cannot write, or drops records (queue full): the incident record is incomplete",
              ("Read the detail: the disk is full, the file turned read-only, or the writer falls behind",
               "Serving goes on; what is not written is lost on a restart. Free space or fix the file's "
               "permissions; the writer tries again every few seconds and the alert resolves when writes succeed",
               "Export a snapshot now (Ctrl+E): the engine's memory still holds the evidence",
               "The counts of records dropped and lost stay in status (evidence) and /metrics")),
    AlertKind("no_decode_capacity", "critical", False, False,
              "no decode worker is ready: the engine cannot serve",
              ("Check the Workers panel: every decode worker is stopped, crashed, starting or draining",
               "Start a stopped one (Workers panel) or wait for the restart policy; queued requests fail after "
               "workers.unplaced_timeout_s",
               "The alert resolves as soon as a decode worker is ready")),
    AlertKind("slow_kernels", "warning", False, False,
              "a worker runs the slow torch reference kernels: the C++ CPU module could not be built",
              ("Read the detail: the build's first error (no compiler, no ninja, a cache folder it cannot write)",
               "Run `.venv/bin/python -m kernels.cpu_extension` on this machine: it builds the module or says why; "
               "`make` does it at set-up",
               "Restart the worker (Workers panel) once it builds: the alert resolves when its hello says the "
               "module runs")),
    AlertKind("probe_error", "warning", False, False, "the app's black-box probe could not run a round",
              ("Read the detail: the probed endpoint refused, timed out or answered in a shape the probe did "
               "not expect",
               "Check the endpoint URL, model name and API key in the probe settings, and that the server is up",
               "Until a round runs again, replies are not being checked for other requests' data")),
)

BY_NAME = {kind.name: kind for kind in ALERT_KINDS}
DETECTORS = tuple(kind.name for kind in ALERT_KINDS if kind.detects_cross_reads)
ISOLATION_KINDS = tuple(kind.name for kind in ALERT_KINDS if kind.isolation)
REACHES_REPLY_KINDS = tuple(kind.name for kind in ALERT_KINDS if kind.reaches_reply)
PREVENTED_BY_FIRING_KINDS = tuple(kind.name for kind in ALERT_KINDS if kind.prevented_by_firing)


def alert_kind(name: str) -> AlertKind:
    """The declaration of `name`; raises ValueError naming the unknown kind."""
    try:
        return BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown alert kind {name!r}; declared: {', '.join(BY_NAME)}") from None


def check_severity(severity: str) -> str:
    if severity not in SEVERITIES:
        raise ValueError(f"unknown alert severity {severity!r}; one of {', '.join(SEVERITIES)}")
    return severity
