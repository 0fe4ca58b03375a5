"""`workload.load.hosts` as the file says it (optlab.config.modes), the per-node verdict
(optlab.run.pace.host_reasons) and the collector's per-node tallies beside the merge."""

from __future__ import annotations

import dataclasses
from array import array

import numpy as np
import pytest
from pydantic import ValidationError

from optlab.config.models import ClosedLoad, OpenLoad
from optlab.config.modes import mode_of
from optlab.config.modes.base import Hosts
from optlab.load.hosts import HostReport
from optlab.metrics.backlog import LoadTimeline
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.log import Collector
from optlab.metrics.stages import TOTAL
from optlab.metrics.windows import SourceTally
from optlab.metrics.worker_log import Buffers, InboxLog
from optlab.run.facts import HostFacts, RunFacts
from optlab.run.pace import host_reasons
from optlab.run.summarize import summarize
from optlab.run.validity import verdict
from tests.support.collected import collected, histogram

HOSTS = {"ray": "10.0.0.5:6379", "nodes": 3, "workers_per_node": 2}


def test_hosts_default_and_count_workers_and_stay_out_of_old_hashes() -> None:
    load = OpenLoad.model_validate({"mode": "open", "rate": 600, "hosts": HOSTS})
    assert load.hosts == Hosts(ray="10.0.0.5:6379", nodes=3, workers_per_node=2)
    assert load.hosts.cpus_per_worker == 1.0
    assert load.generators == 6
    dumped = load.model_dump(mode="json")
    assert dumped["hosts"]["nodes"] == 3 and "processes" not in dumped
    # A load without hosts dumps as it did before hosts existed: its stored hash holds.
    plain = OpenLoad.model_validate({"mode": "open", "rate": 600}).model_dump(mode="json")
    assert "hosts" not in plain and "processes" not in plain
    # A closed loop's clients are dealt out over every worker on every node.
    closed = ClosedLoad.model_validate({"mode": "closed", "concurrency": 13, "hosts": HOSTS})
    assert mode_of(closed).in_flight_per_process(closed) == 3


