"""How close `optlab sweep --slo ttft_p99=...,tpot_p99=...` comes to the token streamer's
simulated capacity under token SLOs.

The streamer (`optlab.reference.streamer`): 16 slots, a decode step of 2 ms + 0.25 ms per
running sequence, 0.05 ms of prefill per input token, 32 input and 16 output tokens per
request; SLO TTFT P99 <= 40 ms and TPOT P99 <= 6 ms. The TRUTH is the highest Poisson rate
whose simulated P99s meet both bounds (`optlab.reference.llm_queueing.token_capacity`:
bisection to 0.2%, 20,000 requests, mean of 3 seeds).

- default (simulated levels): the sweep's strategy (`optlab.sweep.strategy`: `next_probe` /
  `conclude`) driven with levels simulated by the same model for exactly the time the driver
  would measure them (quick protocol: 1 s warmup, then max(5 s x duration_factor, 730 / rate)),
  each level's value and its standard error computed from the simulated streams as a real
  level's are (`optlab.sweep.levels`: the binding bound's share, its per-second P99 spread).
  Seconds per seed.
- `--real`: `optlab sweep` itself against a streamer process (open loop, quick protocol), each
  level a real run judged by every check a user's is; about 4 minutes a seed on 2 cores
  (`--level-duration 60`: 21 minutes).
- `--model-check RATE`: how far the real streamer is from its own model at RATE: `optlab run`
  drives it (Poisson, 120 s), and the server's own log (`GET /truth`) is set beside the model
  simulated on the SAME arrivals, TTFT and TPOT P50/P99 from each. The truth above is the
  model's; where the real server's tail runs above its model, the capacity a real sweep finds
  is below the simulated truth by as much, whatever the client.

Goal: capacity within +-5% of the truth in >= 19 of 20 seeds. A measurement, not a test:
PASS/MISS is printed and the exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/llm_capacity.py [--seeds 20] [--real]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from optlab.config.slo import parse_slo
from optlab.reference.llm_queueing import SimRequest, saturation_rate, simulate, token_capacity
from optlab.reference.streamer import StreamerKnobs
from optlab.sweep.strategy import Level, Probe, Settings, conclude, next_probe

REPO = Path(__file__).resolve().parents[1]
KNOBS = StreamerKnobs(
    slots=16, decode_base_ms=2.0, decode_per_seq_ms=0.25, prefill_ms_per_token=0.05
)
INPUT_TOKENS, OUTPUT_TOKENS = 32, 16
TTFT_MS, TPOT_MS = 40.0, 6.0
SLO = f"ttft_p99={TTFT_MS:g}ms,tpot_p99={TPOT_MS:g}ms"
WARMUP_S, BASE_MEASURE_S, MIN_REQUESTS = 1.0, 5.0, 730  # the quick protocol's
FULL_WARMUP_S, FULL_MEASURE_S, FULL_MAX_LEVEL_S = 30.0, 600.0, 900.0  # the full protocol's
WITHIN, GOAL = 0.05, 19  # of 20


def truth() -> tuple[float, list[float]]:
    found = [
        token_capacity(
            KNOBS, ttft_p99_ms=TTFT_MS, tpot_p99_ms=TPOT_MS, input_tokens=INPUT_TOKENS,
            max_tokens=OUTPUT_TOKENS, requests=20_000, seed=seed,
        )
        for seed in range(3)
    ]  # fmt: skip
    values = [v for v in found if v is not None]
    return float(np.mean(values)), values


def simulated_level(
    probe: Probe, rng: np.random.Generator, base_s: float, full: bool = False
) -> Level:
    """A level as the driver measures it: Poisson arrivals at the probe's rate, or (the
    sweep's first probe) one closed-loop client sending each request as the last ends."""
    if probe.mode == "closed":
        assert probe.load == 1, "an open sweep's only closed probe is its one client"
        alone = simulate(KNOBS, [SimRequest(0.0, INPUT_TOKENS, OUTPUT_TOKENS)]).streams[0]
        rate = 1e9 / alone.end_ns
    else:
        rate = probe.load
    # The driver's cap on a level (sweep/driver.py): the full protocol's longest run, else
    # 12 base lengths (at least 60 s).
    cap = FULL_MAX_LEVEL_S if full else max(base_s * 12, 60.0)
    measured = min(max(base_s * probe.duration_factor, MIN_REQUESTS / rate), cap)
    warmup = FULL_WARMUP_S if full else WARMUP_S
    end = warmup + measured
    if probe.mode == "closed":
        arrivals = np.arange(0.0, end, 1.0 / rate)
    else:
        arrivals = np.sort(rng.uniform(0.0, end, rng.poisson(rate * end)))
    requests = [SimRequest(float(t), INPUT_TOKENS, OUTPUT_TOKENS) for t in arrivals]
    streams = simulate(KNOBS, requests).streams
    ends = np.array([s.end_ns / 1e9 for s in streams])
    kept = [s for s, e in zip(streams, ends, strict=True) if warmup <= e < end]
    ttft = np.array([(s.events[0][0] - s.intended_ns) / 1e6 for s in kept])
    tpot = np.array([(s.end_ns - s.events[0][0]) / 1e6 / (OUTPUT_TOKENS - 1) for s in kept])
    e2e = np.array([(s.end_ns - s.intended_ns) / 1e6 for s in kept])
    second = np.array([int(s.end_ns / 1e9 - warmup) for s in kept])
    shares = {"ttft": np.percentile(ttft, 99) / TTFT_MS, "tpot": np.percentile(tpot, 99) / TPOT_MS}
    binding = max(shares, key=lambda k: shares[k])
    series = ttft if binding == "ttft" else tpot
    per_second = [
        float(np.percentile(series[second == k], 99))
        for k in range(int(measured))
        if np.sum(second == k) >= 5
    ]
    value = max(shares.values()) * TTFT_MS
    se = None
    if len(per_second) >= 3 and np.mean(per_second) > 0:
        relative = float(np.std(per_second, ddof=1) / np.mean(per_second))
        se = relative / math.sqrt(len(per_second)) * value
    completed = len(kept)
    return Level(
        probe.mode, probe.load, completed / measured, float(np.percentile(e2e, 50)), value, se, 0.0,
        completed >= 662, measured_s=end, duration_s=measured,
        p99_ms=float(np.percentile(e2e, 99)), purpose=probe.purpose,
    )  # fmt: skip


