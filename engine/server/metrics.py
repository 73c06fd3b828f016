"""MetricsWindow: the numbers of the `metrics` topic, over a sliding window."""

from __future__ import annotations

import statistics
import time
from collections import deque

WINDOW_S = 10.0


class MetricsWindow:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.tokens: deque[tuple[float, int]] = deque()
        self.ttft: deque[tuple[float, float]] = deque()
        self.tpot: deque[tuple[float, float]] = deque()

    def add_tokens(self, n: int, now: float | None = None) -> None:
        self.tokens.append((now or time.monotonic(), n))

    def add_ttft(self, seconds: float, now: float | None = None) -> None:
        self.ttft.append((now or time.monotonic(), seconds))

    def add_tpot(self, seconds: float, now: float | None = None) -> None:
        self.tpot.append((now or time.monotonic(), seconds))

    def snapshot(self, now: float | None = None) -> dict:
        now = now or time.monotonic()
        for series in (self.tokens, self.ttft, self.tpot):
            while series and now - series[0][0] > self.window_s:
                series.popleft()
        recent = [n for t, n in self.tokens if now - t <= 1.0]
        return {
            "tokens_per_s": float(sum(recent)),
            "ttft_ms_p50": _median_ms(self.ttft),
            "ttft_ms_max": max((v for _, v in self.ttft), default=0.0) * 1e3,
            "tpot_ms_p50": _median_ms(self.tpot),
            "window_s": self.window_s,
        }


def _median_ms(series) -> float | None:
    values = [v for _, v in series]
    return statistics.median(values) * 1e3 if values else None
