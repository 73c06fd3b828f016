"""What the configured page pools will take in memory, checked before a worker allocates them.

A pool of 2,147,483,647 pages passed validation and its worker then tried to allocate 70 TB.
The supervisor (no torch) computes each pool's bytes from the model's config.json and the
engine config, and refuses a configuration whose pools together exceed this machine's memory
(a CUDA pool lives on the GPU, which is smaller still: the worker reports that one itself).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.model.config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# per token slot beside the K/V: its writer tag (int64) and its content owner (int32, audit)
METADATA_BYTES_PER_SLOT = 8 + 4


@dataclass(frozen=True)
class PoolMemory:
    name: str  # "prefill" or "decode" (each worker of that role holds one)
    workers: int
    bytes_per_worker: int

    @property
    def total(self) -> int:
        return self.workers * self.bytes_per_worker


def pool_memory(config: EngineConfig, model: ModelConfig) -> list[PoolMemory]:
    dtype = model.dtype if config.model.dtype == "auto" else config.model.dtype
    slot = 2 * model.num_layers * model.num_kv_heads * model.head_dim * DTYPE_BYTES.get(dtype, 4)
    per_page = config.engine.page_size * (slot + METADATA_BYTES_PER_SLOT)
    counts = {"prefill": config.workers.prefill, "decode": config.workers.decode}
    return [PoolMemory(name, counts[name], pool.pages * per_page) for name, pool in config.pools.items()]


def host_memory_bytes() -> int | None:
    """MemTotal of this machine (Linux), or None when it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_pool_memory(config: EngineConfig, model: ModelConfig, limit: int | None = None) -> None:
    """Raise ConfigError naming each pool, its pages and bytes, when the pools together need
    more than `limit` bytes (default: this machine's memory)."""
    limit = host_memory_bytes() if limit is None else limit
    pools = pool_memory(config, model)
    need = sum(p.total for p in pools)
    if limit is not None and need > limit:
        parts = ", ".join(f"pools.{p.name}.pages = {config.pools[p.name].pages:,} x {p.workers} worker(s) = "
                          f"{_gib(p.total)}" for p in pools)
        raise ConfigError(f"the page pools need {_gib(need)} ({parts}) but this machine has {_gib(limit)} of "
                          f"memory; make the pools smaller")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
