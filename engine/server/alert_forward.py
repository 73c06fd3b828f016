"""AlertForwarder: the engine's alerts to an Alertmanager-compatible receiver, off the
supervisor's loop ([alerts] webhook_url, or `serve --alert-webhook URL`).

The supervisor hands every alert change to offer(), which only touches memory under a lock
and returns. A thread with its own asyncio loop (aiohttp, like the HTTP front) POSTs batches
to <url>/api/v2/alerts in Alertmanager's v2 format. What it keeps is state, as Prometheus
does: the firing alerts, each sent when new and again every `resend_s` (Alertmanager
resolves an alert it stops hearing about), and the resolved ones still to send once with
endsAt. Each is bounded by `queue` (past it the least recently changed goes, counted as
dropped when it was never delivered), so a receiver down for an hour costs no more memory
than one down for a second, and hears the current firing set when it is back. A failed POST
is retried with exponential backoff; a batch the receiver refuses (4xx) is not retried.
Pending alerts are not sent: Alertmanager knows no pending state.

The receiver is not trusted: of an answer's body at most MAX_ANSWER_BYTES are read (the rest
never is: the connection is closed), nothing is decompressed, a redirect is not followed (a
failed delivery, retried), and the URL shown (status, the log, the ready line) has no query
string or user:password (redacted_url): a ?token= in webhook_url reaches the receiver only.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Container
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from engine.wire.alert_kinds import BY_NAME
from engine.wire.states import AlertState

if TYPE_CHECKING:  # aiohttp is imported by the posting thread only
    import aiohttp

    from engine.config import EngineConfig

API_PATH = "/api/v2/alerts"
MAX_BATCH = 64  # alerts per POST
GATHER_S = 0.2  # after a change, wait this long for others to come with it
TIMEOUT_S = 10.0  # one POST, connecting included
BACKOFF_S = (1.0, 60.0)  # first wait after a failed POST, doubled per failure up to the second
MAX_FIRING = 10_000  # firing alerts remembered for resending (the alert book keeps at most this many)
MAX_TEXT = 4_000  # characters of an annotation
SUMMARY_CHARS = 200
MAX_ANSWER_BYTES = 4096  # of an answer's body read, for the error text; the rest is never read
SHOWN_ANSWER_CHARS = 200  # of that body (or a Location) quoted in last_error and the log
READ_BUFFER_BYTES = 1 << 16  # what aiohttp may buffer from the socket ahead of the read above

LabelSet = tuple[tuple[str, str], ...]  # an alert's identity to Alertmanager (_fingerprint)


def rfc3339(when: float) -> str:
    """A Unix time as RFC 3339 in UTC, milliseconds: 2026-01-02T03:04:05.678Z."""
    return datetime.fromtimestamp(when, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def webhook_endpoint(url: str) -> str:
    """The URL to POST to: /api/v2/alerts joined to `url`'s path (kept when the path already
    ends with it), the query after it, the fragment dropped:
    http://am:9093/am?token=T -> http://am:9093/am/api/v2/alerts?token=T."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    path = path if path.endswith(API_PATH) else path + API_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def redacted_url(url: str) -> str:
    """`url` as shown to people (status, the log, the ready line): scheme, host, port and
    path; no user:password, query or fragment, which may hold a secret."""
    try:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))
    except ValueError:  # (a receiver's Location can be anything)
        return "(a URL that does not parse)"


def shown_config(config: EngineConfig) -> dict[str, Any]:
    """An EngineConfig as status shows it to every client: its dict, webhook_url redacted."""
    shown = config.to_dict()
    shown["alerts"]["webhook_url"] = redacted_url(shown["alerts"]["webhook_url"])
    return shown


def shown_changes(changes: dict[str, Any]) -> dict[str, Any]:
    """A reconfigure request as the audit and the journal keep it (viewers read both): a
    webhook_url in it redacted."""
    alerts = changes.get("alerts") if isinstance(changes, dict) else None
    if not isinstance(alerts, dict) or not isinstance(alerts.get("webhook_url"), str):
        return changes
    return {**changes, "alerts": {**alerts, "webhook_url": redacted_url(alerts["webhook_url"])}}


def instance_label(control_endpoint: str) -> str:
    """The control endpoint with a loopback or wildcard host replaced by this host's name:
    two engines on two machines, both on tcp://127.0.0.1:5650, are two instances."""
    scheme, _, rest = control_endpoint.rpartition("://")
    host, _, port = rest.rpartition(":")
    if host in ("127.0.0.1", "localhost", "0.0.0.0", "*", "[::1]", "[::]", "::1", "::"):
        host = socket.gethostname()
    return f"{scheme}://{host}:{port}" if scheme else f"{host}:{port}"


