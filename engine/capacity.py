"""I6: is the advertised context window backed by real capacity?

The incident: the window allowed 1,048,576 tokens while the prefill pool held 681,280.
A finding says, with both numbers, whether one request of the full window fits a pool.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.config import EngineConfig


@dataclass(frozen=True)
class CapacityFinding:
    """The window compared with one limit (a KV pool, or the model's trained positions)."""

    limit: str  # "pool:prefill", "pool:decode" or "model:max_position_embeddings"
    window_tokens: int
    limit_tokens: int
    detail: str  # how limit_tokens was derived, e.g. "42,580 pages x 16 tokens"

    @property
    def exceeds(self) -> bool:
        return self.window_tokens > self.limit_tokens

    @property
    def shortfall_tokens(self) -> int:
        return max(0, self.window_tokens - self.limit_tokens)

    @property
    def coverage(self) -> float:
        """Fraction of the window this limit can hold (1.0 or more when it fits)."""
        return self.limit_tokens / self.window_tokens

    def message(self) -> str:
        what = _describe(self.limit)
        if self.exceeds:
            return (
                f"context window {self.window_tokens:,} tokens exceeds {what} "
                f"({self.limit_tokens:,} tokens = {self.detail}) by {self.shortfall_tokens:,} "
                f"tokens (the {_short(self.limit)} covers {self.coverage:.1%} of the window)"
            )
        return (
            f"context window {self.window_tokens:,} tokens fits {what} "
            f"({self.limit_tokens:,} tokens = {self.detail})"
        )

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "exceeds": self.exceeds,
            "shortfall_tokens": self.shortfall_tokens,
            "coverage": round(self.coverage, 6),
            "message": self.message(),
        }


def check_capacity(
    config: EngineConfig, *, model_max_positions: int | None = None
) -> list[CapacityFinding]:
    """One finding per pool (and for the model's positions when known), in a stable order."""
    window = config.engine.context_window
    page_size = config.engine.page_size
    findings = [
        CapacityFinding(
            limit=f"pool:{name}",
            window_tokens=window,
            limit_tokens=pool.capacity_tokens(page_size),
            detail=f"{pool.pages:,} pages x {page_size} tokens",
        )
        for name, pool in config.pools.items()
    ]
    if model_max_positions is not None:
        findings.append(
            CapacityFinding(
                limit="model:max_position_embeddings",
                window_tokens=window,
                limit_tokens=model_max_positions,
                detail="the model's max_position_embeddings",
            )
        )
    return findings


def exceeding(findings: list[CapacityFinding]) -> list[CapacityFinding]:
    return [f for f in findings if f.exceeds]


def _short(limit: str) -> str:
    return "pool" if limit.startswith("pool:") else "model"


def _describe(limit: str) -> str:
    kind, _, name = limit.partition(":")
    if kind == "pool":
        return f"the {name} pool"
    return f"the model's trained positions ({name})"
