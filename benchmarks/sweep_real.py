"""`sweep_accuracy.py --real`: `optlab sweep` run for real against queues whose capacity is
known, each level a real run (generator, validity verdict, Little's-law check and all).

The simulated levels of `sweep_accuracy.py` test the strategy alone; they never trip the
checks that judge a real level (the load generator's lag, Little's law, stability), which is
where real sweeps went wrong. Here every sweep is `optlab --db ... sweep EXP --slo p99=100ms
--quick --json` in a fresh process, on:

- M/M/1, M/M/4, M/M/8 in process: the synthetic target (exponential service, mean 10 ms,
  `servers` FCFS servers), Poisson arrivals; truth exact (Erlang C, `mmc_capacity`), checked
  here against an independent computation with scipy (Erlang C from Poisson pmf/cdf, the
  sojourn tail by numerical integration).
- M/D/1 over HTTP: the same queue with a fixed 10 ms service behind aiohttp in its own process
  (`python -m optlab.reference.synthetic`), measured as a `command` target; truth exact
  (Erlang's M/D/1 waiting-time formula, `md1_capacity`), checked against a simulation.

Each seed is the experiment's `workload.seed` (arrivals) and the target's `seed` knob (service
draws). Goal: within +-10% of the truth in >= 9 of 10 seeds per queue. The machine's load
average is printed before and after each sweep: a shared machine moves these figures.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from optlab.reference.queueing import (
    md1_capacity,
    mmc_capacity,
    simulated_capacity,
)

SLO_MS = 100.0
SERVICE_MS = 10.0
GOAL_WITHIN = 0.10
REPO = Path(__file__).resolve().parents[1]

IN_PROCESS = """\
name: {name}
description: M/M/{servers} in process, exponential {ms} ms
target: {{kind: builtin, name: synthetic}}
knobs: {{distribution: exponential, service_ms: {ms}, servers: {servers}, seed: {seed}}}
workload:
  load: {{mode: open, rate: 10, arrival: poisson}}
  seed: {workload_seed}
protocol: {{name: quick}}
"""

OVER_HTTP = """\
name: {name}
description: M/D/1 over HTTP, fixed {ms} ms
target:
  kind: command
  command: ["{{python}}", "-m", "optlab.reference.synthetic", "--port", "{port}",
            "--servers", "1", "--distribution", "fixed", "--service-ms", "{ms}"]
  url: "http://127.0.0.1:{port}/"
  health_url: "http://127.0.0.1:{port}/health"
knobs: {{seed: {seed}}}
workload:
  load: {{mode: open, rate: 10, arrival: poisson}}
  seed: {workload_seed}
