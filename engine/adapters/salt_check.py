"""SaltCheck: does an OpenAI-compatible server keep its prefix cache apart per `cache_salt`?

vLLM's defence against cross-tenant prefix-cache timing attacks (CVE-2025-46570) is the
request field `cache_salt`: only requests with the same salt may share cached KV blocks.
A check that different salts do not share passes as well on a server that caches nothing,
so both halves are asked (vllm#53347):

- a "same" pair: request A with salt s1, then B with A's prefix and salt s1: must hit;
- a "different" pair: A with salt s1, then B with A's prefix and salt s2: must miss.

Every pair has a fresh random prefix (a random nonce, then random words, `prefix_tokens`
tokens as the warm-up request measured the server's characters per token), so no earlier
cache entry can match it, and a short suffix of its own per request. Each request asks
max_tokens 1, streamed with usage; its time to the first streamed chunk (TTFT) is kept.
The A requests are the cold baseline. The pairs alternate, same then different.

Judged twice (`judge`):
- by `usage.prompt_tokens_details.cached_tokens`, where the server reports it (vLLM with
  --enable-prompt-tokens-details): a hit is cached_tokens > 0. A fresh random prefix must
  show 0 in every A; any different-salt B above 0 is the cache crossing salts.
- by TTFT: a two-sample Kolmogorov–Smirnov test of the same-salt B times against the cold
  times (a hit should be faster) and of the different-salt B times against the cold times
  (a miss should look cold), with D, the p-value and the ratio of medians. Timing calls a
  group hits when it differs from cold at p < ALPHA and its median is at most HIT_RATIO of
  cold's. With samples too small for any p-value below ALPHA (`smallest_p`) timing cannot
  tell, and says so.

The counts are the server's own account and decide when reported; timing that says the
opposite (different salts significantly faster than cold, or hits timed where the counts
say none) makes the verdict inconclusive. Without counts, timing decides alone.
`no_salt` (an ablation) sends the different pairs with no salt at all, as a router that
drops the field would: a working cache then shares them, and the check must say so.
"""

from __future__ import annotations

import random
import secrets
import statistics
from dataclasses import asdict, dataclass, field

from engine.adapters.leak_probe import WORDS, served_model
from engine.adapters.openai_http import Completion, OpenAIHttp, ProbeError
from engine.adapters.two_sample_ks import ks_two_sample, smallest_p

HOLDS = "salt isolation holds"
SHARED = "cache shared across salts"
NO_CACHE = "no prefix cache seen"
INCONCLUSIVE = "inconclusive"
VERDICTS = (HOLDS, SHARED, NO_CACHE, INCONCLUSIVE)

ALPHA = 0.05
# A hit must save at least a fifth of the time to first token to count as one by timing:
# measured on vLLM 0.32 CPU (1,000 tokens), hits ran at 0.23-0.33 of cold while misses with
# another salt still ran at 0.88 (nearly significant at N = 8): a small drift is not a hit.
HIT_RATIO = 0.8
PAIRS = (2, 64)  # per kind; default 8
DEFAULT_PAIRS = 8
PREFIX_TOKENS = (64, 32_768)  # default 1,000, capped by the window
DEFAULT_PREFIX_TOKENS = 1000
SUFFIX_TOKENS = 24  # room kept for the suffix (at most 1 character a token) and the one answer token
WARMUP_CHARS = 256
USER = "pagewarden-salt-check"


@dataclass
class SaltPair:
    """One pair: A (cold) then B with A's prefix, and what each took and reused."""

    number: int  # 1-based within its kind
    kind: str  # "same" or "different"
    salt_a: str | None
    salt_b: str | None
    prompt_tokens: int | None  # B's, as the server counted them
    cold_ttft_s: float
    second_ttft_s: float
    cold_cached: int | None  # None: not reported
    second_cached: int | None


@dataclass
class TimingTest:
    """One KS comparison of second requests' TTFTs against the cold ones."""

    name: str  # "same" or "different"
    d: float
    p_value: float
    median_ratio: float  # median(second) / median(cold): below 1 is faster than cold
    n: int
    m: int
    smallest_p: float  # the smallest p-value samples of n and m can give
    method: str

    @property
    def resolvable(self) -> bool:
        return self.smallest_p < ALPHA

    @property
    def faster(self) -> bool:
        """What a hit looks like: significantly different from cold (p < ALPHA), and at most
        HIT_RATIO of its median."""
        return self.resolvable and self.p_value < ALPHA and self.median_ratio <= HIT_RATIO

    def describe(self) -> str:
        head = (f"{self.name}-salt seconds vs cold: D {self.d:.2f}, p {self.p_value:.3g} ({self.method}), "
                f"median ratio {self.median_ratio:.2f}")
        if not self.resolvable:
            return head + f" (N too small to tell: the smallest p for {self.n} and {self.m} is {self.smallest_p:.3g})"
        return head


