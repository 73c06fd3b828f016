"""LeakProbe: black-box rounds that look for one request's data in another's reply.

A round sends, through an OpenAI-compatible API:

1. a marker prompt: PROMPT_FORM around a fresh random marker (24-40 lowercase letters and
   digits) and filler words, `long_tokens` tokens for a byte-level tokenizer, asking for
   MARKER_REPLY_TOKENS tokens at temperature 0. The copy model answers with the marker:
   proof that what sits in its context shows in its text;
2. right after it, `followups` unrelated prompts (filler words in the same form, no marker),
   each shaped by one follow-up strategy (STRATEGIES; P = the marker prompt's tokens as the
   server counted them, W = the context window, B = `block_size`):

   - over_window: exactly the marker prompt's length, max_tokens = W - P + 1, one token more
     than the window allows. PageWarden's engine refuses it (HTTP 400). An engine with the
     incident's fault (placeholder_on_reject) admits it as a one-token placeholder whose
     decode side reserved pages for the whole prompt: they are the pages the marker prompt
     just freed (the pool hands freed pages out again in order), and with skip_scrub they
     still hold its K/V, position for position. The placeholder decodes over them and, the
     model being a copier, repeats the marker. vLLM 0.32 (measured, CPU build) clamps
     max_tokens to W - P and answers HTTP 200: nothing is rejected there, so this alone never
     reaches the incident's trigger (a rejected request admitted as a placeholder) on vLLM;
   - exact_window: exactly the marker prompt's length, max_tokens = W - P: the window filled
     to its last slot. Every healthy engine answers it (200, finish 'length' at W - P);
   - prompt_over_window: a prompt alone of W + 1 .. W + B tokens, max_tokens =
     MARKER_REPLY_TOKENS. A healthy engine refuses it (400; vLLM 0.32 and ours do) or
     truncates it; it never carries a marker;
   - block_aligned: P rounded down, then (the next time) up, to a multiple of B (kept within
     B .. the last block boundary of the window - B), max_tokens so that prompt + max_tokens
     ends at the window's last block boundary (W rounded down to B). It fits the window: a
     healthy engine answers it (200). B is the engine's block (page) size: 16 for ours,
     32 for vLLM's CPU build.

   `strategy` "auto" (the default) mixes them: the first follow-up of every round is
   over_window (the one that trips the incident's fault on our engine, which needs it right
   after the marker prompt), the others take exact_window, prompt_over_window, block_aligned
   in turn, carried on from round to round. A comma-separated list mixes its names the same
   way (the first leads every round); one name alone is used for every follow-up.

Measured on our engine (window 512, page 16, the copy model): a follow-up exactly as long
as the marker prompt repeats the whole marker as its first characters; one 1 or 16 tokens
shorter or longer does not (its context ends mid-text instead of at the instruction), and
its generated tokens overwrite the stale positions, spoiling later aligned follow-ups. So
the over_window and exact_window follow-ups copy the marker prompt's character count
exactly. Other lengths are planned in tokens and written as characters at the marker
prompt's characters per token (exact for a byte-level tokenizer with one leading <s>, as
ours; an estimate for other tokenizers). Every reply is read for at most `read_chars`
characters (then the stream is closed, which cancels it).

Each follow-up's outcome is recorded with its strategy and shape (FollowupResult):
answered (HTTP 200), clamped (HTTP 200 with finish_reason 'length' after fewer tokens than
asked: the server shortened max_tokens), refused (any other HTTP status, 400 mostly) or
failed (HTTP 200, then an error chunk). Clamping only shows when the reply ends within
`read_chars` characters. `outcome_counts` adds them up per strategy.

Any >= MIN_FRAGMENT-character piece of any marker this probe sent, found in a follow-up's
reply, is a Finding, whatever the strategy.
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
STRATEGIES = ("over_window", "exact_window", "prompt_over_window", "block_aligned")  # "auto" mixes them all
AUTO = "auto"
OUTCOMES = ("answered", "clamped", "refused", "failed")
BLOCK_SIZE = 16  # default: our engine's page size (vLLM's CPU build: 32)
BLOCK_SIZES = (1, 4096)
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
class FollowupResult:
    """One follow-up: what it asked (its strategy and shape) and what came back."""

    reply: int  # 1-based within its round
    strategy: str  # one of STRATEGIES
    prompt_chars: int
    prompt_tokens: int  # as planned: exact for a byte-level tokenizer with a leading <s>
    max_tokens: int
    status: int  # HTTP status
    outcome: str  # one of OUTCOMES
    finish_reason: str | None = None  # None: an error, or hung up at read_chars before the end
    completion_tokens: int | None = None
    server_prompt_tokens: int | None = None  # usage.prompt_tokens, when the reply got that far
    error_code: str | None = None

    def summary(self) -> str:
        """answered / clamped (64 of 65 tokens) / refused (HTTP 400 code) / failed (code)."""
        if self.outcome == "refused":
            return f"refused (HTTP {self.status} {self.error_code})"
        if self.outcome == "failed":
            return f"failed ({self.error_code})"
        if self.outcome == "clamped":
            return f"clamped ({self.completion_tokens} of {self.max_tokens} tokens)"
        return "answered"


@dataclass
class RoundReport:
    round: int
    marker_tokens: int | None = None  # as the server counted them
    marker_repeated: bool = False  # the marker prompt's own reply carried >= MIN_FRAGMENT of its marker
    marker_error: str | None = None  # the marker prompt was refused or failed
    followups: list[str] = field(default_factory=list)  # per follow-up: FollowupResult.summary()
    findings: list[Finding] = field(default_factory=list)
    details: list[FollowupResult] = field(default_factory=list)  # per follow-up: strategy, shape, outcome

    def to_dict(self) -> dict:
        return asdict(self)


def parse_strategies(value: str, name: str = "strategy") -> tuple[str, ...]:
    """"auto", one of STRATEGIES, or a comma-separated list of them -> the names in use.
    Raises ValueError naming `name`, the value and the names allowed."""
    names = [n.strip() for n in str(value).split(",")]
    if names == [AUTO]:
        return STRATEGIES
    if AUTO in names:
        raise ValueError(f"{name} {value!r}: {AUTO} mixes every strategy and cannot be listed with others")
    bad = [n for n in names if n not in STRATEGIES]
    if bad:
        raise ValueError(f"{name} '{bad[0]}' is not one of {AUTO}, {', '.join(STRATEGIES)} "
                         "(or a comma-separated list of them)")
    if len(set(names)) != len(names):
        raise ValueError(f"{name} {value!r} names a strategy twice; list each of {', '.join(STRATEGIES)} "
                         "at most once")
    return tuple(names)


def check_block_size(value: int, name: str = "block size") -> int:
    """Raises ValueError naming `name`, the value and BLOCK_SIZES."""
    if isinstance(value, bool) or not isinstance(value, int) or not BLOCK_SIZES[0] <= value <= BLOCK_SIZES[1]:
        raise ValueError(f"{name} {value} is outside {BLOCK_SIZES[0]}..{BLOCK_SIZES[1]}")
    return value


def outcome_counts(rounds: list[RoundReport]) -> dict[str, dict[str, int]]:
    """{strategy: {outcome: follow-ups}} over `rounds`, strategies in STRATEGIES order (those
    used only), every outcome present (0 when none)."""
    counts: dict[str, dict[str, int]] = {}
    for report in rounds:
        for result in report.details:
            counts.setdefault(result.strategy, dict.fromkeys(OUTCOMES, 0))[result.outcome] += 1
    return {s: counts[s] for s in STRATEGIES if s in counts}


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
                 read_chars: int, rng: random.Random | None = None, strategy: str = AUTO,
                 block_size: int = BLOCK_SIZE):
        self.http, self.model, self.window = http, model, window
        self.long_tokens, self.followups, self.read_chars = long_tokens, followups, read_chars
        self.rng = rng or random.Random()
        self.markers: list[tuple[int, str]] = []  # (round, marker) of every marker sent
        self.strategies = parse_strategies(strategy)
        self.block_size = check_block_size(block_size)
        if "block_aligned" in self.strategies and window < 2 * block_size:
            raise ValueError(f"block size {block_size} is too large for the context window {window}: block_aligned "
                             f"needs the window to hold 2 blocks (a block size of at most {window // 2})")
        self._turn = 0  # follow-ups after the first of a round take the strategies in turn, round to round
        self._aligned = 0  # block_aligned rounds down, then up, in turn

    def marker_prompt(self, marker: str) -> str:
        # byte-level: <s> + one token per byte, so the text gets long_tokens - 1 - form bytes
        return PROMPT_FORM.format(text=filler(self.rng, self.long_tokens - 1 - FORM_CHARS, lead=marker))

    def followup_prompt(self, chars: int) -> str:
        return PROMPT_FORM.format(text=filler(self.rng, chars - FORM_CHARS))

    def next_strategy(self, reply: int) -> str:
        """The strategy of follow-up `reply` (1-based) of a round: the first named leads every
        round, the others take turns."""
        if len(self.strategies) == 1 or reply == 1:
            return self.strategies[0]
        rest = self.strategies[1:]
        self._turn += 1
        return rest[(self._turn - 1) % len(rest)]

    def shape(self, strategy: str, prompt_chars: int, prompt_tokens: int) -> tuple[int, int, int]:
        """(characters, tokens, max_tokens) of a `strategy` follow-up after a marker prompt of
        `prompt_chars` characters that the server counted as `prompt_tokens` tokens."""
        window, block, p = self.window, self.block_size, prompt_tokens
        if strategy == "over_window":
            return prompt_chars, p, max(1, window - p + 1)
        if strategy == "exact_window":
            return prompt_chars, p, max(1, window - p)
        if strategy == "prompt_over_window":
            tokens = self.rng.randint(window + 1, window + block)
            return self._chars_for(tokens, prompt_chars, p), tokens, MARKER_REPLY_TOKENS
        if strategy == "block_aligned":
            end = window // block * block  # the window's last block boundary
            down = min(max(block, p // block * block), end - block)
            tokens = down if self._aligned % 2 == 0 else min(down + block, end - block)
            self._aligned += 1
            return self._chars_for(tokens, prompt_chars, p), tokens, end - tokens
        raise ValueError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")

    @staticmethod
    def _chars_for(tokens: int, prompt_chars: int, prompt_tokens: int) -> int:
        """Characters for `tokens` tokens at the marker prompt's characters per token, one token
        being a leading <s> (exact for byte-level tokenizers)."""
        if tokens == prompt_tokens:
            return prompt_chars
        per_token = prompt_chars / max(1, prompt_tokens - 1)
        return max(FORM_CHARS + 1, round((tokens - 1) * per_token))

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
        for reply in range(1, self.followups + 1):
            strategy = self.next_strategy(reply)
            chars, tokens, max_tokens = self.shape(strategy, len(prompt), report.marker_tokens)
            body = {"model": self.model, "prompt": self.followup_prompt(chars), "max_tokens": max_tokens,
                    "temperature": 0.0, "user": "pagewarden-probe", "stream_options": {"include_usage": True}}
            got = self.http.stream(body, self.read_chars)
            result = FollowupResult(reply, strategy, chars, tokens, max_tokens, got.status, _outcome(got, max_tokens),
                                    got.finish_reason, got.completion_tokens, got.prompt_tokens, got.error_code)
            report.details.append(result)
            report.followups.append(result.summary())
            for marker_round, sent in self.markers:
                piece = leaked_fragment(sent, got.text)
                if piece:
                    report.findings.append(Finding(number, reply, piece, marker_round))
        return report


def _outcome(got, max_tokens: int) -> str:
    if got.status != 200:
        return "refused"
    if got.error is not None:
        return "failed"
    if got.finish_reason == "length" and got.completion_tokens is not None and got.completion_tokens < max_tokens:
        return "clamped"
    return "answered"


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
               read_chars: int = 256, timeout_s: float = 120.0, strategy: str = AUTO,
               block_size: int = BLOCK_SIZE) -> LeakProbe:
    """A LeakProbe for the server at `url` (its first model unless `model` names one), with the
    window its /v1/models says: the set-up `main.py probe` and the GUI's probe view do before
    their rounds. Raises ProbeError naming the URL (unreachable, no model list, no
    max_model_len, a window too small to probe); ValueError for an unknown strategy or a bad
    block size."""
    http = OpenAIHttp(url, per_second=rate, timeout_s=timeout_s)
    model, window = served_model(http, url, model)
    long_tokens = min(MAX_LONG_TOKENS, window - 64)
    if long_tokens < MARKER_REPLY_TOKENS + 48:
        raise ProbeError(f"{url}: context window {window} is too small to probe (needs at least 160 tokens)")
    return LeakProbe(http, model=model, window=window, long_tokens=long_tokens,
                     followups=followups, read_chars=read_chars, rng=random.SystemRandom(), strategy=strategy,
                     block_size=block_size)