protocol: {{name: quick}}
"""


@dataclass(frozen=True)
class RealQueue:
    name: str
    servers: int
    over_http: bool = False

    def truth(self) -> float:
        if self.over_http:
            return md1_capacity(SERVICE_MS / 1000, SLO_MS / 1000)
        return mmc_capacity(self.servers, 1000 / SERVICE_MS, SLO_MS / 1000)

    def check(self) -> str:
        """The truth computed another way."""
        if self.over_http:
            simulated = [
                simulated_capacity(1, "fixed", SERVICE_MS / 1000, 0.0, SLO_MS / 1000, seed=s)
                for s in range(3)
            ]
            return f"simulated (3 x 2,000 s) {sum(simulated) / 3:.2f}/s"
        tail = scipy_sojourn_sf(SLO_MS / 1000, self.servers, self.truth(), 1000 / SERVICE_MS)
        return f"scipy: P(sojourn > {SLO_MS:g} ms) at the truth = {tail:.5f} (0.01 wanted)"

    def experiment(self, folder: Path, seed: int) -> Path:
        name = f"{self.name.replace('/', '').lower()}-s{seed}"
        if self.over_http:
            text = OVER_HTTP.format(
                name=name, ms=SERVICE_MS, port=free_port(), seed=seed, workload_seed=seed + 1
            )
        else:
            text = IN_PROCESS.format(
                name=name, servers=self.servers, ms=SERVICE_MS, seed=seed, workload_seed=seed + 1
            )
        path = folder / f"{name}.yaml"
        path.write_text(text)
        return path


REAL_QUEUES = (
    RealQueue("M/M/1", 1),
    RealQueue("M/M/4", 4),
    RealQueue("M/M/8", 8),
    RealQueue("M/D/1-http", 1, over_http=True),
)


def scipy_sojourn_sf(t: float, servers: int, rate: float, mu: float) -> float:
    """P(T > t) in M/M/c from scipy alone: Erlang C from the Poisson pmf/cdf, then
    P(T > t) = (1 - C) e^{-mu t} + C P(W' + S > t), the second term integrated numerically."""
    from scipy import integrate, stats  # type: ignore[import-untyped]

    a = rate / mu
    top = stats.poisson.pmf(servers, a) * servers / (servers - a)
    erlang_c = top / (stats.poisson.cdf(servers - 1, a) + top)
    theta = servers * mu - rate
    # P(W' + S > t) = P(W' > t) + integral_0^t theta e^{-theta w} e^{-mu (t - w)} dw
    inner, _ = integrate.quad(lambda w: theta * math.exp(-theta * w - mu * (t - w)), 0.0, t)
    return float((1 - erlang_c) * math.exp(-mu * t) + erlang_c * (math.exp(-theta * t) + inner))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Outcome:
    capacity: float | None
    interval: tuple[float, float] | None
    limited_by: str | None
    levels: int
    agains: int
    measured_s: float
    wall_s: float
    load_before: float
    load_after: float


def sweep_once(path: Path, db: Path, timeout_s: float = 900.0) -> Outcome:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{db}", "sweep", str(path)]
    command += ["--slo", f"p99={SLO_MS:g}ms", "--quick", "--json"]
    before = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=timeout_s, cwd=path.parent
    )
    wall = time.monotonic() - started
    lines = done.stdout.strip().splitlines()
    if done.returncode not in (0, 1) or not lines:
        raise RuntimeError(f"sweep failed ({done.returncode}): {done.stderr[-2000:]}")
    document = json.loads(lines[-1])
    interval = document.get("capacity_interval")
    return Outcome(
        document.get("capacity_qps"),
        (interval[0], interval[1]) if interval else None,
        document.get("limited_by"),
        len(document["levels"]),
        sum(1 for lv in document["levels"] if lv.get("purpose") == "again"),
        float(document.get("measured_s") or 0.0),
        wall,
        before,
        os.getloadavg()[0],
    )


def run_real(seeds: int, names: list[str] | None, log=print) -> None:  # type: ignore[no-untyped-def]
    chosen = [q for q in REAL_QUEUES if names is None or q.name in names]
    log(
        f"# real levels: SLO P99 <= {SLO_MS:g} ms, service {SERVICE_MS:g} ms, quick protocol, "
        f"{seeds} seeds, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    summary = []
    with tempfile.TemporaryDirectory(prefix="sweep-real-") as tmp:
        folder = Path(tmp)
        for queue in chosen:
            truth = queue.truth()
            log(f"{queue.name}  truth {truth:.2f}/s ({queue.check()})")
            within = covered = 0
            for seed in range(seeds):
                path = queue.experiment(folder, seed)
                out = sweep_once(path, folder / f"{path.stem}.db")
                error = None if out.capacity is None else (out.capacity / truth - 1) * 100
                ok = error is not None and abs(error) <= GOAL_WITHIN * 100
                within += ok
                iv = out.interval
                covered += bool(iv and iv[0] <= truth <= iv[1])
                shown = "-" if error is None else f"{error:+6.1f}%"
                log(
                    f"  seed {seed}: {out.capacity or 0:8.1f}/s {shown} "
                    f"[{iv[0] if iv else 0:.1f}, {iv[1] if iv else 0:.1f}] "
                    f"limited by {out.limited_by}; {out.levels} levels ({out.agains} again), "
                    f"{out.measured_s:.0f} s measured, {out.wall_s:.0f} s wall; "
                    f"load {out.load_before:.2f} -> {out.load_after:.2f}"
                )
            need = math.ceil(0.9 * seeds)
            summary.append(
                f"{queue.name}: within +-10% in {within}/{seeds} (goal >= {need}), interval "
                f"covers the truth in {covered}/{seeds} " + ("PASS" if within >= need else "MISS")
            )
    log("# real levels, goals")
    for line in summary:
        log(line)
