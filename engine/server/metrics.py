"""MetricsWindow: the numbers of the `metrics` topic, over a sliding window, and the
totals since start that Prometheus scrapes (tokens, TTFT and time-per-output-token
histograms: cumulative, as Prometheus expects)."""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

WINDOW_S = 10.0
TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TPOT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Counts per upper bound since start (the last bucket is +Inf), their sum and count."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def to_dict(self) -> dict[str, Any]:
        """{"buckets": [[upper bound, cumulative count], ..., ["+Inf", count]], "sum", "count"}."""
        buckets, running = [], 0
        upper: list[float | str] = [*self.bounds, "+Inf"]
        for bound, n in zip(upper, self.counts):
            running += n
            buckets.append([bound, running])
        return {"buckets": buckets, "sum": self.sum, "count": self.count}


class MetricsWindow:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self.tokens: deque[tuple[float, int]] = deque()
        self.ttft: deque[tuple[float, float]] = deque()
        self.tpot: deque[tuple[float, float]] = deque()
        self.tokens_total = 0
        self.ttft_hist = Histogram(TTFT_BUCKETS_S)
        self.tpot_hist = Histogram(TPOT_BUCKETS_S)

    def add_tokens(self, n: int, now: float | None = None) -> None:
        self.tokens.append((now or time.monotonic(), n))
        self.tokens_total += n

    def add_ttft(self, seconds: float, now: float | None = None) -> None:
        self.ttft.append((now or time.monotonic(), seconds))
        self.ttft_hist.observe(seconds)

    def add_tpot(self, seconds: float, now: float | None = None) -> None:
        self.tpot.append((now or time.monotonic(), seconds))
        self.tpot_hist.observe(seconds)

    def totals(self) -> dict[str, Any]:
        """Since start: tokens generated, TTFT and per-request time-per-output-token histograms."""
        return {"tokens_total": self.tokens_total, "ttft_seconds": self.ttft_hist.to_dict(),
                "tpot_seconds": self.tpot_hist.to_dict()}

    def snapshot(self, now: float | None = None) -> dict[str, float | None]:
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


def _median_ms(series: Iterable[tuple[float, float]]) -> float | None:
    values = [v for _, v in series]
    return statistics.median(values) * 1e3 if values else None
