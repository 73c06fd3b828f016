"""Every alert kind is declared once with what an operator does next (its runbook)."""

from __future__ import annotations

from engine.wire.alert_kinds import ALERT_KINDS, BY_NAME, ISOLATION_KINDS, SEVERITIES


def test_every_kind_has_a_runbook_of_a_few_short_steps():
    missing = [k.name for k in ALERT_KINDS
               if not isinstance(k.runbook, tuple) or not k.runbook
               or not all(isinstance(step, str) and step.strip() for step in k.runbook)]
    assert not missing, f"alert kinds without a runbook: {missing}"
    for kind in ALERT_KINDS:
        assert 2 <= len(kind.runbook) <= 6, (kind.name, len(kind.runbook))
        assert all(len(step) <= 260 for step in kind.runbook), kind.name
        assert len(set(kind.runbook)) == len(kind.runbook), f"{kind.name} repeats a step"


def test_kinds_are_unique_and_severities_declared():
    assert len(BY_NAME) == len(ALERT_KINDS)
    assert all(k.severity in SEVERITIES for k in ALERT_KINDS)


def test_data_crossed_runbooks_keep_the_evidence_and_name_the_tenants():
    # a critical isolation failure: export before the pages are reused, tell the tenants in scope
    for name in ISOLATION_KINDS:
        kind = BY_NAME[name]
        if kind.severity == "critical" and name != "transfer_timeout":
            steps = " ".join(kind.runbook)
            assert "Ctrl+E" in steps, name
            assert "Tenants in scope" in steps, name
    ownership = " ".join(BY_NAME["ownership_violation"].runbook)
    assert "writer_tag_check" in ownership and "manifest_check" in ownership and "Faults banner" in ownership
    assert "Reconfigure" in " ".join(BY_NAME["capacity_exceeds_window"].runbook)
    assert "restart_limit" in " ".join(BY_NAME["worker_crashed"].runbook)
