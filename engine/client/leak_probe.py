"""The GUI's way into the black-box leak probe (engine.guard.leak_probe over the stdlib HTTP
client engine.adapters.openai_http; no torch): a re-export, plus `open_probe`, the set-up
`main.py probe` does before its rounds (model list, window, marker length).

It lives here so that gui/ keeps importing nothing from engine/ but protocol and client.
"""

from __future__ import annotations

import random

from engine.adapters.openai_http import OpenAIHttp, ProbeError
from engine.guard.leak_probe import MARKER_REPLY_TOKENS, Finding, LeakProbe, RoundReport
from engine.http.options import is_loopback

__all__ = ["Finding", "LeakProbe", "OpenAIHttp", "ProbeError", "RoundReport", "is_loopback", "open_probe"]

MAX_LONG_TOKENS = 512  # as `main.py probe` chooses by default


def open_probe(url: str, *, model: str | None = None, followups: int = 3, rate: float = 2.0,
               read_chars: int = 256, timeout_s: float = 120.0) -> LeakProbe:
    """A LeakProbe for the server at `url` (its first model unless `model` names one), with the
    window its /v1/models says. Raises ProbeError naming the URL (unreachable, no model list,
    no max_model_len, a window too small to probe)."""
    http = OpenAIHttp(url, per_second=rate, timeout_s=timeout_s)
    models = http.models()
    if not models and not model:
        raise ProbeError(f"{url} lists no model; give a model name")
    served = next((m for m in models if m["id"] == model), models[0] if models else {})
    window = served.get("max_model_len")
    if not isinstance(window, int) or window < 1:
        raise ProbeError(f"{url} does not say its context window (max_model_len)")
    long_tokens = min(MAX_LONG_TOKENS, window - 64)
    if long_tokens < MARKER_REPLY_TOKENS + 48:
        raise ProbeError(f"{url}: context window {window} is too small to probe (needs at least 160 tokens)")
    return LeakProbe(http, model=model or served["id"], window=window, long_tokens=long_tokens,
                     followups=followups, read_chars=read_chars, rng=random.SystemRandom())