def to_alertmanager(record: dict[str, Any], *, instance: str, generator_url: str = "") -> dict[str, Any]:
    """One AlertBook record as an Alertmanager v2 alert (postableAlert): labels identify it
    (kind, severity, the alert's id, the engine), annotations describe it, startsAt is when
    this episode began, endsAt is set once it resolved."""
    kind = str(record["kind"])
    labels = {"alertname": kind, "severity": str(record["severity"]),
              "pagewarden_alert_id": str(record["id"]), "instance": instance}
    for field in ("pool", "worker"):
        if record.get(field):
            labels[field] = str(record[field])
    detail = str(record.get("detail") or "")
    annotations = {
        "summary": _clip(detail.split("\n", 1)[0], SUMMARY_CHARS) or kind,
        "description": _clip(detail, MAX_TEXT),
        "help": BY_NAME[kind].help if kind in BY_NAME else "",
        "runbook": _clip("\n".join(f"{i}. {step}" for i, step in enumerate(BY_NAME[kind].runbook, 1)), MAX_TEXT)
        if kind in BY_NAME else "",
        "count": str(record.get("count", 0)),
    }
    if record.get("requests"):
        annotations["requests"] = _clip(", ".join(map(str, record["requests"])), MAX_TEXT)
    if record.get("subject"):
        annotations["subject"] = _clip(str(record["subject"]), SUMMARY_CHARS)
    alert: dict[str, Any] = {"labels": labels, "annotations": annotations, "startsAt": rfc3339(record["first_seen"])}
    if record.get("state") == AlertState.RESOLVED:
        alert["endsAt"] = rfc3339(record.get("resolved_at") or time.time())
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert


async def _read_head(content: aiohttp.StreamReader) -> bytes:
    """At most MAX_ANSWER_BYTES of a body (fewer when it ends first)."""
    head = b""
    while len(head) < MAX_ANSWER_BYTES and (chunk := await content.read(MAX_ANSWER_BYTES - len(head))):
        head += chunk
    return head


def _body_note(response: aiohttp.ClientResponse, head: bytes) -> str:
    """': <the body's first characters>', saying how long the body was when it was cut."""
    text = _printable(head.decode("utf-8", errors="replace")).strip()
    size = response.content_length
    if size is not None and size > MAX_ANSWER_BYTES:
        cut = f" (a body of {size:,} bytes: read {MAX_ANSWER_BYTES:,}, MAX_ANSWER_BYTES)"
    elif size is None and len(head) >= MAX_ANSWER_BYTES:
        cut = f" (a body past MAX_ANSWER_BYTES = {MAX_ANSWER_BYTES:,} bytes: the rest not read)"
    else:
        cut = ""
    return f"{cut}: {text}" if text else cut


def _printable(text: str) -> str:
    """`text` clipped, control characters (a receiver's escape sequences in our log) as spaces."""
    return _clip("".join(c if c.isprintable() else " " for c in text), SHOWN_ANSWER_CHARS)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _fingerprint(alert: dict[str, Any]) -> LabelSet:
    """What Alertmanager tells alerts apart by: the label set."""
    return tuple(sorted(alert["labels"].items()))


class _Firing:
    __slots__ = ("alert", "last_sent")

    def __init__(self, alert: dict[str, Any], last_sent: float) -> None:
        self.alert, self.last_sent = alert, last_sent  # last_sent 0: never delivered, due now


