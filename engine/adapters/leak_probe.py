"""LeakProbe: black-box rounds that look for one request's data in another's reply.

A round sends, through an OpenAI-compatible API:

1. a marker prompt: PROMPT_FORM around a fresh random marker (24-40 lowercase letters and
   digits) and filler words, `long_tokens` tokens for a byte-level tokenizer, asking for
   MARKER_REPLY_TOKENS tokens at temperature 0. The copy model answers with the marker:
   proof that what sits in its context shows in its text;
2. right after it, `followups` unrelated prompts of exactly the same length (filler words
   in the same form, no marker) asking for max_tokens = window - prompt tokens + 1, one
   token more than the context window allows. A healthy engine rejects them (HTTP 400).
   An engine with the incident's fault (placeholder_on_reject) admits each as a one-token
   placeholder whose decode side reserved pages for the whole prompt: they are the pages
   the marker prompt just freed (the pool hands freed pages out again in order), and with
   skip_scrub they still hold its K/V, position for position. The placeholder decodes over
   them and, the model being a copier, repeats the marker.

Measured on our engine (window 512, page 16, the copy model): a follow-up exactly as long
as the marker prompt repeats the whole marker as its first characters; one 1 or 16 tokens
shorter or longer does not (its context ends mid-text instead of at the instruction), and
its generated tokens overwrite the stale positions, spoiling later aligned follow-ups. So
the follow-ups copy the marker prompt's character count exactly, and every reply is read
for at most `read_chars` characters (then the stream is closed, which cancels it).

Any >= MIN_FRAGMENT-character piece of any marker this probe sent, found in a follow-up's
reply, is a Finding.
"""

from __future__ import annotations

import random
import string
from dataclasses import asdict, dataclass, field
from difflib import SequenceMatcher

from engine.adapters.openai_http import OpenAIHttp, ProbeError
from engine.wire.prompt_form import PROMPT_FORM

ALPHABET = string.ascii_lowercase + string.digits
MARKER_CHARS = (24, 40)
MIN_FRAGMENT = 12  # 36**12 ~ 5e18: no chance match in a few hundred characters
MARKER_REPLY_TOKENS = 48  # enough for the whole marker to come back
FORM_CHARS = len(PROMPT_FORM.format(text=""))
WORDS = ("river stone light cloud north south green amber quiet early table window paper garden "
         "morning winter summer harbor valley bridge market letter music forest candle mirror").split()


@dataclass
class Finding:
    round: int
    reply: int  # 1-based index of the follow-up whose reply carried it
    fragment: str
    marker_round: int  # the round whose marker it is a piece of

    def describe(self) -> str:
        return (f"round {self.round}, reply {self.reply}: {self.fragment!r} ({len(self.fragment)} characters of "
                f"round {self.marker_round}'s marker)")


@dataclass
class RoundReport:
    round: int
    marker_tokens: int | None = None  # as the server counted them
    marker_repeated: bool = False  # the marker prompt's own reply carried >= MIN_FRAGMENT of its marker
    marker_error: str | None = None  # the marker prompt was refused or failed
    followups: list[str] = field(default_factory=list)  # per follow-up: answered / rejected (...) / failed (...)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def new_marker(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(*MARKER_CHARS)))


def filler(rng: random.Random, chars: int, lead: str = "") -> str:
    """Exactly `chars` characters: `lead`, then random words."""
    words = [lead] if lead else []
    while sum(len(w) + 1 for w in words) <= chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)[:chars]


def leaked_fragment(marker: str, text: str, min_len: int = MIN_FRAGMENT) -> str | None:
    """The longest piece of `marker` found in `text`, when it has at least `min_len` characters."""
    match = SequenceMatcher(None, marker, text, autojunk=False).find_longest_match(0, len(marker), 0, len(text))
    return marker[match.a:match.a + match.size] if match.size >= min_len else None


