"""I6: the window against every pool, with exact numbers."""

from __future__ import annotations

from engine.capacity import check_capacity, exceeding
from engine.config import DEFAULT_CONFIG_PATH, config_from_dict, load_config


def test_incident_figures_in_one_line():
    findings = check_capacity(load_config(DEFAULT_CONFIG_PATH.parent / "incident.toml"))
    (bad,) = exceeding(findings)
    assert bad.limit == "pool:prefill"
    assert (bad.window_tokens, bad.limit_tokens, bad.shortfall_tokens) == (1_048_576, 681_280, 367_296)
    line = bad.message()
    assert "\n" not in line
    assert "exceeds the prefill pool" in line and "by 367,296 tokens" in line
    assert "(the pool covers 65.0% of the window)" in line
    assert "1,048,576" in line and "681,280" in line


def test_window_equal_to_pool_fits_and_one_more_token_does_not():
    pools = {"prefill": {"pages": 4}, "decode": {"pages": 8}}
    fits = check_capacity(config_from_dict({"engine": {"context_window": 64}, "pools": pools}))
    assert not exceeding(fits)
    over = check_capacity(config_from_dict({"engine": {"context_window": 65}, "pools": pools}))
    assert [f.limit for f in exceeding(over)] == ["pool:prefill"]
    assert exceeding(over)[0].shortfall_tokens == 1


def test_model_positions_are_a_finding_too():
    cfg = config_from_dict({"engine": {"context_window": 8192},
                            "pools": {"prefill": {"pages": 1024}, "decode": {"pages": 1024}}})
    findings = check_capacity(cfg, model_max_positions=4096)
    assert [f.limit for f in exceeding(findings)] == ["model:max_position_embeddings"]
    assert findings[-1].to_dict()["shortfall_tokens"] == 4096
