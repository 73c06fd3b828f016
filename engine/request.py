"""Request, its sampling parameters and its lifecycle states."""

from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field

from engine.errors import InvalidRequest, PageWardenError
from engine.kv.page_table import PageTable


class RequestState(enum.Enum):
    WAITING = "waiting"  # admitted, waiting for pages or a batch slot
    RUNNING = "running"
    FINISHED = "finished"
    REJECTED = "rejected"  # refused at admission; never allocated anything
    FAILED = "failed"  # aborted after admission (isolation error, worker stopped, ...)


# Temperatures below this sample greedily. logits / 1e-40 overflows float32 to inf, softmax
# gives NaN and torch.multinomial raises (one such request once killed a prefill worker);
# below 1e-5 the distribution is the argmax anyway unless two logits tie that closely.
# vLLM draws the same line (its _SAMPLING_EPS; read in its source, not run here).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # below GREEDY_BELOW (0 included): greedy
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    def validate(self, request_id: str) -> None:
        """Raises InvalidRequest naming the parameter, its value and the allowed range."""
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise InvalidRequest(f"request {request_id}: max_new_tokens must be an integer, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise InvalidRequest(f"request {request_id}: max_new_tokens = {self.max_new_tokens} must be at least 1")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidRequest(f"request {request_id}: temperature = {self.temperature} must be a finite number >= 0")
        if self.top_k < 0:
            raise InvalidRequest(f"request {request_id}: top_k = {self.top_k} must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"request {request_id}: top_p = {self.top_p} must be in (0, 1]")


@dataclass
class Request:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    tenant: str = "default"
    slot: int = -1
    # the root of its prefix keys (engine/kv/prefix_keys.salt_of): None when its pages are
    # never shared (the prefix cache is off)
    salt: str | None = None
    cached_tokens: int = 0  # leading prompt tokens whose K/V came from the prefix cache
    state: RequestState = RequestState.WAITING
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "length", "eos", "stop", or an error code
    error: PageWardenError | None = None
    page_table: PageTable | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    first_token_time: float | None = None
    finish_time: float | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def total_tokens(self) -> int:
        """Tokens the request may occupy: what admission checks against every limit."""
        return len(self.prompt_ids) + self.params.max_new_tokens

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def done(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.REJECTED, RequestState.FAILED)


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request (a streaming delta)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: PageWardenError | None = None