@dataclass
class SaltReport:
    url: str
    model: str
    prefix_tokens: int
    no_salt: bool
    pairs: list[SaltPair] = field(default_factory=list)
    verdict: str = INCONCLUSIVE
    reasons: list[str] = field(default_factory=list)
    counts_reported: bool = False
    same_hits: int = 0
    different_hits: int = 0
    cold_hits: int = 0
    timing: list[TimingTest] = field(default_factory=list)
    requests: int = 0

    def to_dict(self) -> dict:
        return {**asdict(self), "timing": [{**asdict(t), "resolvable": t.resolvable} for t in self.timing]}

    def lines(self) -> list[str]:
        """The verdict, then why: what the CLI prints and the app's dialog shows."""
        same = [p for p in self.pairs if p.kind == "same"]
        different = [p for p in self.pairs if p.kind == "different"]
        out = [f"salt check {self.url} model {self.model}: {self.verdict}"]
        if self.counts_reported:
            out.append(f"cached_tokens: same salt hit {self.same_hits} of {len(same)}, different salts hit "
                       f"{self.different_hits} of {len(different)}, cold hit {self.cold_hits} of {len(self.pairs)}")
        out += [t.describe() for t in self.timing]
        return out + self.reasons


def judge(pairs: list[SaltPair]) -> tuple[str, list[str], dict]:
    """(verdict, reasons, facts) for the measured pairs; facts: counts_reported, same_hits,
    different_hits, cold_hits, timing (TimingTests)."""
    same = [p for p in pairs if p.kind == "same"]
    different = [p for p in pairs if p.kind == "different"]
    cold = [p.cold_ttft_s for p in pairs]
    timing = [_timing(name, [p.second_ttft_s for p in group], cold)
              for name, group in (("same", same), ("different", different)) if group]
    same_t, diff_t = (next((t for t in timing if t.name == n), None) for n in ("same", "different"))
    counts = [c for p in pairs for c in (p.cold_cached, p.second_cached)]
    some = sum(c is not None for c in counts)
    reported = some > 0  # a request without the count is taken as none cached (said below)
    facts = {"counts_reported": reported, "timing": timing,
             "same_hits": sum(bool(p.second_cached) for p in same),
             "different_hits": sum(bool(p.second_cached) for p in different),
             "cold_hits": sum(bool(p.cold_cached) for p in pairs)}
    reasons: list[str] = []
    if not same or not different:
        return INCONCLUSIVE, ["both same-salt and different-salt pairs are needed"], facts
    if reported:
        if some < len(counts):
            reasons.append(f"cached_tokens came with {some} of {len(counts)} requests; the others are taken as "
                           "none cached (a server that leaves zero counts out)")
        verdict = _by_counts(facts, len(same), reasons)
        return _checked_by_timing(verdict, same_t, diff_t, reasons), reasons, facts
    reasons.append("the server does not report usage.prompt_tokens_details.cached_tokens (vLLM: "
                   "--enable-prompt-tokens-details): judged by timing alone")
    return _by_timing(same_t, diff_t, reasons), reasons, facts


def _timing(name: str, seconds: list[float], cold: list[float]) -> TimingTest:
    result = ks_two_sample(seconds, cold)
    ratio = statistics.median(seconds) / max(statistics.median(cold), 1e-9)
    return TimingTest(name, result.d, result.p_value, ratio, result.n, result.m, smallest_p(result.n, result.m),
                      result.method)


