"""The one SLO type (optlab.config.slo): parsed from `--slo`, its own JSON shape, and the one
rule for whether two SLOs are the same."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from optlab.config.slo import Slo, parse_slo
from optlab.errors import OptlabError


@pytest.mark.parametrize(
    ("text", "percentile", "ms"),
    [
        ("p99=60ms", "p99", 60.0),
        ("P95 = 0.2s", "p95", 200.0),
        ("p50=1500us", "p50", 1.5),
        ("p999=60", "p99.9", 60.0),
        ("p99.9=60ms", "p99.9", 60.0),
    ],
)
def test_an_slo_is_parsed_to_its_canonical_form(text: str, percentile: str, ms: float) -> None:
    slo = parse_slo(text)
    assert slo.percentile == percentile and slo.ms == pytest.approx(ms, rel=1e-12)
    assert parse_slo(slo.key).same_as(slo)


@pytest.mark.parametrize("text", ["p99", "p98=60ms", "p99=60h", "p99=0ms", "fast"])
def test_what_is_not_an_slo_is_refused_with_the_forms(text: str) -> None:
    with pytest.raises(OptlabError):
        parse_slo(text)


def test_the_slo_is_its_own_json_and_names_its_percentile() -> None:
    slo = Slo("p99.9", 60.0)
    assert slo == Slo(percentile="p99.9", ms=60.0)
    assert slo.model_dump(mode="json") == {"percentile": "p99.9", "ms": 60.0}
    assert Slo.model_validate({"percentile": "p99.9", "ms": 60}) == slo
    assert (slo.field, slo.label, slo.key) == ("p999", "P99.9 ≤ 60 ms", "p99.9=60ms")
    assert len({slo, Slo("p99.9", 60.0)}) == 1  # hashable, frozen
    for bad in ({"percentile": "p98", "ms": 60.0}, {"percentile": "p99", "ms": 0.0}):
        with pytest.raises(ValidationError):
            Slo.model_validate(bad)


def test_two_slos_are_the_same_when_percentile_and_bound_agree() -> None:
    slo = Slo("p99", 60.0)
    assert slo.same_as(Slo("p99", 60.0 * (1 + 1e-12)))  # a bound read back from a float column
    assert not slo.same_as(Slo("p99", 61.0))
    assert not slo.same_as(Slo("p95", 60.0))
