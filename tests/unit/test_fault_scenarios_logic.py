"""The fault scenarios' configs (optlab.reference.fault_scenarios): each names its factory and
varies with its seed; scenarios are picked by name (nothing is built or run)."""

from __future__ import annotations

import pytest

from optlab.reference.fault_scenarios import SCENARIOS, by_name


def test_configs_name_the_factory_and_vary_with_the_seed() -> None:
    for scenario in SCENARIOS:
        first, second = scenario.config(0), scenario.config(1)
        assert first["target"] == {"kind": "python", "factory": scenario.reference}
        assert first["name"] != second["name"] and first["knobs"]["seed"] == 0
    assert by_name("lock,healthy") == [by_name()[2], by_name()[-1]]
    with pytest.raises(ValueError, match="unknown scenario"):
        by_name("lock,nope")