class AlertForwarder:
    def __init__(self, *, instance: str, timeout_s: float = TIMEOUT_S, backoff_s: tuple[float, float] = BACKOFF_S,
                 gather_s: float = GATHER_S, max_batch: int = MAX_BATCH) -> None:
        """Off until configure() gives it a URL. instance: the engine's `instance` label."""
        self.instance = instance
        self.timeout_s, self.backoff_s, self.gather_s, self.max_batch = timeout_s, backoff_s, gather_s, max_batch
        self.url = self.endpoint = self.generator_url = ""
        self.shown_url = ""  # the endpoint as status and the log show it (redacted_url)
        self.resend_s, self.queue_max = 60.0, 1000
        self.lock = threading.Lock()  # the supervisor thread offers, the posting thread takes
        # What Alertmanager must hear, each at most queue_max (least recently changed dropped first):
        self.firing: OrderedDict[str, _Firing] = OrderedDict()  # alert id -> firing alert, (re)sent
        self.ending: OrderedDict[LabelSet, dict[str, Any]] = OrderedDict()  # label set -> alert with endsAt, sent once
        self.sent = self.failed = self.dropped = 0  # alerts delivered, POSTs failed, alerts never delivered
        self.last_error: str | None = None
        self.last_sent_at: float | None = None
        self.failing_since: float | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False

    # ---- the supervisor's side: never blocks on the network --------------------------------
    def configure(self, url: str, *, resend_s: float = 60.0, queue: int = 1000, generator_url: str = "") -> None:
        """Take a (validated) config: forwarding starts, stops (url empty) or moves to another
        receiver, which is then told every firing alert at once."""
        with self.lock:
            moved = url != self.url
            self.url, self.endpoint = url, webhook_endpoint(url) if url else ""
            self.shown_url = redacted_url(self.endpoint)
            self.resend_s, self.queue_max, self.generator_url = float(resend_s), int(queue), generator_url
            if not url:
                self.firing.clear()
                self.ending.clear()
            elif moved:
                for entry in self.firing.values():
                    entry.last_sent = 0.0
            self._trim()
        if url and self._thread is None:
            self._thread = threading.Thread(target=self._main, name="alert-forward", daemon=True)
            self._thread.start()
        self._poke()

    def offer(self, record: dict[str, Any]) -> None:
        """An alert record changed (AlertBook publishes it): note what Alertmanager must hear.
        A firing alert is due at once when it is new (a new episode, or another severity);
        a repeat of one already sent only refreshes what the next resend carries."""
        state = record.get("state")
        if not self.url or state not in (AlertState.FIRING, AlertState.RESOLVED):
            return
        alert = to_alertmanager(record, instance=self.instance, generator_url=self.generator_url)
        aid = str(record["id"])
        with self.lock:
            known = self.firing.pop(aid, None)
            if known is not None and _fingerprint(known.alert) != _fingerprint(alert) and known.last_sent:
                # severity is a label: to Alertmanager the old one is another alert, which ends now
                self._end({**known.alert, "endsAt": rfc3339(time.time())})
            if state == AlertState.RESOLVED:
                if known is not None and known.last_sent:  # (one never sent needs no end)
                    self._end(alert)
            else:
                same = known is not None and known.alert["startsAt"] == alert["startsAt"] \
                    and _fingerprint(known.alert) == _fingerprint(alert)
                self.firing[aid] = _Firing(alert, known.last_sent if known is not None and same else 0.0)
                self._trim()
        self._poke()

    def keep(self, ids: Container[str]) -> None:
        """Forget firing alerts the alert book no longer holds (evicted): they are not resent,
        and Alertmanager resolves them after its resolve_timeout."""
        with self.lock:
            for aid in [a for a in self.firing if a not in ids]:
                self.dropped += not self.firing.pop(aid).last_sent

    def describe(self) -> dict[str, Any]:
        """The counts for status and /metrics: sent (alerts delivered, resends included),
        failed (POSTs that failed), dropped (alerts never delivered: past the bound, or
        refused by the receiver), queued (waiting for their first delivery)."""
        with self.lock:
            queued = len(self.ending) + sum(1 for e in self.firing.values() if not e.last_sent)
            return {"enabled": bool(self.url), "url": self.shown_url or None, "sent": self.sent,
                    "failed": self.failed, "dropped": self.dropped, "queued": queued,
                    "queue_max": self.queue_max, "firing": len(self.firing), "resend_s": self.resend_s,
                    "last_error": self.last_error, "last_sent_at": self.last_sent_at,
                    "failing_since": self.failing_since}

    def stop(self, timeout_s: float = 2.0) -> None:
        """End the posting thread (a POST in flight is given up to timeout_s)."""
        self._stopping = True
        self._poke()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _end(self, alert: dict[str, Any]) -> None:
        self.ending[_fingerprint(alert)] = alert
        self._trim()

    def _trim(self) -> None:
        """Past queue_max, forget the least recently changed; count it when never delivered
        (a firing one already sent is only not resent: Alertmanager times it out)."""
        while len(self.ending) > self.queue_max:
            self.ending.popitem(last=False)
            self.dropped += 1
        while len(self.firing) > self.queue_max:
            self.dropped += not self.firing.popitem(last=False)[1].last_sent

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has closed: nothing to wake
                pass

    # ---- the posting thread ----------------------------------------------------------------
    def take(self, now: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The next batch: ends (oldest first), then firing alerts due (never sent first)."""
        with self.lock:
            ends: list[dict[str, Any]] = []
            while self.ending and len(ends) < self.max_batch:
                ends.append(self.ending.popitem(last=False)[1])
            due = [e for e in self.firing.values() if now - e.last_sent >= self.resend_s]
            due.sort(key=lambda e: e.last_sent)
            firing = []
            for entry in due[:self.max_batch - len(ends)]:
                entry.last_sent = now
                firing.append(entry.alert)
            return ends, firing

    def next_resend(self, now: float) -> float:
        """Seconds until the next firing alert is due (resend_s when none is firing)."""
        with self.lock:
            due = min((e.last_sent + self.resend_s for e in self.firing.values()), default=now + self.resend_s)
        return max(0.0, due - now)

    def delivered(self, ends: list[dict[str, Any]], firing: list[dict[str, Any]], now: float) -> None:
        with self.lock:
            self.sent += len(ends) + len(firing)
            self.last_sent_at = now
            if self.failing_since is not None:
                print(f"alert forwarding: {self.shown_url} takes alerts again", file=sys.stderr, flush=True)
            self.failing_since = None

    def undelivered(self, ends: list[dict[str, Any]], firing: list[dict[str, Any]], error: str, *,
                    retry: bool) -> None:
        """A failed POST: its ends wait again, in front (the bound drops them first), its
        firing alerts are due again. Without retry (the receiver refused them) they are
        dropped and counted."""
        with self.lock:
            self.failed += 1
            self.last_error = error
            if self.failing_since is None:
                self.failing_since = time.time()
                print(f"alert forwarding: {error}; retrying with backoff", file=sys.stderr, flush=True)
            if not retry:
                self.dropped += len(ends) + len(firing)
                return
            for alert in reversed(ends):
                key = _fingerprint(alert)
                if key not in self.ending:
                    self.ending[key] = alert
                    self.ending.move_to_end(key, last=False)
            for alert in firing:
                entry = self.firing.get(alert["labels"]["pagewarden_alert_id"])
                if entry is None and _fingerprint(alert) not in self.ending:
                    self.dropped += 1  # forgotten past the bound while in flight
                # (no entry but an end queued: it resolved while in flight, and the end is what is owed)
                elif entry is not None and _fingerprint(entry.alert) == _fingerprint(alert):
                    entry.last_sent = 0.0
            self._trim()

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as exc:  # noqa: BLE001 - the supervisor keeps serving; status says why
            self.last_error = f"alert forwarding stopped: {type(exc).__name__}: {exc}"
            print(self.last_error, file=sys.stderr, flush=True)

    async def _run(self) -> None:
        import aiohttp

        self._wake = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        failures = 0
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        # auto_decompress off: a gzip answer of 1 MiB would be 1 GiB once inflated
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False, read_bufsize=READ_BUFFER_BYTES,
                                         headers={"User-Agent": "pagewarden", "Accept-Encoding": "identity"}) as session:
            while not self._stopping:
                self._wake.clear()  # before take(): a change offered after it wakes the wait below
                ends, firing = self.take(time.time()) if self.url else ([], [])
                if not ends and not firing:
                    await self._wait(self.next_resend(time.time()) if self.url else None)
                    if not self._stopping:
                        await asyncio.sleep(self.gather_s)  # a burst of changes goes in one POST
                    continue
                error, retry = await self._post(session, [*ends, *firing])
                if error is None:
                    failures = 0
                    self.delivered(ends, firing, time.time())
                    continue
                failures += 1
                self.undelivered(ends, firing, error, retry=retry)
                if retry:
                    first, most = self.backoff_s
                    await self._sleep(min(most, first * 2 ** (failures - 1)))

    async def _post(self, session: aiohttp.ClientSession, alerts: list[dict[str, Any]]) -> tuple[str | None, bool]:
        """(None, _) when delivered; else (why, whether to retry). A redirect is not followed:
        it is a failed delivery (naming the Location refused), retried like a 5xx."""
        import aiohttp

        shown = self.shown_url
        try:
            async with session.post(self.endpoint, json=alerts, allow_redirects=False) as response:
                status = response.status
                head = b"" if 200 <= status < 300 else await _read_head(response.content)
                if not response.content.at_eof():
                    response.close()  # the rest is never read: the connection goes with it
                if 200 <= status < 300:
                    return None, False
                if 300 <= status < 400:
                    location = _printable(redacted_url(response.headers.get("Location", "")))
                    return (f"{shown} answered {status}, a redirect to {location or '(no Location)'}: "
                            "not followed (alerts go to the configured URL only)"), True
                return f"{shown} answered {status}{_body_note(response, head)}", status >= 500 or status in (408, 429)
        except aiohttp.ClientResponseError as exc:  # (its text holds the URL, query included)
            return f"{shown}: {type(exc).__name__}: {exc.status}, {_printable(str(exc.message))}", True
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            why = str(exc).replace(self.endpoint, shown) or "timed out"
            query = urlsplit(self.endpoint).query
            return f"{shown}: {type(exc).__name__}: {why.replace(query, '(query)') if query else why}", True

    async def _wait(self, timeout_s: float | None) -> None:
        assert self._wake is not None  # _run() set it before it waits
        try:
            await asyncio.wait_for(self._wake.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    async def _sleep(self, seconds: float) -> None:
        """Backoff: new changes only queue meanwhile; stop() ends it."""
        assert self._wake is not None  # _run() set it before any backoff
        deadline = time.monotonic() + seconds
        while not self._stopping and (left := deadline - time.monotonic()) > 0:
            self._wake.clear()
            await self._wait(left)
