"""How close optlab's streaming figures come to the truth: the token streamer
(`optlab.reference.streamer`, 128 output tokens, a 20 ms decode step) driven by optlab's own
client (`optlab.targets.http_client` with its SSE reader, what `optlab run` drives, on uvloop),
each request's events compared with the times the server wrote them (`GET /truth`), and with
the streamer's model simulated (`optlab.reference.llm_queueing`).

Scenarios (`--scenario`, default all):

- `closed`: 1, 8 and 32 concurrent streams; client TTFT (from its write) against the server's
  (first event's write minus the request's arrival) and per-token ITL, P50 and P99 each, within
  max(1 ms, 3%); output tokens equal the server's, request by request.
- `open`: Poisson arrivals at 70% of the simulated saturation (32 slots); TTFT from the
  intended send against the server's first write minus the same intended time.
- `chunked`: 4 tokens per event at 8 streams; the run's tokens per event, and each ITL
  convention (per-event gap, per-token split, per-request mean) within 3% of its own truth.
- `stall`: a 500 ms stall every 5 s at 70% load, open loop: TTFT P99 from the intended send
  within 5% of the simulation's, the actual-send figure beside it.
- `cap1`: `optlab run` itself, a 500 ms answer (25 tokens x 20 ms, 1 slot) asked for at 10/s
  with at most 1 request in flight: the run's E2E P50/P99 from the schedule against the
  queue's arithmetic (request k ends at 500 (k + 1) ms, was due at 100 k), and the client's
  own wait as its own series.

A measurement, not a test: PASS/MISS is printed and the exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/llm_accuracy.py [--runs 3] [--scenario closed]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from optlab.metrics.llm import StreamTiming, figures
from optlab.metrics.stages import RequestTiming
from optlab.metrics.stats import percentile
from optlab.reference.llm_queueing import SimRequest, saturation_rate, simulate
from optlab.reference.streamer import StreamerKnobs
from optlab.targets.http_client import HttpClient, StreamSpec
from optlab.targets.http_wire import Body, HttpSpec

REPO = Path(__file__).resolve().parents[1]
OUTPUT_TOKENS = 128
INPUT_TOKENS = 32
DECODE_MS = 20.0
LEVELS = (1, 8, 32)
ABS_MS, REL = 1.0, 0.03
SCENARIOS = ("closed", "open", "chunked", "stall", "cap1")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_streamer(port: int, knobs: StreamerKnobs) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-m", "optlab.reference.streamer", "--port", str(port)]
    for name, value in knobs.model_dump(exclude_defaults=True).items():
        command += ["--" + name.replace("_", "-"), str(value)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()
    if "listening" not in line:
        server.kill()
        raise RuntimeError(f"the streamer did not start: {line!r}")
    return server


def get(base: str, path: str, method: str = "GET") -> Any:
    request = urllib.request.Request(
        base + path, method=method, data=b"" if method == "POST" else None
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def client_for(base: str, keys: Sequence[str], connections: int) -> HttpClient:
    """optlab's client with one body per key (its `user`), each sent once."""
    bodies = [
        Body(
            json.dumps(
                {
                    "model": "optlab-streamer",
                    "prompt": "tell me " * (INPUT_TOKENS // 2),
                    "max_tokens": OUTPUT_TOKENS,
                    "stream": True,
                    "user": key,
                }
            ).encode(),
            "application/json",
        )
        for key in keys
    ]
    spec = HttpSpec(
        url=f"{base}/v1/completions",
        method="POST",
        headers=(),
        ok_status=None,
        connect_timeout_s=5.0,
        timeout_s=120.0,
        connections=connections,
    )
    n = len(keys)
    stream = StreamSpec("words", (OUTPUT_TOKENS,) * n, (INPUT_TOKENS,) * n, exact=True)
    return HttpClient(spec, bodies, stream)


async def closed(base: str, clients: int, keys: list[str]) -> dict[str, StreamTiming]:
    client = client_for(base, keys, clients)
    await client.open()
    found: dict[str, StreamTiming] = {}
    order = iter(range(len(keys)))

    async def worker() -> None:
        for index in order:
            timing = RequestTiming()
            await client.send(index, timing)
            found[keys[index]] = timing.stream

    try:
        await asyncio.gather(*(worker() for _ in range(clients)))
    finally:
        await client.close()
    return found


async def open_loop(
    base: str, offsets_s: Sequence[float], keys: list[str]
) -> tuple[dict[str, StreamTiming], int]:
    """Each request sent at its intended time (t0 + offset); its stream's origin is that time.
    Returns the streams and t0 (perf_counter_ns, the monotonic clock the server stamps on)."""
    client = client_for(base, keys, connections=4096)
    await client.open()
    found: dict[str, StreamTiming] = {}
    t0 = time.perf_counter_ns() + 50_000_000

    async def one(index: int, intended: int) -> None:
        timing = RequestTiming()
        await client.send(index, timing)
        stream = timing.stream
        found[keys[index]] = StreamTiming(
            intended, stream.sent_ns, stream.events, stream.end_ns, stream.total_tokens
        )

    tasks = []
    try:
        for index, offset in enumerate(offsets_s):
            intended = t0 + round(offset * 1e9)
            wait = (intended - time.perf_counter_ns()) / 1e9
            if wait > 0.002:
                await asyncio.sleep(wait - 0.001)
            while time.perf_counter_ns() < intended:
                await asyncio.sleep(0)
            tasks.append(asyncio.create_task(one(index, intended)))
        await asyncio.gather(*tasks)
    finally:
        await client.close()
    return found, t0


def run_loop(coroutine: Any) -> Any:
    """On uvloop where it is installed, as `optlab run`'s load generator is."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def server_stream(record: dict[str, Any], origin: int | None = None) -> StreamTiming:
    events = tuple((t, n) for t, n in record["events"])
    start = record["arrived_ns"] if origin is None else origin
    return StreamTiming(start, record["arrived_ns"], events, record["end_ns"])


def within(measured: float | None, true: float | None, rel: float = REL) -> bool:
    if measured is None or true is None:
        return False
    return abs(measured - true) <= max(ABS_MS, rel * true)


def pairs(client: dict[str, StreamTiming], server: dict[str, Any], from_intended: bool) -> dict:
    """Each definition's (client, truth) P50 and P99, and whether token counts are equal."""
    mine = figures(client.values())
    truth = figures(
        server_stream(server[key], stream.intended_ns if from_intended else None)
        for key, stream in client.items()
    )
    tokens_equal = all(
        stream.tokens == server[key]["output_tokens"] == OUTPUT_TOKENS
        for key, stream in client.items()
    )
    ttft_mine = mine.ttft_ms if from_intended else mine.ttft_sent_ms
    out: dict[str, Any] = {"tokens_equal": tokens_equal}
    for name, a, b in (
        ("ttft", ttft_mine, truth.ttft_ms),
        ("itl", mine.itl_token_split_ms, truth.itl_token_split_ms),
    ):
        for q in (50, 99):
            out[f"{name}_p{q}"] = (percentile(a, q), percentile(b, q))
    return out


def report(label: str, found: dict[str, Any]) -> bool:
    keys = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
    ok = found["tokens_equal"] and all(within(*found[k]) for k in keys)
    cells = "  ".join(f"{k} {found[k][0]:7.2f}/{found[k][1]:7.2f}" for k in keys)
    print(f"{label}  client/server ms: {cells}  tokens equal {found['tokens_equal']}  "
          f"{'ok' if ok else 'MISS'}")  # fmt: skip
    return ok


def scenario_closed(run: int, requests: int) -> dict[str, bool]:
    port = free_port()
    server = start_streamer(port, StreamerKnobs(slots=max(LEVELS), decode_base_ms=DECODE_MS))
    base = f"http://127.0.0.1:{port}"
    results = {}
    try:
        for clients in LEVELS:
            get(base, "/truth/reset", "POST")
            keys = [f"{run}-{clients}-{k}" for k in range(requests)]
            client = run_loop(closed(base, clients, keys))
            logged = {r["id"]: r for r in get(base, "/truth")}
            results[f"c={clients}"] = report(
                f"run {run} c={clients:>2}", pairs(client, logged, False)
            )
    finally:
        server.terminate()
        server.wait(10)
    return results


def poisson(rate: float, n: int, seed: int) -> list[float]:
    return [float(t) for t in np.cumsum(np.random.default_rng(seed).exponential(1 / rate, n))]


def scenario_open(run: int, requests: int) -> dict[str, bool]:
    knobs = StreamerKnobs(slots=32, decode_base_ms=DECODE_MS)
    rate = 0.7 * saturation_rate(knobs, INPUT_TOKENS, OUTPUT_TOKENS)
    port = free_port()
    server = start_streamer(port, knobs)
    base = f"http://127.0.0.1:{port}"
    try:
        keys = [f"open-{run}-{k}" for k in range(requests)]
        client, _ = run_loop(open_loop(base, poisson(rate, requests, run), keys))
        logged = {r["id"]: r for r in get(base, "/truth")}
    finally:
        server.terminate()
        server.wait(10)
    label = f"run {run} open {rate:.2f}/s"
    return {"open": report(label, pairs(client, logged, True))}


def scenario_chunked(run: int, requests: int) -> dict[str, bool]:
    knobs = StreamerKnobs(slots=8, decode_base_ms=DECODE_MS, tokens_per_event=4)
    port = free_port()
    server = start_streamer(port, knobs)
    base = f"http://127.0.0.1:{port}"
    try:
        keys = [f"chunk-{run}-{k}" for k in range(requests)]
        client = run_loop(closed(base, 8, keys))
        logged = {r["id"]: r for r in get(base, "/truth")}
    finally:
        server.terminate()
        server.wait(10)
    mine = figures(client.values())
    truth = figures(server_stream(logged[key]) for key in client)
    ok = mine.tokens_per_event == 4.0
    cells = [f"tokens/event {mine.tokens_per_event:.1f}"]
    for name in ("itl_event_gap_ms", "itl_token_split_ms", "itl_request_mean_ms"):
        for q in (50, 99):
            a, b = percentile(getattr(mine, name), q), percentile(getattr(truth, name), q)
            good = a is not None and b is not None and abs(a - b) <= 0.03 * b
            ok &= good
            cells.append(f"{name.removesuffix('_ms')} p{q} {a:.2f}/{b:.2f}")
    print(f"run {run} chunked: " + "  ".join(cells) + f"  {'ok' if ok else 'MISS'}")
    return {"chunked": ok}


def scenario_stall(run: int, requests: int) -> dict[str, bool]:
    knobs = StreamerKnobs(slots=32, decode_base_ms=DECODE_MS, stall_every_s=5.0, stall_ms=500.0)
    rate = 0.7 * saturation_rate(knobs, INPUT_TOKENS, OUTPUT_TOKENS)
    port = free_port()
    server = start_streamer(port, knobs)
    base = f"http://127.0.0.1:{port}"
    offsets = poisson(rate, requests, 100 + run)
    try:
        keys = [f"stall-{run}-{k}" for k in range(requests)]
        client, t0 = run_loop(open_loop(base, offsets, keys))
        started = get(base, "/engine")["started_ns"]
        logged = {r["id"]: r for r in get(base, "/truth")}
    finally:
        server.terminate()
        server.wait(10)
    # The model given the arrivals the server saw (the client's first connection made the
    # first one ~10 ms late, which sets the engine's step grid), its stalls on its own clock.
    arrived = sorted((logged[key]["arrived_ns"] - t0) / 1e9 for key in keys)
    simulated = simulate(
        knobs,
        [SimRequest(t, INPUT_TOKENS, OUTPUT_TOKENS) for t in arrived],
        stall_origin_s=(started - t0) / 1e9,
    )
    truth = simulated.percentiles(99.0)["ttft"]
    mine = figures(client.values())
    p99, sent_p99 = percentile(mine.ttft_ms, 99), percentile(mine.ttft_sent_ms, 99)
    ok = p99 is not None and truth is not None and abs(p99 - truth) <= 0.05 * truth
    print(f"run {run} stall: TTFT P99 from intended {p99:.1f} ms, simulated truth {truth:.1f} ms, "
          f"from the actual send {sent_p99:.1f} ms  {'ok' if ok else 'MISS'}")  # fmt: skip
    return {"stall": ok}


def scenario_cap1(run: int, requests: int) -> dict[str, bool]:
    """`optlab run` at 10/s against a 500 ms answer with one request in flight at a time."""
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="optlab-cap1-"))
    (folder / "cap1.yaml").write_text(
        "name: cap1\n"
        f"target: {{kind: openai, url: 'http://127.0.0.1:{port}/v1', model: m, code_version: s}}\n"
        "workload:\n"
        "  load: {mode: open, rate: 10, arrival: constant, max_in_flight: 1}\n"
        "  prompts: {input_tokens: 4, output_tokens: 25}\n"
        "  timeout_ms: 600000\n"
        "protocol: {name: quick, warmup_s: 1, duration_s: 4}\n"
    )
    server = start_streamer(port, StreamerKnobs(slots=1, decode_base_ms=DECODE_MS))
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        done = subprocess.run(
            [sys.executable, "-m", "optlab", "--db", f"sqlite:///{folder / 'o.db'}", "run",
             str(folder / "cap1.yaml"), "--json", "--allow-invalid"],
            env=env, capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    llm = summary["llm"]
    # Request k (due at 100 k ms) is sent when k-1 ends and ends at 500 (k + 1) ms: E2E
    # 400 k + 500, its wait for the one connection 400 k. The measured phase holds N requests
    # in a row, the last being the one whose E2E is the run's longest: aligned by it, the
    # check is on how many there were and how they spread (a client that timed from its own
    # send would see ~500 ms each).
    n = llm["requests"]
    k0 = round((llm["e2e_ms"]["max"] - 500.0) / 400.0) - (n - 1)
    truth = [400.0 * k + 500.0 for k in range(k0, k0 + n)]
    ok = n > 0 and k0 >= 0
    cells = [f"{n} requests from k={k0}"]
    for q in (50, 99):
        # The run's histograms give a recorded value (nearest rank): the truth likewise.
        measured, true = llm["e2e_ms"][f"p{q}"], nearest_rank(truth, q)
        ok &= abs(measured - true) <= 0.05 * true
        cells.append(f"E2E P{q} {measured:.0f}/{true:.0f} ms")
    wait, true_wait = llm["client_wait_ms"]["p50"], nearest_rank([t - 500.0 for t in truth], 50)
    cells.append(f"client wait P50 {wait:.0f}/{true_wait:.0f} ms")
    print(f"run {run} cap1: " + "  ".join(cells) + f"  {'ok' if ok else 'MISS'}")
    return {"cap1": ok}


def nearest_rank(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48, help="requests per level")
    parser.add_argument("--scenario", choices=SCENARIOS, action="append")
    args = parser.parse_args()
    chosen = args.scenario or list(SCENARIOS)
    print(
        f"# llm_accuracy: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"{OUTPUT_TOKENS} output tokens, {DECODE_MS:g} ms decode step; "
        f"tolerance max({ABS_MS:g} ms, {REL:.0%})"
    )
    runners = {
        "closed": scenario_closed,
        "open": scenario_open,
        "chunked": scenario_chunked,
        "stall": scenario_stall,
        "cap1": scenario_cap1,
    }
    passed: dict[str, int] = {}
    for run in range(args.runs):
        for name in chosen:
            requests = args.requests * (4 if name in ("open", "stall") else 1)
            for key, ok in runners[name](run, requests).items():
                passed[key] = passed.get(key, 0) + ok
    for key, count in passed.items():
        goal = 19 * args.runs / 20
        print(
            f"{key}: {count}/{args.runs} runs within bounds: {'PASS' if count >= goal else 'MISS'}"
        )


if __name__ == "__main__":
    main()