def _by_counts(facts: dict, same_n: int, reasons: list[str]) -> str:
    if facts["cold_hits"]:
        reasons.append(f"{facts['cold_hits']} cold request(s) with a fresh random prefix reported cached tokens: "
                       "the server's counts include something else, and cannot judge reuse")
        return INCONCLUSIVE
    if facts["different_hits"]:
        reasons.append(f"{facts['different_hits']} request(s) reused the cache of a request with another salt: "
                       "data crosses tenants through the prefix cache (a timing side channel)")
        return SHARED
    if facts["same_hits"] == 0:
        reasons.append("the same salt did not hit either: the check cannot tell salt isolation from no prefix "
                       "caching (vllm#53347); is prefix caching on?")
        return NO_CACHE
    if 2 * facts["same_hits"] <= same_n:
        reasons.append(f"the same salt hit only {facts['same_hits']} of {same_n} times: the cache works too "
                       "seldom to show that a different salt's miss is isolation (evictions? a cache too small?)")
        return INCONCLUSIVE
    return HOLDS


def _checked_by_timing(verdict: str, same_t: TimingTest | None, diff_t: TimingTest | None,
                       reasons: list[str]) -> str:
    if diff_t is not None and diff_t.faster and verdict in (HOLDS, NO_CACHE):
        reasons.append("timing disagrees with the counts: different-salt requests ran as fast as hits "
                       f"(p {diff_t.p_value:.3g}, median ratio {diff_t.median_ratio:.2f}) though none reported one")
        return INCONCLUSIVE
    if same_t is not None and same_t.faster and verdict == NO_CACHE:
        reasons.append("timing disagrees with the counts: same-salt requests ran as fast as hits "
                       f"(p {same_t.p_value:.3g}, median ratio {same_t.median_ratio:.2f}) though none reported one")
        return INCONCLUSIVE
    if diff_t is not None and not diff_t.faster and diff_t.resolvable and diff_t.p_value < ALPHA:
        reasons.append(f"different-salt requests differ from cold (p {diff_t.p_value:.3g}) by less than a hit "
                       f"saves (median ratio {diff_t.median_ratio:.2f}, a hit: at most {HIT_RATIO}): not counted")
    if verdict == HOLDS and same_t is not None and not same_t.faster:
        reasons.append("timing does not show the same-salt hits (" + ("N too small to tell" if not same_t.resolvable
                       else "the prefill saved is too small to see") + "): judged by the counts")
    return verdict


def _by_timing(same_t: TimingTest | None, diff_t: TimingTest | None, reasons: list[str]) -> str:
    if same_t is None or diff_t is None or not same_t.resolvable or not diff_t.resolvable:
        low = min((t.smallest_p for t in (same_t, diff_t) if t is not None), default=1.0)
        reasons.append(f"N too small to tell: the smallest attainable p-value is {low:.3g}, not below {ALPHA}; "
                       "ask for more pairs")
        return INCONCLUSIVE
    if diff_t.faster and same_t.faster:
        reasons.append("different-salt requests ran as fast as same-salt hits: the cache is shared across salts "
                       "(by timing)")
        return SHARED
    if diff_t.faster:
        reasons.append("different-salt requests ran as fast as hits but same-salt ones did not: timing "
                       "contradicts itself")
        return INCONCLUSIVE
    if same_t.faster:
        reasons.append("same-salt requests ran as fast as hits, different-salt ones as cold (by timing)")
        return HOLDS
    reasons.append(f"no group ran as fast as hits (p < {ALPHA}, median at most {HIT_RATIO} of cold): no prefix "
                   "cache seen; the check cannot tell salt isolation from no caching (vllm#53347)")
    return NO_CACHE


def new_salt() -> str:
    return f"pw-salt-{secrets.token_hex(12)}"


