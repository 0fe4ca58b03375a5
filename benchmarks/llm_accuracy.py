"""How close a client's streaming figures come to the server's own log: the token streamer
(`optlab.reference.streamer`, 128 output tokens, a 20 ms decode step) driven at 1, 8 and 32
concurrent streams by optlab's own client (`optlab.targets.http_client` with its SSE reader,
what `optlab run` drives), each request's events compared with the times the server wrote
them (`GET /truth`).

Per concurrency: client TTFT (from its own send) against the server's (first token's write
minus the request's arrival), and per-event ITL, P50 and P99 each; output tokens against the
server's count, request by request. Goal (issue "LLM endpoints"): every figure within
max(1 ms, 3%) of the server's, token counts equal, in >= 19 of 20 seeded runs (`--runs 20`;
the default 3 is a quick look). It is a measurement, not a test: PASS/MISS is printed and the
exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/llm_accuracy.py [--runs 3] [--requests 48]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp

from optlab.metrics.llm import StreamTiming, itl_event_gaps
from optlab.metrics.stages import RequestTiming
from optlab.metrics.stats import percentile
from optlab.targets.http_client import HttpClient, StreamSpec
from optlab.targets.http_wire import Body, HttpSpec

REPO = Path(__file__).resolve().parents[1]
OUTPUT_TOKENS = 128
DECODE_MS = 20.0
LEVELS = (1, 8, 32)
ABS_MS, REL = 1.0, 0.03


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_streamer(port: int, slots: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-m", "optlab.reference.streamer", "--port", str(port)]
    command += ["--slots", str(slots), "--decode-base-ms", str(DECODE_MS)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    line = server.stdout.readline()
    if "listening" not in line:
        server.kill()
        raise RuntimeError(f"the streamer did not start: {line!r}")
    return server


def bodies(keys: list[str]) -> list[Body]:
    """One request body per key (its `user`), each sent once."""
    return [
        Body(
            json.dumps(
                {
                    "model": "optlab-streamer",
                    "prompt": "tell me " * 16,
                    "max_tokens": OUTPUT_TOKENS,
                    "stream": True,
                    "user": key,
                }
            ).encode(),
            "application/json",
        )
        for key in keys
    ]


async def level(base: str, clients: int, requests: int, seed: int) -> dict[str, StreamTiming]:
    """`requests` streams through optlab's own client (the one `optlab run` drives), from
    `clients` concurrent workers, each event stamped as its bytes arrive."""
    keys = [f"{seed}-{clients}-{k}" for k in range(requests)]
    spec = HttpSpec(
        url=f"{base}/v1/completions",
        method="POST",
        headers=(),
        ok_status=None,
        connect_timeout_s=5.0,
        timeout_s=60.0,
        connections=clients,
    )
    stream = StreamSpec("words", (OUTPUT_TOKENS,) * requests, (32,) * requests, exact=True)
    client = HttpClient(spec, bodies(keys), stream)
    await client.open()
    found: dict[str, StreamTiming] = {}
    order = iter(range(requests))
    async with aiohttp.ClientSession() as session:
        await session.post(f"{base}/truth/reset")

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


async def truth(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/truth") as response:
        return {record["id"]: record for record in await response.json()}


def within(measured: float | None, true: float | None) -> bool:
    if measured is None or true is None:
        return False
    return abs(measured - true) <= max(ABS_MS, REL * true)


def compare(client: dict[str, StreamTiming], server: dict[str, Any]) -> dict[str, Any]:
    ttft_c, ttft_s, itl_c, itl_s = [], [], [], []
    tokens_equal = True
    for key, stream in client.items():
        record = server[key]
        events = tuple((t, n) for t, n in record["events"])
        truth_stream = StreamTiming(
            record["arrived_ns"], record["arrived_ns"], events, record["end_ns"]
        )
        tokens_equal &= stream.tokens == record["output_tokens"] == OUTPUT_TOKENS
        ttft = stream.ttft_ns(from_sent=True)
        true_ttft = truth_stream.ttft_ns()
        if ttft is not None and true_ttft is not None:
            ttft_c.append(ttft / 1e6)
            ttft_s.append(true_ttft / 1e6)
        itl_c += [g / 1e6 for g in itl_event_gaps(stream)]
        itl_s += [g / 1e6 for g in itl_event_gaps(truth_stream)]
    out: dict[str, Any] = {"tokens_equal": tokens_equal}
    for name, mine, theirs in (("ttft", ttft_c, ttft_s), ("itl", itl_c, itl_s)):
        for q in (50, 99):
            out[f"{name}_p{q}"] = (percentile(mine, q), percentile(theirs, q))
    return out


def run_loop(coroutine: Any) -> Any:
    """On uvloop where it is installed, as `optlab run`'s load generator is."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=48, help="requests per level")
    args = parser.parse_args()
    print(
        f"# llm_accuracy: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; "
        f"{OUTPUT_TOKENS} output tokens, {DECODE_MS:g} ms decode step; "
        f"tolerance max({ABS_MS:g} ms, {REL:.0%})"
    )
    passed = {clients: 0 for clients in LEVELS}
    for run in range(args.runs):
        port = free_port()
        server = start_streamer(port, slots=max(LEVELS))
        base = f"http://127.0.0.1:{port}"
        try:
            for clients in LEVELS:
                client = run_loop(level(base, clients, args.requests, run))
                found = compare(client, asyncio.run(truth(base)))
                ok = found["tokens_equal"] and all(
                    within(*found[k]) for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
                )
                passed[clients] += ok
                cells = "  ".join(
                    f"{k} {found[k][0]:7.2f}/{found[k][1]:7.2f}"
                    for k in ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99")
                )
                print(
                    f"run {run} c={clients:>2}  client/server ms: {cells}  tokens equal "
                    f"{found['tokens_equal']}  {'ok' if ok else 'MISS'}"
                )
        finally:
            server.terminate()
            server.wait(10)
    for clients in LEVELS:
        goal = 19 * args.runs / 20
        print(
            f"c={clients}: within max({ABS_MS:g} ms, {REL:.0%}) in {passed[clients]}/{args.runs}"
            f" runs: {'PASS' if passed[clients] >= goal else 'MISS'}"
        )


if __name__ == "__main__":
    main()
