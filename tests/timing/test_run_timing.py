"""Real-time figures of `optlab run` on the synthetic example's baseline (a lognormal service
time with a 2 ms median): how near the measured service P50 lands, and optlab's own share of the
median request (total minus service). tests/integration/test_run.py keeps the sides a busy
machine cannot move; these bounds are loose for a busy 2-core machine, and each message prints
the figures."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import Result

Invoke = Callable[..., Result]


def test_the_service_median_and_optlabs_share_of_the_request(synth: Path, invoke: Invoke) -> None:
    quick = ("--quick", "--duration", "1.5", "--warmup", "0.3", "--allow-invalid", "--json")
    result = invoke("run", str(synth / "baseline.yaml"), *quick)
    assert result.exit_code == 0, result.output
    latency = json.loads(result.stdout.strip().splitlines()[-1])["latency_ms"]
    service, total = latency["service"]["p50"], latency["total"]["p50"]
    assert service < 3.5, f"service P50 {service} ms for a 2 ms median"
    assert total - service < 0.5, f"optlab's share of the median: {total - service:.3f} ms"
