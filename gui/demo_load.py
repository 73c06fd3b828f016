"""DemoLoad: a steady stream of varied requests, so a newcomer sees the map move.

Qt-free: it only decides what to send next and how many may be in flight; the window
sends them through the transport like any other command.
"""

from __future__ import annotations

import random

from engine.wire.prompt_form import PROMPT_FORM

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
WORDS = ("page", "owner", "epoch", "writer", "tenant", "canary", "scrub", "prefill", "decode", "quarantine",
         "manifest", "transfer", "window", "capacity", "token", "batch", "kernel", "isolation")


class DemoLoad:
    def __init__(self, *, max_inflight: int = 8, context_window: int = 2048, seed: int | None = None):
        self.rng = random.Random(seed)
        self.max_inflight = max_inflight
        self.context_window = context_window
        self.inflight: set[int] = set()
        self.sent = 0
        self.finished = 0

    def want_more(self) -> bool:
        return len(self.inflight) < self.max_inflight

    def next_request(self) -> dict:
        """Submit fields: a text prompt of varied length, a varied answer length, a tenant."""
        rng = self.rng
        words = rng.choices(WORDS, k=rng.choice((4, 12, 40, 120, 300)))
        ticket = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(12))
        text = f"{rng.choice(TENANTS)} ticket {ticket}: " + " ".join(words)
        # the default model's form: it answers with the text, so each reply shows its own data
        prompt = PROMPT_FORM.format(text=text[: self.context_window // 2])
        budget = max(8, self.context_window - len(prompt.encode()) - 2)
        self.sent += 1
        return {"prompt": prompt, "max_new_tokens": min(budget, rng.choice((16, 48, 96, 200, 400))),
                "ignore_eos": True, "tenant": rng.choice(TENANTS), "stream": False}

    def started(self, stream: int) -> None:
        self.inflight.add(stream)

    def ended(self, stream: int) -> None:
        if stream in self.inflight:
            self.inflight.discard(stream)
            self.finished += 1
