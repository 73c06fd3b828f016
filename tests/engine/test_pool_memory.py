"""Issue 14, item 10: a pool of 2,147,483,647 pages passed validation and its worker tried to
allocate 70 TB. The pools are checked against the machine's memory first."""

from __future__ import annotations

import pytest

from engine.config import DEFAULT_MODEL_DIR, EngineConfig
from engine.errors import ConfigError
from engine.model.config import read_model_config
from engine.pool_memory import check_pool_memory, host_memory_bytes, pool_memory


def test_the_default_pools_fit_and_a_huge_one_is_refused_naming_it():
    model = read_model_config(DEFAULT_MODEL_DIR)
    config = EngineConfig()
    check_pool_memory(config, model)  # the shipped defaults fit this machine
    huge = config.replace(pools={"decode": {"pages": 2_147_483_647}})
    with pytest.raises(ConfigError, match=r"pools.decode.pages = 2,147,483,647 x 1 worker\(s\) = .* GiB.*"
                                          r"but this machine has .* GiB of memory"):
        check_pool_memory(huge, model)


def test_pool_bytes_count_every_worker_layer_and_head():
    model = read_model_config(DEFAULT_MODEL_DIR)
    config = EngineConfig().replace(workers={"decode": 2}, pools={"decode": {"pages": 100}}, model={"dtype": "float32"})
    decode = next(p for p in pool_memory(config, model) if p.name == "decode")
    slot = 2 * model.num_layers * model.num_kv_heads * model.head_dim * 4 + 12
    assert decode.bytes_per_worker == 100 * config.engine.page_size * slot and decode.total == 2 * decode.bytes_per_worker
    assert host_memory_bytes() > 0


def test_the_supervisor_refuses_to_start_with_pools_bigger_than_memory():
    from engine.server.supervisor import Supervisor

    with pytest.raises(ConfigError, match="the page pools need"):
        Supervisor(EngineConfig().replace(pools={"prefill": {"pages": 2_147_483_647}}, canaries={"enabled": False}))