def simulated_sweep(
    seed: int, base_s: float, tolerance: float, full: bool
) -> tuple[float | None, float]:
    rng = np.random.default_rng([seed, 23])
    settings = Settings("open", parse_slo(SLO), tolerance=tolerance)
    levels: list[Level] = []
    while (probe := next_probe(levels, settings)) is not None:
        levels.append(simulated_level(probe, rng, base_s, full))
    return conclude(levels, settings).capacity_qps, sum(lv.measured_s for lv in levels)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src")}


@contextmanager
def streamer() -> Iterator[int]:
    """A streamer process with KNOBS on a free port, for the block; yields the port."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in KNOBS.model_dump().items()
             if v is not None and k != "fault"]  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "optlab.reference.streamer", "--port", str(port), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), start_new_session=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "listening on ..."
        yield port
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=10)


def _experiment(folder: Path, name: str, port: int, rate: float, protocol: str, seed: int) -> Path:
    """An open-loop Poisson experiment on the streamer at `port`, the benchmark's prompts."""
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        f'target: {{kind: openai, url: "http://127.0.0.1:{port}/v1", model: optlab-streamer,'
        " ignore_eos: true, code_version: streamer}\n"
        "workload:\n"
        f"  load: {{mode: open, rate: {rate:g}, arrival: poisson, max_in_flight: 512}}\n"
        f"  prompts: {{input_tokens: {INPUT_TOKENS}, output_tokens: {OUTPUT_TOKENS}}}\n"
        f"  seed: {seed}\n"
        f"protocol: {protocol}\n"
    )
    return path


def real_sweep(
    seed: int, folder: Path, base_s: float, tolerance: float
) -> tuple[float | None, float]:
    """`optlab sweep` against a streamer process; (capacity, wall seconds)."""
    with streamer() as port:
        experiment = _experiment(folder, f"llm-capacity-{seed}", port, 10, "{name: full}", seed)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "optlab", "--db", f"sqlite:///{folder}/capacity.db", "sweep",
             str(experiment), "--slo", SLO, "--quick", "--json", "--level-duration",
             f"{base_s:g}", "--tolerance", f"{tolerance:.1%}"],
            capture_output=True, text=True, env=_env(), check=False, timeout=1800,
        )  # fmt: skip
        seconds = time.monotonic() - started
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode not in (0, 3) or not lines:
            print(f"  seed {seed}: sweep exit {done.returncode}: {done.stderr[-400:]}")
            return None, seconds
        return json.loads(lines[-1]).get("capacity_qps"), seconds


