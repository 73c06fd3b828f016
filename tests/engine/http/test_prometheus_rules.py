"""The alert rules that ship (resources/prometheus/) pass Prometheus's own checks: `promtool
check rules`, `promtool check config` on the example scrape configuration, and `promtool test
rules`, whose cases fire each rule on the engine that should and not on its healthy neighbour.
promtool comes with Debian's `prometheus` package, which .ci/run installs."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from engine.config import REPO_ROOT

RULES = REPO_ROOT / "resources" / "prometheus"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt install prometheus)")


def _promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], cwd=RULES, capture_output=True, text=True, timeout=120)  # type: ignore[list-item]


@needs_promtool
def test_the_rules_and_the_example_configuration_check():
    rules = _promtool("check", "rules", "pagewarden-rules.yml")
    assert rules.returncode == 0 and "SUCCESS: 8 rules found" in rules.stdout, rules.stdout + rules.stderr
    config = _promtool("check", "config", "prometheus.yml")
    assert config.returncode == 0, config.stdout + config.stderr


@needs_promtool
def test_each_rule_fires_where_it_should_and_only_there():
    tested = _promtool("test", "rules", "pagewarden-rules.test.yml")
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_shipped_rule_has_a_test_case_and_names_exported_metrics():
    import re

    import yaml

    from engine.http.prometheus_text import metric_names

    rules = [r for g in yaml.safe_load((RULES / "pagewarden-rules.yml").read_text())["groups"] for r in g["rules"]]
    cases = yaml.safe_load((RULES / "pagewarden-rules.test.yml").read_text())["tests"]
    tested = {t["alertname"] for case in cases for t in case["alert_rule_test"] if t["exp_alerts"]}
    assert {r["alert"] for r in rules} == tested  # each rule is shown firing at least once
    exported = set(metric_names()) | {"up"}
    for rule in rules:
        named = set(re.findall(r"\b(pagewarden_[a-z_]+|up)\b(?=\{|\[|\)|\s|$)", rule["expr"]))
        assert named and named <= exported, (rule["alert"], named - exported)
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
