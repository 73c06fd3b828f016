"""EngineConfig: every field validated, with errors naming the key, value and limit."""

from __future__ import annotations

import re

import pytest

from engine.config import DEFAULT_CONFIG_PATH, EngineConfig, config_from_dict, load_config
from engine.errors import ConfigError
from engine.wire.defences import DEFENCE_NAMES, FAULT_NAMES

BASE = {"pools": {"prefill": {"pages": 8}, "decode": {"pages": 8}}}


def _with(**sections):
    data = {k: dict(v) for k, v in BASE.items()}
    data["pools"] = {k: dict(v) for k, v in BASE["pools"].items()}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return data


def test_shipped_configs_load():
    cfg = load_config(DEFAULT_CONFIG_PATH)
    assert cfg.engine.page_size == 16 and cfg.engine.scrub_policy == "zero"
    assert cfg.dangerous() == []  # the safe default: every defence on, no fault (none is listed)
    incident = load_config(DEFAULT_CONFIG_PATH.parent / "incident.toml")
    assert incident.engine.context_window == 1_048_576
    assert incident.pools["prefill"].capacity_tokens(16) == 681_280


@pytest.mark.parametrize(
    "sections, fragment",
    [
        ({"engine": {"pagesize": 16}}, "unknown key 'engine.pagesize'"),
        ({"extra": {}}, "unknown key 'extra'"),
        ({"engine": {"page_size": "16"}}, "engine.page_size must be an integer, got '16'"),
        ({"engine": {"page_size": True}}, "engine.page_size must be an integer, got True"),
        ({"engine": {"page_size": 0}}, "engine.page_size = 0 is out of range: must be between 1 and 1,024"),
        ({"engine": {"page_size": 24}}, "engine.page_size = 24 must be a power of two"),
        ({"engine": {"context_window": -5}}, "engine.context_window = -5 is out of range"),
        ({"engine": {"max_batch": 0}}, "engine.max_batch = 0 is out of range"),
        ({"engine": {"scrub_policy": "wipe"}}, "engine.scrub_policy = 'wipe' is not one of zero, poison, none"),
        ({"engine": {"kernels": "cuda"}}, "engine.kernels = 'cuda' is not one of auto, triton, torch"),
        ({"defences": {"writer_tag_check": 1}}, "defences.writer_tag_check must be true or false, got 1"),
        ({"faults": {"short_transfer": "yes"}}, "faults.short_transfer must be true or false"),
        ({"canaries": {"per_minute": 1000}}, "canaries.per_minute = 1,000 is out of range"),
        ({"engine": {"ownership_policy": "ignore"}}, "engine.ownership_policy = 'ignore' is not one of abort, report_only"),
        ({"model": {"dtype": "fp8"}}, "model.dtype = 'fp8' is not one of auto"),
        ({"model": {"device": "gpu"}}, "model.device = 'gpu' is not one of auto, cpu, cuda, cuda:N"),
        ({"model": {"path": 3}}, "model.path must be a string, got 3"),
        ({"alerts": {"webhook_url": "ftp://am:9093"}},
         "alerts.webhook_url = 'ftp://am:9093' is not an http:// or https:// URL with a host"),
        ({"alerts": {"webhook_url": "am:9093"}}, "alerts.webhook_url = 'am:9093' is not an http:// or https:// URL"),
        ({"alerts": {"webhook_url": "http://am:99999"}}, "alerts.webhook_url = 'http://am:99999' is not a valid URL"),
        ({"alerts": {"webhook_url": "http://ops:secret@am:9093"}},
         "alerts.webhook_url must not carry a user or password"),
        ({"alerts": {"webhook_url": "http://am:9093/a b"}}, "holds whitespace or control characters"),
        ({"alerts": {"generator_url": "javascript:alert(1)"}}, "alerts.generator_url = 'javascript:alert(1)' is not"),
        ({"alerts": {"webhook_resend_s": 0}},
         "alerts.webhook_resend_s = 0 is out of range: must be between 1 and 3,600"),
        ({"alerts": {"webhook_queue": 0}}, "alerts.webhook_queue = 0 is out of range: must be between 1 and 100,000"),
        ({"alerts": {"webhook": "http://am"}}, "unknown key 'alerts.webhook'"),
    ],
)
def test_bad_values_name_key_value_and_limit(sections, fragment):
    with pytest.raises(ConfigError) as err:
        config_from_dict(_with(**sections), source="t.toml")
    assert fragment in str(err.value)
    assert str(err.value).startswith("t.toml: ")


