"""Client -> engine: the ops of the control socket, each with its least role.

The supervisor answers each with the method of its name in SubmitOps, QueryOps or WorkerOps
(found by engine/server/control_ops.py) after checking the caller's role (engine/wire/roles.py,
derived from `least_role` here); the vLLM agent answers those whose `answered_by` names it. Senders leave out what they do not set
(`omit_defaults`): a field left out takes the default declared here.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import msgspec

from engine.wire.messages.base import ControlCall, Finite, NonNegative

MAX_PROMPT_TOKENS = 1 << 21  # the longest prompt a submit may carry, in tokens
HISTORY_PAGE_SUBJECTS = 2_000  # requests (and engine subjects) in one `history` answer, at most


class Viewer(ControlCall, kw_only=True, omit_defaults=True):
    least_role: ClassVar[str] = "viewer"


class Operator(ControlCall, kw_only=True, omit_defaults=True):
    least_role: ClassVar[str] = "operator"


class Admin(ControlCall, kw_only=True, omit_defaults=True):
    least_role: ClassVar[str] = "admin"


# ---- viewer: watching ---------------------------------------------------------------------

class Status(Viewer, kw_only=True, tag="status"):
    description: ClassVar[str] = "the engine, its workers, load, metrics and alerts"
    answered_by: ClassVar[tuple[str, ...]] = ("supervisor", "agent")

    brief: bool = False  # leave out config and alerts (a window polling twice a second)


class Ping(Viewer, kw_only=True, tag="ping"):
    description: ClassVar[str] = "an answer, to know the engine is there"
    answered_by: ClassVar[tuple[str, ...]] = ("supervisor", "agent")


class Keyframe(Viewer, kw_only=True, tag="keyframe"):
    description: ClassVar[str] = "every pool sends a pages keyframe now"
    answered_by: ClassVar[tuple[str, ...]] = ("supervisor", "agent")


class PageMetadata(Viewer, kw_only=True, tag="page_metadata"):
    description: ClassVar[str] = "one pool's five page arrays as its worker holds them now"
    answered_by: ClassVar[tuple[str, ...]] = ("supervisor", "agent")

    pool: str | None = None  # the supervisor needs it; the vLLM agent has one pool and answers with it


class Scope(Viewer, kw_only=True, tag="scope"):
    description: ClassVar[str] = "the (source, reader) pairs whose data crossed in a time window"

    since: Finite | None = None  # wall-clock seconds; None: everything kept
    until: Finite | None = None
    run: Annotated[str, msgspec.Meta(max_length=64)] | None = None  # an earlier run (or "all"): from the journal


class PromptLog(Viewer, kw_only=True, tag="prompt_log"):
    description: ClassVar[str] = "the prompt log since a time (hashes and lengths, never text)"

    since: Finite = 0.0


class GroundTruth(Viewer, kw_only=True, tag="ground_truth"):
    description: ClassVar[str] = "every decode worker's own list of the cross-request reads it saw"


class History(Viewer, kw_only=True, tag="history"):
    description: ClassVar[str] = "one page of a time window's requests, events and telemetry, for a snapshot"

    since: Finite = 0.0
    after: NonNegative = 0  # the `next` of the page before
    limit: Annotated[int, msgspec.Meta(ge=1, le=HISTORY_PAGE_SUBJECTS)] = HISTORY_PAGE_SUBJECTS


# ---- operator: its own requests -------------------------------------------------------------

class Submit(Operator, kw_only=True, tag="submit"):
    description: ClassVar[str] = "start a generation: accepted, token..., then done or error"

    request_id: Annotated[str, msgspec.Meta(max_length=128)] | None = None  # None: the engine names it r<slot>
    tenant: Annotated[str, msgspec.Meta(max_length=64)] = "default"
    # the prefix cache's salt, as vLLM's API takes it: only requests with the same salt share
    # cached pages; None: the tenant is the salt (under [prefix_cache] scope = "tenant")
    cache_salt: Annotated[str, msgspec.Meta(max_length=256)] | None = None
    data_tier: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    # the client behind this connection (the HTTP front names its peer): a turn of its own in
    # the queue, within this connection's turn
    client: Annotated[str, msgspec.Meta(max_length=128)] = ""
    prompt_ids: Annotated[list[int], msgspec.Meta(max_length=MAX_PROMPT_TOKENS)] | None = None
    prompt: Annotated[str, msgspec.Meta(max_length=8 * MAX_PROMPT_TOKENS)] | None = None  # or text
    max_new_tokens: int = 16
    temperature: Finite = 0.0
    top_k: int = 0
    top_p: Finite = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: Annotated[list[int], msgspec.Meta(max_length=64)] = []
    stream: bool = True  # a token event per step; False: only done

    def params(self) -> dict[str, Any]:
        """The sampling parameters, as the request book keeps them (engine/request.py)."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature, "top_k": self.top_k,
                "top_p": self.top_p, "seed": self.seed, "ignore_eos": self.ignore_eos,
                "stop_token_ids": tuple(self.stop_token_ids), "stream": self.stream}


class Cancel(Operator, kw_only=True, tag="cancel"):
    description: ClassVar[str] = "stop a request (its owner's, or any for an admin)"

    request_id: str


class Audit(Operator, kw_only=True, tag="audit"):
    description: ClassVar[str] = "a request's lifecycle events (its owner's, or any for an admin)"

    request_id: str


class Canary(Operator, kw_only=True, tag="canary"):
    description: ClassVar[str] = "send one canary request now"


class AckAlert(Operator, kw_only=True, tag="ack_alert"):
    description: ClassVar[str] = "acknowledge alerts by id"

    ids: Annotated[list[Any], msgspec.Meta(max_length=1000)]  # each read as str


# ---- admin: the workers and the config ----------------------------------------------------

class Start(Admin, kw_only=True, tag="start"):
    description: ClassVar[str] = "start a stopped or crashed worker"

    worker: str


class Stop(Admin, kw_only=True, tag="stop"):
    description: ClassVar[str] = "stop a worker; its requests fail"

    worker: str


class Restart(Admin, kw_only=True, tag="restart"):
    description: ClassVar[str] = "stop a worker and start it again"

    worker: str


class Reconfigure(Admin, kw_only=True, tag="reconfigure", omit_defaults=False):
    description: ClassVar[str] = "check config changes and their capacity consequence; apply only when asked"

    changes: dict[str, Any]
    apply: bool = False


class Pause(Admin, kw_only=True, tag="pause"):
    description: ClassVar[str] = ("vLLM agent, benches and tests only (PAGEWARDEN_ALLOW_FAULTS=1): stop or resume "
                                  "its snapshots")
    answered_by: ClassVar[tuple[str, ...]] = ("agent",)

    paused: bool


ALL: tuple[type[ControlCall], ...] = (Status, Ping, Keyframe, PageMetadata, Scope, PromptLog, GroundTruth, History,
                                      Submit, Cancel, Audit, Canary, AckAlert, Start, Stop, Restart, Reconfigure,
                                      Pause)
