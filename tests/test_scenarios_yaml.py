"""The YAML scenarios in tests/scenarios run and meet their expectations."""

from pathlib import Path

import pytest

from phalanx.spec.scenario import load_scenario, run_scenario

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenario(path):
    failures = run_scenario(load_scenario(path))
    assert not failures, "\n".join(failures)


def test_there_are_scenarios():
    assert len(SCENARIOS) >= 4