@pytest.mark.parametrize(
    "pools, fragment",
    [
        ({"prefill": {"pages": 8}}, "missing [pools.decode]"),
        ({"prefill": {"pages": 8}, "decode": {}}, "pools.decode.pages is required"),
        ({"prefill": {"pages": 0}, "decode": {"pages": 8}}, "pools.prefill.pages = 0 is out of range"),
        ({"prefill": {"pages": 8}, "decode": {"pages": 8, "size": 3}}, "unknown key 'pools.decode.size'"),
        ({"prefill": {"pages": 8}, "decode": {"pages": 8}, "spare": {"pages": 8}}, "unknown key 'pools.spare'"),
    ],
)
def test_pool_tables_are_checked(pools, fragment):
    with pytest.raises(ConfigError) as err:
        config_from_dict({"pools": pools})
    assert fragment in str(err.value)


def test_every_declared_switch_is_a_key_and_needs_allow_faults():
    cfg = config_from_dict(_with(defences=dict.fromkeys(DEFENCE_NAMES, False), faults=dict.fromkeys(FAULT_NAMES, True)))
    assert cfg.dangerous() == [f"defences.{d} = false" for d in DEFENCE_NAMES] + [f"faults.{f} = true" for f in FAULT_NAMES]
    with pytest.raises(ConfigError, match=f"faults.{FAULT_NAMES[-1]} = true: turning defences off"):
        config_from_dict(_with(faults={FAULT_NAMES[-1]: True})).check_faults_allowed(False)


def test_alert_webhook_is_off_by_default_and_takes_http_urls():
    assert load_config(DEFAULT_CONFIG_PATH).alerts.webhook_url == ""
    cfg = config_from_dict(_with(alerts={"webhook_url": "https://alertmanager.example:9093/"}))
    assert cfg.alerts.webhook_url == "https://alertmanager.example:9093/" and cfg.alerts.webhook_resend_s == 60


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="config file not found: .*nope.toml"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine\npage_size = 16\n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        load_config(bad)


def test_relative_model_path_is_relative_to_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    cfg_file = tmp_path / "sub" / "c.toml"
    cfg_file.write_text('[model]\npath = "../models/m"\n[pools.prefill]\npages = 4\n[pools.decode]\npages = 4\n')
    cfg = load_config(cfg_file)
    assert cfg.model.resolved_path() == (tmp_path / "models" / "m").resolve()


def test_replace_validates_and_keeps_the_rest():
    cfg = config_from_dict(BASE)
    changed = cfg.replace(engine={"page_size": 32}, pools={"decode": {"pages": 64}})
    assert changed.engine.page_size == 32 and changed.pools["decode"].pages == 64
    assert changed.pools["prefill"].pages == 8 and cfg.engine.page_size == 16
    with pytest.raises(ConfigError, match="engine.page_size = 3 must be a power of two"):
        cfg.replace(engine={"page_size": 3})
    with pytest.raises(ConfigError, match="unknown section 'engin'"):
        cfg.replace(engin={})
    assert config_from_dict(cfg.to_dict()) == cfg.replace()


def test_switching_an_invariant_off_by_an_engine_key_needs_allow_faults_too():
    base = EngineConfig()
    assert base.dangerous() == []
    for change, named in (({"ownership_policy": "report_only"}, "engine.ownership_policy = 'report_only'"),
                          ({"scrub_policy": "none"}, "engine.scrub_policy = 'none'")):
        config = base.replace(engine=change)
        assert config.dangerous() == [named]
        with pytest.raises(ConfigError, match=re.escape(named) + ".*needs `serve --allow-faults`"):
            config.check_faults_allowed(False)
        config.check_faults_allowed(True)
    assert base.replace(engine={"scrub_policy": "poison"}).dangerous() == []  # NaN scrub is still a scrub

