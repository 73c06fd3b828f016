"""The GUI's way into the black-box leak probe (engine.guard.leak_probe over the stdlib HTTP
client engine.adapters.openai_http; no torch): a re-export, plus `open_probe`, the set-up
`main.py probe` does before its rounds (model and window through leak_probe.served_model,
then the marker length).

It lives here so that gui/ keeps importing nothing from engine/ but protocol and client.
"""

from __future__ import annotations

import random

from engine.adapters.openai_http import OpenAIHttp, ProbeError
from engine.guard.leak_probe import MARKER_REPLY_TOKENS, Finding, LeakProbe, RoundReport, served_model
from engine.http.options import is_loopback

__all__ = ["Finding", "LeakProbe", "OpenAIHttp", "ProbeError", "RoundReport", "is_loopback", "open_probe"]

MAX_LONG_TOKENS = 512  # as `main.py probe` chooses by default


def open_probe(url: str, *, model: str | None = None, followups: int = 3, rate: float = 2.0,
               read_chars: int = 256, timeout_s: float = 120.0) -> LeakProbe:
    """A LeakProbe for the server at `url` (its first model unless `model` names one), with the
    window its /v1/models says. Raises ProbeError naming the URL (unreachable, no model list,
    no max_model_len, a window too small to probe)."""
    http = OpenAIHttp(url, per_second=rate, timeout_s=timeout_s)
    model, window = served_model(http, url, model)
    long_tokens = min(MAX_LONG_TOKENS, window - 64)
    if long_tokens < MARKER_REPLY_TOKENS + 48:
        raise ProbeError(f"{url}: context window {window} is too small to probe (needs at least 160 tokens)")
    return LeakProbe(http, model=model, window=window, long_tokens=long_tokens,
                     followups=followups, read_chars=read_chars, rng=random.SystemRandom())