def model_check(rate: float, folder: Path, seconds: float = 120.0) -> None:
    """The streamer's own log against its model on the same arrivals (see the docstring)."""
    import urllib.request

    from optlab.reference.llm_queueing import SimRequest, simulate

    with streamer() as port:
        protocol = f"{{name: quick, warmup_s: 1, duration_s: {seconds:g}}}"
        experiment = _experiment(folder, "llm-model-check", port, rate, protocol, 0)
        done = subprocess.run(
            [sys.executable, "-m", "optlab", "--db", f"sqlite:///{folder}/check.db", "run",
             str(experiment), "--allow-invalid", "--json"],
            capture_output=True, text=True, env=_env(), check=False, timeout=seconds + 300,
        )  # fmt: skip
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        client = json.loads(lines[-1])["llm"] if lines else None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/truth", timeout=60) as response:
            logged = sorted(json.load(response), key=lambda r: r["arrived_ns"])
    origin = logged[0]["arrived_ns"]
    requests = [
        SimRequest((r["arrived_ns"] - origin) / 1e9, r["input_tokens"], r["output_tokens"])
        for r in logged
    ]
    model = simulate(KNOBS, requests).streams

    def figures(ttft: list[float], tpot: list[float]) -> str:
        return (
            f"TTFT P50 {np.percentile(ttft, 50):6.2f} P99 {np.percentile(ttft, 99):6.2f} ms; "
            f"TPOT P50 {np.percentile(tpot, 50):5.3f} P99 {np.percentile(tpot, 99):5.3f} ms"
        )

    n = OUTPUT_TOKENS - 1
    server_ttft = [(r["events"][0][0] - r["arrived_ns"]) / 1e6 for r in logged]
    server_tpot = [(r["events"][-1][0] - r["events"][0][0]) / 1e6 / n for r in logged]
    model_ttft = [(s.events[0][0] - s.intended_ns) / 1e6 for s in model]
    model_tpot = [(s.events[-1][0] - s.events[0][0]) / 1e6 / n for s in model]
    achieved = len(logged) / ((logged[-1]["arrived_ns"] - origin) / 1e9)
    print(f"# model check at {rate:g}/s offered ({achieved:.2f}/s came, {len(logged)} requests)")
    print(f"server log: {figures(server_ttft, server_tpot)}")
    print(f"model     : {figures(model_ttft, model_tpot)}")
    if client is not None:  # the measured phase only (the log has the warmup too)
        print(
            f"optlab run: TTFT P50 {client['ttft_ms']['p50']:6.2f} P99 "
            f"{client['ttft_ms']['p99']:6.2f} ms; TPOT P50 {client['tpot_ms']['p50']:5.3f} "
            f"P99 {client['tpot_ms']['p99']:5.3f} ms (E2E - TTFT)/(n - 1)"
        )
    ratio = np.percentile(server_tpot, 99) / np.percentile(model_tpot, 99)
    print(f"server / model TPOT P99: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--real", action="store_true", help="real sweeps (minutes each)")
    parser.add_argument(
        "--level-duration", type=float, default=BASE_MEASURE_S, help="as optlab sweep's (s)"
    )
    parser.add_argument("--tolerance", type=float, default=0.05, help="as optlab sweep's")
    parser.add_argument(
        "--full", action="store_true", help="simulated levels of the full protocol (600 s)"
    )
    parser.add_argument(
        "--model-check", type=float, default=None, metavar="RATE",
        help="the real streamer's own log against its model at RATE (s), then exit",
    )  # fmt: skip
    args = parser.parse_args()
    if args.model_check is not None:
        with tempfile.TemporaryDirectory() as folder:
            model_check(args.model_check, Path(folder))
        return
    expected, seeds = truth()
    base = FULL_MEASURE_S if args.full else args.level_duration
    top = saturation_rate(KNOBS, INPUT_TOKENS, OUTPUT_TOKENS)
    print(
        f"# llm_capacity ({'real' if args.real else 'simulated'} levels): SLO {SLO}; truth "
        f"{expected:.2f}/s (seeds {', '.join(f'{v:.2f}' for v in seeds)}), saturation "
        f"{top:.1f}/s; {'full' if args.full else '--quick'} --level-duration {base:g} "
        f"--tolerance {args.tolerance:.1%}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    found: list[float | None] = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in range(args.seeds):
            if args.real:
                capacity, seconds = real_sweep(seed, Path(folder), base, args.tolerance)
            else:
                capacity, seconds = simulated_sweep(seed, base, args.tolerance, args.full)
            found.append(capacity)
            error = (capacity / expected - 1) * 100 if capacity else math.nan
            print(f"seed {seed:2d}: capacity {capacity or 0:7.2f}/s  {error:+6.1f}%  "
                  f"{seconds:6.0f} s {'measured' if not args.real else 'wall'}")  # fmt: skip
    within = sum(1 for c in found if c and abs(c / expected - 1) <= WITHIN)
    worst = max((abs(c / expected - 1) for c in found if c), default=math.nan) * 100
    verdict = "PASS" if within >= GOAL * len(found) / 20 else "MISS"
    print(
        f"within +-{WITHIN:.0%}: {within}/{len(found)} (goal {GOAL}/20); worst {worst:.1f}%; "
        f"no capacity: {sum(1 for c in found if not c)}  {verdict}"
    )


if __name__ == "__main__":
    main()
