"""Errors a user can act on: each names the thing, the number and the limit.

Every error carries a stable `code` so that it can cross the wire and be
matched by tests without parsing prose.
"""

from __future__ import annotations


class PageWardenError(Exception):
    """Base of every error the engine raises on purpose."""

    code = "error"

    def to_wire(self) -> dict:
        return {"code": self.code, "message": str(self)}


class ConfigError(PageWardenError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""

    code = "config_error"


class CheckpointError(PageWardenError):
    """A model directory cannot be loaded (missing file, unsupported architecture, bad tensor)."""

    code = "checkpoint_error"


class InvalidRequest(PageWardenError, ValueError):
    """A request is malformed: empty prompt, token id outside the vocabulary, bad parameter."""

    code = "invalid_request"


class SamplingFailed(PageWardenError):
    """One request's next token could not be drawn (its probabilities were not finite, or the
    sampler raised): that request fails, the rest of its batch goes on."""

    code = "sampling_failed"


class RequestFailed(PageWardenError):
    """Serving one request raised (its forward pass, run alone, still raised): that request
    fails with the reason, the rest of its batch is served and the worker goes on."""

    code = "request_failed"


class AdmissionRejected(PageWardenError):
    """I2: the request cannot fit the context window or a pool; nothing was allocated."""

    code = "admission_rejected"

    def __init__(self, message: str, *, needed_tokens: int, limit_tokens: int, limit_name: str):
        super().__init__(message)
        self.needed_tokens = needed_tokens
        self.limit_tokens = limit_tokens
        self.limit_name = limit_name


class PoolExhausted(PageWardenError):
    """A pool has fewer free pages than asked for; nothing was allocated."""

    code = "pool_exhausted"


class IsolationError(PageWardenError):
    """A page operation would break ownership (wrong owner, double free); nothing changed."""

    code = "isolation_error"


class OwnershipViolation(PageWardenError):
    """I1: attention met pages this request does not own in this epoch; they were masked."""

    code = "ownership_violation"

    def __init__(self, message: str, *, pages: list[dict]):
        super().__init__(message)
        self.pages = pages


class TransferMismatch(PageWardenError):
    """I3: a KV transfer did not match its reservation; the request's pages were scrubbed."""

    code = "transfer_mismatch"


class TransferTimeout(PageWardenError):
    """A KV transfer did not complete in time; the request's pages were scrubbed."""

    code = "transfer_timeout"


class WorkerStopped(PageWardenError):
    """The worker serving a request was stopped by an operator or a reconfigure."""

    code = "worker_stopped"


class WorkerCrashed(PageWardenError):
    """The worker serving a request died (killed, crashed, stopped answering)."""

    code = "worker_crashed"


class BudgetExceeded(PageWardenError):
    """One client already has as many requests (or tokens) queued or running as it may."""

    code = "budget_exceeded"


class Forbidden(PageWardenError):
    """The client's role does not allow this op, or the request is another client's."""

    code = "forbidden"


class NoWorker(PageWardenError):
    """No worker of a role the request needs is ready, and none came back in time (or none can)."""

    code = "no_worker"


class WorkerStartFailed(PageWardenError):
    """A worker ended before it was ever ready (serve says so instead of printing ready)."""

    code = "worker_start_failed"


class Cancelled(PageWardenError):
    """The client cancelled the request."""

    code = "cancelled"


def error_from_wire(wire: dict | None) -> PageWardenError | None:
    """Rebuild an error that crossed the wire, keeping its code and message."""
    if not wire:
        return None
    error = PageWardenError(str(wire.get("message", "")))
    error.code = str(wire.get("code", "error"))
    return error