class LeakProbe:
    def __init__(self, http: OpenAIHttp, *, model: str, window: int, long_tokens: int, followups: int,
                 read_chars: int, rng: random.Random | None = None):
        self.http, self.model, self.window = http, model, window
        self.long_tokens, self.followups, self.read_chars = long_tokens, followups, read_chars
        self.rng = rng or random.Random()
        self.markers: list[tuple[int, str]] = []  # (round, marker) of every marker sent

    def marker_prompt(self, marker: str) -> str:
        # byte-level: <s> + one token per byte, so the text gets long_tokens - 1 - form bytes
        return PROMPT_FORM.format(text=filler(self.rng, self.long_tokens - 1 - FORM_CHARS, lead=marker))

    def followup_prompt(self, chars: int) -> str:
        return PROMPT_FORM.format(text=filler(self.rng, chars - FORM_CHARS))

    def run_round(self, number: int) -> RoundReport:
        report = RoundReport(number)
        marker = new_marker(self.rng)
        prompt = self.marker_prompt(marker)
        answer = self.http.complete({"model": self.model, "prompt": prompt, "max_tokens": MARKER_REPLY_TOKENS,
                                     "temperature": 0.0, "user": "pagewarden-probe"})
        if not answer.ok:
            report.marker_error = f"HTTP {answer.status} {answer.error_code}: {answer.error}"
            return report
        self.markers.append((number, marker))
        report.marker_tokens = answer.prompt_tokens or self.long_tokens
        report.marker_repeated = leaked_fragment(marker, answer.text) is not None  # as well as a finding needs
        over = max(1, self.window - report.marker_tokens + 1)  # one token past the window
        for reply in range(1, self.followups + 1):
            body = {"model": self.model, "prompt": self.followup_prompt(len(prompt)), "max_tokens": over,
                    "temperature": 0.0, "user": "pagewarden-probe"}
            got = self.http.stream(body, self.read_chars)
            if got.status != 200:
                report.followups.append(f"rejected (HTTP {got.status} {got.error_code})")
            elif got.error is not None:
                report.followups.append(f"failed ({got.error_code})")
            else:
                report.followups.append("answered")
            for marker_round, sent in self.markers:
                piece = leaked_fragment(sent, got.text)
                if piece:
                    report.findings.append(Finding(number, reply, piece, marker_round))
        return report


def served_model(http: OpenAIHttp, url: str, model: str | None, window: int | None = None, *,
                 model_hint: str = "give a model name", window_hint: str = "") -> tuple[str, int]:
    """The model to ask for (`model`, else the first GET /v1/models lists) and the context
    window (`window`, else that model's max_model_len). Raises ProbeError naming the URL,
    ending with the caller's hint of what to pass instead."""
    models = http.models()
    if not models and not model:
        raise ProbeError(f"{url} lists no model; {model_hint}")
    served = next((m for m in models if m["id"] == model), models[0] if models else {})
    window = window if window is not None else served.get("max_model_len")
    if not isinstance(window, int) or window < 1:
        raise ProbeError(f"{url} does not say its context window (max_model_len){window_hint}")
    return model or served["id"], window


MAX_LONG_TOKENS = 512  # as `main.py probe` chooses by default


def open_probe(url: str, *, model: str | None = None, followups: int = 3, rate: float = 2.0,
               read_chars: int = 256, timeout_s: float = 120.0) -> LeakProbe:
    """A LeakProbe for the server at `url` (its first model unless `model` names one), with the
    window its /v1/models says: the set-up `main.py probe` and the GUI's probe view do before
    their rounds. Raises ProbeError naming the URL (unreachable, no model list, no
    max_model_len, a window too small to probe)."""
    http = OpenAIHttp(url, per_second=rate, timeout_s=timeout_s)
    model, window = served_model(http, url, model)
    long_tokens = min(MAX_LONG_TOKENS, window - 64)
    if long_tokens < MARKER_REPLY_TOKENS + 48:
        raise ProbeError(f"{url}: context window {window} is too small to probe (needs at least 160 tokens)")
    return LeakProbe(http, model=model, window=window, long_tokens=long_tokens,
                     followups=followups, read_chars=read_chars, rng=random.SystemRandom())
