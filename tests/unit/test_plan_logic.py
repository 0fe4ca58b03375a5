"""The one-variable rule's pure part: config differences by path, grouped into variables
(no store)."""

from __future__ import annotations

from optlab.chain.plan import group_by_variable
from optlab.config.diff import diff_values


def test_diff_values_and_grouping() -> None:
    old = {"precision": "fp32", "batching": {"mode": "off"}, "threads": 2}
    new = {"precision": "fp16", "batching": {"mode": "dynamic", "max_batch_size": 8}, "threads": 2}
    paths = [c.path for c in diff_values(old, new)]
    assert paths == ["precision", "batching.mode", "batching.max_batch_size"]
    groups = group_by_variable(old, new)
    assert [g.name for g in groups] == ["precision", "batching"]
    assert len(groups[1].fields) == 2  # a group's fields change together as one variable
    assert diff_values({"a": 1}, {"a": 1.0}) != []  # type changes are changes
