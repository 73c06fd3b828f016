"""OpenAIHttp: the few calls a black-box probe makes to an OpenAI-compatible server
(/v1/models, /v1/completions plain and streamed), with the stdlib only, at a bounded rate.

Every answer comes back as a value (`Completion`), HTTP errors included: to a probe a
rejection is a result, not a failure. Only a server that cannot be reached, or that does
not speak the API, raises ProbeError.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

MAX_LINE_BYTES = 64 * 1024  # one server-sent event line
MAX_STREAM_BYTES = 1024 * 1024  # a whole timed stream (it asks for one token); stream_limit for the rest
MAX_TOKEN_COUNT = 10_000_000  # a usage count above this is not a count


class ProbeError(Exception):
    """The server cannot be probed: unreachable, or not an OpenAI-compatible API."""


@dataclass
class Completion:
    status: int  # HTTP status (200 also for a stream that ended in an error chunk)
    text: str = ""
    prompt_tokens: int | None = None
    error_code: str | None = None
    error: str | None = None
    finish_reason: str | None = None  # None: no choice ended (or the reader hung up first)
    completion_tokens: int | None = None  # usage.completion_tokens, else the text chunks counted
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (timed streams only)
    ttft_s: float | None = None  # request sent -> first choice chunk (timed streams only)

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


class Pacer:
    """At most `per_second` requests a second: wait() sleeps until the next one may go."""

    def __init__(self, per_second: float):
        self.interval = 1.0 / per_second
        self._next = 0.0

    def wait(self) -> None:
        now = time.monotonic()
        if now < self._next:
            time.sleep(self._next - now)
        self._next = max(now, self._next) + self.interval


class OpenAIHttp:
    def __init__(self, base_url: str, *, api_key: str | None = None, per_second: float = 2.0,
                 timeout_s: float = 120.0):
        self.base = base_url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.pacer, self.timeout_s = Pacer(per_second), timeout_s
        self.sent = 0
        self.sent_at = 0.0

    def _open(self, path: str, body: dict | None = None):
        self.pacer.wait()
        self.sent += 1
        self.sent_at = time.perf_counter()  # after the pacer's wait: what a timed request measures from
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, headers=self.headers,
                                         method="GET" if body is None else "POST")
        try:
            return urllib.request.urlopen(request, timeout=self.timeout_s)
        except urllib.error.HTTPError:
            raise  # an answer (a URLError too): the caller reads its status and body
        except (urllib.error.URLError, OSError) as exc:
            raise ProbeError(f"cannot reach {self.base}{path}: {getattr(exc, 'reason', exc)}") from None

    def models(self) -> list[dict]:
        """The served models (each at least an `id`). Raises ProbeError."""
        try:
            with self._open("/models") as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise ProbeError(f"GET {self.base}/models answered HTTP {exc.code}: {_error_of(exc)[1]}") from None
        except json.JSONDecodeError:
            raise ProbeError(f"GET {self.base}/models did not answer JSON") from None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or not all(isinstance(m, dict) and "id" in m for m in data):
            raise ProbeError(f"GET {self.base}/models did not answer an OpenAI model list")
        return data

    def complete(self, body: dict) -> Completion:
        """POST /v1/completions and wait for the whole answer."""
        try:
            with self._open("/completions", {**body, "stream": False}) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return Completion(exc.code, "", None, *_error_of(exc))
        choice = (answer.get("choices") or [{}])[0]
        usage = answer.get("usage") or {}
        return Completion(200, str(choice.get("text") or ""), usage.get("prompt_tokens"),
                          finish_reason=choice.get("finish_reason"), completion_tokens=usage.get("completion_tokens"))

    def stream(self, body: dict, read_chars: int) -> Completion:
        """POST a streamed completion and read until it ends or `read_chars` characters came;
        then hang up (a server that notices stops generating for nobody). The finish reason
        and the usage counts (sent when the body asks stream_options.include_usage) are kept
        when the stream gets that far; without usage the text chunks are counted as tokens.
        Bounded as timed_stream is, the whole stream at stream_limit(read_chars) bytes."""
        try:
            response = self._open("/completions", {**body, "stream": True})
        except urllib.error.HTTPError as exc:
            return Completion(exc.code, "", None, *_error_of(exc))
        text, done, chunks, length = [], Completion(200), 0, 0
        with response:
            for chunk in self._chunks(response, stream_limit(read_chars), f"for {read_chars:,} characters"):
                if _take_error(chunk, done):
                    break
                self._take_usage(chunk, done)
                for choice in _choices(chunk, self.base):
                    piece = str(choice.get("text") or "")
                    text.append(piece)
                    length += len(piece)
                    chunks += bool(piece)
                    done.finish_reason = choice.get("finish_reason") or done.finish_reason
                if length >= read_chars:
                    break
        done.text = "".join(text)
        if done.completion_tokens is None and done.finish_reason is not None:
            done.completion_tokens = chunks
        return done

    def timed_stream(self, body: dict) -> Completion:
        """POST a streamed completion, read it to its end and time it: `ttft_s` from just before
        the request goes (after the pacer's wait) to the first chunk that carries a choice;
        `prompt_tokens` and `cached_tokens` from its usage (the body should ask
        stream_options.include_usage). The answer is bounded before it is parsed: MAX_LINE_BYTES
        a line, MAX_STREAM_BYTES in all. Raises ProbeError naming the value and the limit for
        an answer over a limit or one that is not the API's shape; an HTTP error status comes
        back as a Completion."""
        try:
            response = self._open("/completions", {**body, "stream": True})
        except urllib.error.HTTPError as exc:
            return Completion(exc.code, "", None, *_error_of(exc))
        started, done, text = self.sent_at, Completion(200), []
        with response:
            for chunk in self._chunks(response, MAX_STREAM_BYTES, "for a one-token answer"):
                if _take_error(chunk, done):
                    break
                choices = _choices(chunk, self.base)
                if choices and done.ttft_s is None:
                    done.ttft_s = time.perf_counter() - started
                for choice in choices:
                    text.append(str(choice.get("text") or ""))
                    done.finish_reason = choice.get("finish_reason") or done.finish_reason
                self._take_usage(chunk, done)
        done.text = "".join(text)[:MAX_LINE_BYTES]
        return done

    def _chunks(self, response, max_bytes: int, what: str) -> Iterator[dict]:
        """The JSON objects of a server-sent event stream, up to `data: [DONE]` or its end. Each
        line meets MAX_LINE_BYTES and the stream `max_bytes` before it is parsed (a server's
        answer is untrusted: one endless line, or chunks without end, is refused, not held)."""
        read = 0
        while True:
            raw = response.readline(MAX_LINE_BYTES + 1)
            if not raw:
                return
            read += len(raw)
            if len(raw) > MAX_LINE_BYTES:
                raise ProbeError(f"{self.base}/completions: a stream line of over {MAX_LINE_BYTES:,} bytes "
                                 f"(the limit)")
            if read > max_bytes:
                raise ProbeError(f"{self.base}/completions: a stream of over {max_bytes:,} bytes "
                                 f"(the limit) {what}")
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                chunk = json.loads(data)
            except json.JSONDecodeError:
                raise ProbeError(f"{self.base}/completions: a stream chunk that is not JSON: "
                                 f"{data[:80]!r}") from None
            if not isinstance(chunk, dict):
                raise ProbeError(f"{self.base}/completions: a stream chunk that is not an object: {data[:80]!r}")
            yield chunk

    def _take_usage(self, chunk: dict, done: Completion) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            done.prompt_tokens = _count(usage, "prompt_tokens", self.base) or done.prompt_tokens
            done.completion_tokens = _count(usage, "completion_tokens", self.base)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict):
                done.cached_tokens = _count(details, "cached_tokens", self.base)


def stream_limit(read_chars: int) -> int:
    """The bytes a stream read for `read_chars` characters may take: a chunk per token, each a
    few hundred bytes of JSON around a few characters, on top of the one-token allowance."""
    return MAX_STREAM_BYTES + 512 * read_chars


def _take_error(chunk: dict, done: Completion) -> bool:
    """Whether the chunk is an error event (kept in `done`)."""
    if "error" not in chunk:
        return False
    error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
    done.error_code, done.error = str(error.get("code")), str(error.get("message"))
    return True


def _choices(chunk: dict, where: str) -> list[dict]:
    choices = chunk.get("choices") or []
    if not isinstance(choices, list):
        raise ProbeError(f"{where}/completions: 'choices' is {type(choices).__name__}, not a list")
    return [c for c in choices if isinstance(c, dict)]


def _count(usage: dict, key: str, where: str) -> int | None:
    """usage[key] as a token count (None when absent). Raises ProbeError naming the value
    and the limit."""
    value = usage.get(key)
    if value is None:
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKEN_COUNT:
        raise ProbeError(f"{where}/completions: usage {key} {str(value)[:40]!r} is not a count "
                         f"(0..{MAX_TOKEN_COUNT:,})")
    return value


def _error_of(exc: urllib.error.HTTPError) -> tuple[str | None, str]:
    """(code, message) of an OpenAI error body, or the HTTP reason."""
    try:
        error = json.loads(exc.read(MAX_LINE_BYTES)).get("error") or {}  # bounded: untrusted
        return (str(error.get("code")) if error.get("code") is not None else None,
                str(error.get("message") or exc.reason))
    except (ValueError, AttributeError, OSError):
        return None, str(exc.reason)