class SaltCheck:
    def __init__(self, http: OpenAIHttp, *, url: str, model: str, window: int, pairs: int = DEFAULT_PAIRS,
                 prefix_tokens: int = DEFAULT_PREFIX_TOKENS, no_salt: bool = False,
                 rng: random.Random | None = None):
        """Raises ValueError naming the value and the limits."""
        if not PAIRS[0] <= pairs <= PAIRS[1]:
            raise ValueError(f"pairs {pairs} is outside {PAIRS[0]}..{PAIRS[1]}")
        high = min(PREFIX_TOKENS[1], window - SUFFIX_TOKENS)
        if high < PREFIX_TOKENS[0]:
            raise ValueError(f"context window {window} is too small for a salt check (needs at least "
                             f"{PREFIX_TOKENS[0] + SUFFIX_TOKENS} tokens)")
        if prefix_tokens < PREFIX_TOKENS[0]:
            raise ValueError(f"prefix tokens {prefix_tokens} is outside {PREFIX_TOKENS[0]}..{high}")
        self.capped = prefix_tokens > high  # said in the report
        self.http, self.url, self.model, self.window = http, url, model, window
        self.pairs, self.prefix_tokens, self.no_salt = pairs, min(prefix_tokens, high), no_salt
        self.rng = rng or random.SystemRandom()
        self.chars_per_token = 1.0  # until the warm-up measures it: never more tokens than planned

    def run(self) -> SaltReport:
        """The warm-up, then `pairs` same and `pairs` different pairs, judged. Raises
        ProbeError for a request the server refused or failed, naming it."""
        report = SaltReport(self.url, self.model, self.prefix_tokens, self.no_salt)
        if self.capped:
            report.reasons.append(f"prefix capped at {self.prefix_tokens} tokens by the context window {self.window}")
        self._warm_up(report)
        for number in range(1, self.pairs + 1):
            report.pairs.append(self.run_pair(number, "same"))
            report.pairs.append(self.run_pair(number, "different"))
        report.requests = self.http.sent
        verdict, reasons, facts = judge(report.pairs)
        report.verdict, report.reasons = verdict, reasons + report.reasons
        for key, value in facts.items():
            setattr(report, key, value)
        return report

    def _warm_up(self, report: SaltReport) -> None:
        """One request not counted: the server's first is often slow, and its prompt_tokens
        gives the characters per token the prefixes are planned with."""
        text = self._words(WARMUP_CHARS)
        got = self._send(text, new_salt(), "warm-up")
        if got.prompt_tokens:
            self.chars_per_token = max(1.0, len(text) / got.prompt_tokens)
        else:
            report.reasons.append("the server did not report usage.prompt_tokens: prefixes planned at 1 character "
                                  "a token (shorter than asked for tokenizers with longer tokens)")

    def run_pair(self, number: int, kind: str) -> SaltPair:
        """A then B over one fresh prefix; B's salt is A's (same) or another (different)."""
        prefix = f"{secrets.token_hex(8)} " + self._words(int(self.prefix_tokens * self.chars_per_token) - 17)
        salt_a = None if self.no_salt and kind == "different" else new_salt()
        salt_b = salt_a if kind == "same" or salt_a is None else new_salt()
        a = self._send(prefix + self._suffix(), salt_a, f"pair {number} ({kind}) A")
        b = self._send(prefix + self._suffix(), salt_b, f"pair {number} ({kind}) B")
        return SaltPair(number, kind, salt_a, salt_b, b.prompt_tokens, a.ttft_s, b.ttft_s, a.cached_tokens,
                        b.cached_tokens)

    def _send(self, prompt: str, salt: str | None, name: str) -> Completion:
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "user": USER,
                "stream_options": {"include_usage": True}}
        if salt is not None:
            body["cache_salt"] = salt
        got = self.http.timed_stream(body)
        if got.status != 200:
            hint = "; does this server take cache_salt?" if salt is not None and "cache_salt" in str(got.error) else ""
            raise ProbeError(f"{self.url}: {name} refused: HTTP {got.status} {got.error_code}: {got.error}{hint}")
        if got.error is not None:
            raise ProbeError(f"{self.url}: {name} failed in its stream: {got.error_code}: {got.error}")
        if got.ttft_s is None:
            raise ProbeError(f"{self.url}: {name}: the stream ended without a completion chunk")
        return got

    def _words(self, chars: int) -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < chars:
            words.append(self.rng.choice(WORDS))
        return " ".join(words)[:max(0, chars)]

    def _suffix(self) -> str:
        return f"\nQ{self.rng.randrange(10**6)}: {self.rng.choice(WORDS)}?"


def open_salt_check(url: str, *, model: str | None = None, window: int | None = None, pairs: int = DEFAULT_PAIRS,
                    prefix_tokens: int = DEFAULT_PREFIX_TOKENS, no_salt: bool = False, rate: float = 5.0,
                    timeout_s: float = 120.0, api_key: str | None = None) -> SaltCheck:
    """A SaltCheck for the server at `url` (its first model unless `model` names one; the
    window of its /v1/models unless `window`). Raises ProbeError naming the URL, ValueError
    for a value out of its limits."""
    http = OpenAIHttp(url, api_key=api_key, per_second=rate, timeout_s=timeout_s)
    model, window = served_model(http, url, model, window, model_hint="give a model name",
                                 window_hint="; give the window")
    return SaltCheck(http, url=url, model=model, window=window, pairs=pairs, prefix_tokens=prefix_tokens,
                     no_salt=no_salt)