def test_a_sweep_level_keeps_the_hosts() -> None:
    load = OpenLoad.model_validate({"mode": "open", "rate": 600, "hosts": HOSTS})
    level = mode_of(load).at_level(900.0, like=load)
    assert isinstance(level, OpenLoad) and level.rate == 900 and level.hosts == load.hosts
    closed = mode_of(ClosedLoad(mode="closed", concurrency=1)).at_level(8, like=load)
    assert closed.hosts == load.hosts


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"processes": 2}, "with hosts, set hosts.workers_per_node instead of processes"),
        ({"hosts": {**HOSTS, "nodes": 0}}, "greater than or equal to 1"),
        ({"hosts": {**HOSTS, "ray": ""}}, "at least 1 character"),
        ({"hosts": {**HOSTS, "ray": "head-node"}}, "'head-node' is not a Ray address"),
        ({"hosts": {**HOSTS, "ray": "10.0.0.5:99999"}}, "is not a Ray address"),
        ({"hosts": {**HOSTS, "worker_per_node": 2}}, "Extra inputs are not permitted"),
        ({"hosts": {"nodes": 2}}, "Field required"),
    ],
)
def test_bad_hosts_are_refused_by_the_model(change: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        OpenLoad.model_validate({"mode": "open", "rate": 600, "hosts": HOSTS, **change})


# A good open-loop run at 900/s from three nodes, 600 s measured.
OPEN = RunFacts(
    requested_s=600,
    measured_s=600.2,
    completed=540_180,
    errors=0,
    max_error_rate=0.001,
    send_lag_p99_ms=0.3,
    max_send_lag_p99_ms=2.0,
    start_lag_p99_ms=0.1,
    total_p50_ms=4.0,
    first_half_qps=900.0,
    second_half_qps=900.0,
    stability_tolerance=0.10,
    throttled=False,
    interrupted=False,
    open_loop=True,
    in_process=False,
    intended_qps=900.0,
    completed_qps=900.0,
    total_p99_ms=20.0,
)


def node(name: str = "node-b", **changes: object) -> HostFacts:
    fields: dict[str, object] = {
        "node": name,
        "host": "client-2",
        "share": 1 / 3,
        "completed": round(300 * OPEN.measured_s),
        "errors": 0,
        "send_lag_p99_ms": 0.4,
        "send_lag_p99_low_ms": 0.35,
    }
    return HostFacts(**(fields | changes))  # type: ignore[arg-type]


def test_a_node_that_kept_its_share_has_no_reason() -> None:
    assert host_reasons(OPEN, node()) == []
    assert verdict(dataclasses.replace(OPEN, hosts=(node("node-a"), node()))).valid


def test_a_node_behind_its_schedule_is_named_with_its_cpus() -> None:
    late = node(
        send_lag_p99_ms=15.0,
        send_lag_p99_low_ms=14.0,
        node_cpu_pct=97.0,
        steal_pct=4.0,
        neighbours=({"pid": 4242, "name": "stress-ng", "cpu_pct": 180.0},),
    )
    (reason,) = host_reasons(OPEN, late)
    assert reason.code == "node-behind"
    assert "the busiest other process stress-ng (pid 4242) at 180%" in reason.text
    assert reason.text.startswith("node-b (client-2) fell behind its schedule (send-lag P99 15.0")
    assert "while its CPUs were 97% busy (4% stolen by the hypervisor)" in reason.text
    # Judged against ITS gap between sends (3 ms at 300/s), not the run's 1.1 ms.
    assert "the mean 3.33 ms between sends" in reason.text
    judged = verdict(dataclasses.replace(OPEN, hosts=(node("node-a"), late)))
    assert not judged.valid and reason.text in judged.reasons


def test_a_node_that_sent_its_share_short_is_named() -> None:
    short = node(completed=round(200 * OPEN.measured_s))
    (reason,) = host_reasons(OPEN, short)
    assert reason.code == "node-behind" and "of the 300.0/s its share" in reason.text


def test_a_lost_node_is_named_with_when() -> None:
    lost = node(lost="ActorDiedError: the actor died", lost_at_s=31.5, completed=9_000)
    reasons = host_reasons(OPEN, lost)
    assert reasons[0].code == "node-lost"
    assert reasons[0].text == (
        "node-b (client-2) was lost 31.5 s into the load (ActorDiedError: the actor died); "
        "the run keeps what it sent before"
    )
    assert len(reasons) == 1  # its shortfall is the loss's, not a second reason


def _buffers(ends: list[int], totals: list[int]) -> Buffers:
    buf = Buffers()
    buf.end = array("q", ends)
    buf.total = array("q", totals)
    buf.send_lag = array("q", [1_000] * len(ends))
    buf.start_lag = array("q", [2_000] * len(ends))
    return buf


def test_each_source_is_tallied_beside_the_merge_count_for_count() -> None:
    rng = np.random.default_rng(3)
    collector = Collector()
    collector.set_phase("warmup", 0)
    collector.set_phase("measure", 5_000_000_000)
    inboxes = {name: InboxLog() for name in ("node-a", "node-b")}
    for name, inbox in inboxes.items():
        collector.new_log(inbox, source=name)
    for inbox in inboxes.values():
        ends = np.sort(rng.integers(0, 10_000_000_000, 500)).tolist()
        inbox.put(_buffers(ends, rng.integers(100_000, 90_000_000, 500).tolist()))
        errors = Buffers()
        errors.errors = [(6_000_000_000, "timeout", None), (1_000_000_000, "timeout", None)]
        inbox.put(errors)
    collector.drain()
    collector.finish()
    for phase in ("warmup", "measure"):
        merged = collector.histograms(phase)["total"]
        tallies = collector.source_tallies(phase)
        summed = LatencyHistogram()
        for tally in tallies.values():
            summed.merge(tally.total)
            assert tally.errors == 1
        assert np.array_equal(summed.counts, merged.counts)
        assert sum(t.ok for t in tallies.values()) == collector.totals(phase)[0] == merged.count


def test_shifting_buffers_moves_instants_not_durations() -> None:
    buf = _buffers([1_000, 2_000], [500, 600])
    buf.errors = [(1_500, "timeout", None)]
    buf.shift(-12_100_000_000)
    assert list(buf.end) == [1_000 - 12_100_000_000, 2_000 - 12_100_000_000]
    assert list(buf.total) == [500, 600] and buf.errors[0][0] == 1_500 - 12_100_000_000


def _host(in_flight: list[int]) -> HostReport:
    timeline = LoadTimeline()
    for second, count in enumerate(in_flight):
        timeline.mark(second * 1_000_000_000 + 999_000_000, 300 * (second + 1), count)
    return HostReport(
        node="node-a", node_id="n" * 56, host="client-1", ip="10.0.0.7", workers=1,
        offset_ms=0.02, offset_bound_ms=0.3, round_trip_ms=0.6, consistent=True,
        issued=9000, completed=9000, first_send_lag_ms=0.05, cpu_s=0.3, timeline=timeline,
    )  # fmt: skip


def _node_run(in_flight: list[int]) -> dict[str, object]:
    # 30 s at 300/s, 10 ms each: L = 3 by Little's law.
    tally = SourceTally(ok=9000, total=histogram([10.0] * 9000))
    load = OpenLoad.model_validate({"mode": "open", "rate": 300, "hosts": {**HOSTS, "nodes": 1}})
    done = summarize(
        collected(
            load=load,
            completed=9000,
            measured_s=30.0,
            histograms={TOTAL: histogram([10.0] * 9000)},
            window_qps=(300.0,) * 30,
            hosts=(_host(in_flight),),
            host_tallies={"node-a": tally},
            measure_start_ns=0,
        )
    )
    summary = done.summary.to_json()
    return {"host": summary["hosts"][0], "notes": summary["notes"]}


def test_littles_law_per_node_tells_requests_held_back_from_honest_ones() -> None:
    honest = _node_run([3, 2, 4, 3, 3, 2, 4, 3, 3, 3] * 3)
    assert abs(honest["host"]["littles_law_gap"]) < 0.05  # type: ignore[index]
    assert not any("Little's law" in n for n in honest["notes"])  # type: ignore[attr-defined]
    held = _node_run([1] * 30)
    assert held["host"]["littles_law_gap"] == pytest.approx(-2 / 3, abs=0.01)  # type: ignore[index]
    assert any(
        n.startswith("node-a (client-1): Little's law is off by -67%")
        for n in held["notes"]  # type: ignore[attr-defined]
    )
