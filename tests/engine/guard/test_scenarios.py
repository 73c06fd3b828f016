"""`reproduce`'s scenarios come from the fault declarations: one per fault, then `clean`."""

from __future__ import annotations

import random

import pytest

from engine.guard.scenarios import ROWS, SCENARIOS, WORKLOADS, defences_for, fault_scenario, steady
from engine.wire.defences import FAULTS, Staging, Switch


def test_one_scenario_per_declared_fault_then_clean():
    assert list(SCENARIOS) == [fault_scenario(f).name for f in FAULTS] + ["clean"]  # no two share a name
    for fault in FAULTS:
        scenario = SCENARIOS[fault_scenario(fault).name]
        assert scenario.faults[fault.name] is True and scenario.rows[: len(ROWS)] == ROWS
    assert not SCENARIOS["clean"].faults


def test_every_row_names_declared_defences():
    for scenario in SCENARIOS.values():
        for row in scenario.rows:
            defences_for(row)  # raises naming an unknown defence


def test_a_fault_that_acts_on_one_tenant_meets_it_in_its_workload():
    for scenario in SCENARIOS.values():
        if scenario.tenant:
            tenants = {w["tenant"] for w in scenario.workload(random.Random(1), 0.25)}
            assert scenario.tenant in tenants, (scenario.name, scenario.tenant, tenants)


def test_a_fault_declared_without_staging_gets_a_steady_scenario_after_its_name():
    scenario = fault_scenario(Switch("lost_epoch", "I1", "lost epoch", "a page's epoch is not bumped"))
    assert (scenario.name, scenario.story, scenario.faults) == ("lost-epoch", "a page's epoch is not bumped",
                                                                {"lost_epoch": True})
    assert scenario.workload is steady and scenario.rows == ROWS and scenario.tenant == ""


@pytest.mark.parametrize("staging, fragment", [
    (Staging(workload="bursty"), f"unknown workload 'bursty'; known: {', '.join(WORKLOADS)}"),
    (Staging(with_faults=("skip_scurb",)), "with_faults names unknown faults ['skip_scurb']"),
])
def test_a_staging_that_names_nothing_known_is_refused(staging, fragment):
    with pytest.raises(ValueError, match="fault lost_epoch: ") as err:
        fault_scenario(Switch("lost_epoch", "I1", "lost epoch", "a page's epoch is not bumped", staging))
    assert fragment in str(err.value)
