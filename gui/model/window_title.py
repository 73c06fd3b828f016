"""The main window's title: the engine it shows and how many critical alerts fire there (Qt-free).

The title is what an operator sees of a minimised window or in a task bar full of them, so it
names the engine (several windows on several engines) and puts the critical count first.
"""

from __future__ import annotations


def engine_label(endpoint: str, hosted: bool = False, hostname: str | None = None) -> str:
    """"tcp://10.0.0.5:5650 on gpu-box"; "" when no engine is attached."""
    if not endpoint:
        return ""
    label = f"hosted engine {endpoint}" if hosted else endpoint
    if isinstance(hostname, str) and hostname and hostname not in endpoint:
        label += f" on {hostname}"
    return label


def window_title(engine: str = "", *, critical: int = 0, readonly: str = "") -> str:
    """"⚠ 2 critical firing — PageWarden — tcp://… on gpu-box — read-only"."""
    parts = [f"⚠ {critical:,} critical firing"] if critical else []
    parts.append("PageWarden")
    parts += [p for p in (engine, readonly) if p]
    return " — ".join(parts)
