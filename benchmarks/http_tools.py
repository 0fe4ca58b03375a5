"""The load generators `http_load.py` compares, each run once as a subprocess: its requests/s,
latency and CPU per request, or the reason it has none (a string).

CPU per request is what each client process spent while it drove the load: for wrk, hey, Locust
and the bare aiohttp loop, the child's rusage (user + system, start-up and final report
included: milliseconds for wrk and hey, ~1 s of imports for the Python ones), over the
requests it completed; for optlab, its own resource sampler's CPU of the optlab process and its
children (load-generator processes included, the service excluded) over the measured phase,
over the measured phase's requests: everything optlab does while it measures (the event loop,
the collector, the samplers, the store), none of its start-up.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# optlab's resource sampler looks for its child processes every 5 s (CHILDREN_REFRESH_S): a
# warmup shorter than that leaves load-generator processes out of the first measured seconds.
CHILD_SCAN_S = 5.0


@dataclass
class Load:
    """What every tool is asked to do: the same URL, method, body, connections and seconds."""

    url: str
    seconds: int
    connections: int
    method: str = "GET"
    body: Path | None = None  # a file sent as every request's body
    content_type: str | None = None


@dataclass
class Figures:
    rps: float
    p50_ms: float | None
    p99_ms: float | None
    cpu_us: float | None  # client CPU per request, µs
    requests: int
    errors: int = 0
    detail: str = ""  # what the tool's line says after the common figures
    extra: list[str] = field(default_factory=list)  # further lines


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_measured(
    command: Sequence[str], timeout_s: float, **kwargs: Any
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `command`; (its result, the CPU seconds it used: user + system, from rusage).

    The tools run one at a time and the servers are waited for only at the end, so the
    children's rusage grows by this command's alone.
    """
    before = _children_cpu_s()
    done = subprocess.run(
        list(command), capture_output=True, text=True, timeout=timeout_s, check=False, **kwargs
    )
    return done, _children_cpu_s() - before


def per_request_us(cpu_s: float, requests: int) -> float | None:
    return 1e6 * cpu_s / requests if requests > 0 else None


def _ms(text: str) -> float | None:
    """wrk's "685.00us" / "2.62ms" / "1.01s" -> ms."""
    found = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if found is None:
        return None
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}[found.group(2)]
    return float(found.group(1)) * scale


# -- wrk ------------------------------------------------------------------------------------------

WRK_BODY = """\
wrk.method = "{method}"
local f = io.open("{path}", "rb")
wrk.body = f:read("*all")
f:close()
{content_type}
"""


def run_wrk(load: Load, workdir: Path) -> Figures | str:
    wrk = shutil.which("wrk")
    if wrk is None:
        return "skipped: wrk not found"
    command = [wrk, "-t1", f"-c{load.connections}", f"-d{load.seconds}s", "--latency"]
    if load.body is not None or load.method != "GET":
        script = workdir / "wrk-body.lua"
        content_type = (
            f'wrk.headers["Content-Type"] = "{load.content_type}"' if load.content_type else ""
        )
        body = load.body if load.body is not None else workdir / "empty"
        body.touch()
        script.write_text(WRK_BODY.format(method=load.method, path=body, content_type=content_type))
        command += ["-s", str(script)]
    done, cpu_s = run_measured([*command, load.url], load.seconds + 60)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    count = re.search(r"(\d+) requests in", done.stdout)
    if done.returncode != 0 or rate is None or count is None:
        return f"failed: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    quantiles = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", done.stdout, re.MULTILINE))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", done.stdout)
    socket_errors = re.search(r"Socket errors: (.*)", done.stdout)
    requests = int(count.group(1))
    detail = f"(1 thread, {load.connections} connections, {load.seconds} s)"
    if socket_errors:
        detail += f"  socket errors: {socket_errors.group(1)}"
    return Figures(
        rps=float(rate.group(1)),
        p50_ms=_ms(quantiles.get("50", "")),
        p99_ms=_ms(quantiles.get("99", "")),
        cpu_us=per_request_us(cpu_s, requests),
        requests=requests,
        errors=int(errors.group(1)) if errors else 0,
        detail=detail,
    )


# -- hey ------------------------------------------------------------------------------------------


def run_hey(load: Load) -> Figures | str:
    hey = shutil.which("hey")
    if hey is None:
        return "skipped: hey not found (Debian: apt-get install hey)"
    command = [hey, "-z", f"{load.seconds}s", "-c", str(load.connections), "-m", load.method]
    if load.body is not None:
        command += ["-D", str(load.body)]
    if load.content_type:
        command += ["-T", load.content_type]
    done, cpu_s = run_measured([*command, load.url], load.seconds + 60)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if done.returncode != 0 or rate is None:
        return f"failed: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    quantiles = dict(re.findall(r"^\s+(50|99)% in ([\d.]+) secs", done.stdout, re.MULTILINE))
    statuses = {int(s): int(n) for s, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", done.stdout)}
    # "Error distribution:" lists "[count]  message" per transport error kind.
    _, _, errors_part = done.stdout.partition("Error distribution:")
    transport_errors = sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", errors_part, re.M))
    ok = sum(n for s, n in statuses.items() if 200 <= s < 300)
    failed = sum(statuses.values()) - ok + transport_errors
    detail = f"(Go, {load.connections} workers, {load.seconds} s)"
    if failed:
        detail += f"  {failed:,} failed"
    return Figures(
        rps=float(rate.group(1)),
        p50_ms=float(quantiles["50"]) * 1e3 if "50" in quantiles else None,
        p99_ms=float(quantiles["99"]) * 1e3 if "99" in quantiles else None,
        cpu_us=per_request_us(cpu_s, ok + failed),
        requests=ok,
        errors=failed,
        detail=detail,
    )


# -- the bare aiohttp loop ------------------------------------------------------------------------

# The reference for what a Python client costs at its leanest on aiohttp: one pooled session,
# the same event loop optlab uses, timing nothing and recording nothing.
BARE_AIOHTTP = """\
import asyncio, sys, time
import aiohttp

async def main(url, seconds, connections):
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        count = 0
        async def client():
            nonlocal count
            while time.perf_counter() < stop:
                async with session.get(url) as response:
                    await response.read()
                count += 1
        started = time.perf_counter()
        stop = started + seconds
        await asyncio.gather(*(client() for _ in range(connections)))
        print(count / (time.perf_counter() - started), count)

try:
    import uvloop
    loop = uvloop.new_event_loop()
except ImportError:
    loop = asyncio.new_event_loop()
loop.run_until_complete(main(sys.argv[1], float(sys.argv[2]), int(sys.argv[3])))
"""


def run_bare(load: Load) -> Figures | str:
    command = [sys.executable, "-c", BARE_AIOHTTP, load.url, str(load.seconds),
               str(load.connections)]  # fmt: skip
    done, cpu_s = run_measured(command, load.seconds + 60)
    try:
        rps, count = done.stdout.split()
        rate, requests = float(rps), int(count)
    except ValueError:
        return f"failed: exit {done.returncode}: {done.stderr.strip()[-300:]}"
    return Figures(
        rps=rate,
        p50_ms=None,
        p99_ms=None,
        cpu_us=per_request_us(cpu_s, requests),
        requests=requests,
        detail=f"(aiohttp, one process, {load.connections} coroutines, {load.seconds} s, "
        "nothing timed or recorded)",
    )


# -- Locust ---------------------------------------------------------------------------------------

LOCUSTFILE = """\
from locust import FastHttpUser, constant, task


class Get(FastHttpUser):
    wait_time = constant(0)

    @task
    def root(self):
        self.client.get("/")
"""

# The final summary Locust prints (its stats CSV is a periodic snapshot, a second or two stale):
# "Aggregated  12264  0(0.00%) |  17  2  87  15 | 2569.37  0.00" (requests, failures | avg min
# max median ms | req/s failures/s), then the percentile table's row "Aggregated  15  19 ... 12264"
# (50% 66% 75% 80% 90% 95% 98% 99% 99.9% 99.99% 100%, requests).
LOCUST_TOTALS = re.compile(r"^\s*Aggregated\s+(\d+)\s+(\d+)\(.*?\)\s*\|.*\|\s*([\d.]+)", re.M)
LOCUST_PERCENTILES = re.compile(r"^\s*Aggregated((?:\s+[\d.]+|\s+N/A){12})\s*$", re.M)


def locust_ready(venv: Path, install: bool) -> tuple[Path | None, str]:
    locust = venv / "bin" / "locust"
    if locust.exists():
        return locust, ""
    if not install:
        return None, f"{venv} not present (--smoke does not install Locust)"
    print(f"# installing Locust into {venv} (first use only)", flush=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        # Locust needs no torch; the constraints pin it anyway, in case a dependency asks.
        [str(venv / "bin" / "pip"), "install", "--quiet", "locust",
         "-c", str(REPO / "constraints.txt")],
    ]  # fmt: skip
    for command in steps:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            return None, f"`{' '.join(command[:3])}` took over 15 minutes"
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
            shutil.rmtree(venv, ignore_errors=True)
            return None, f"`{' '.join(command[:3])}` failed: {tail[0][:200]}"
    return (locust, "") if locust.exists() else (None, f"no {locust} after pip install")


def run_locust(locust: Path, load: Load, workdir: Path) -> Figures | str:
    locustfile = workdir / "locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    users = load.connections
    command = [str(locust), "-f", str(locustfile), "--headless", "-u", str(users),
               "-r", str(users * 10), "-t", f"{load.seconds}s", "--host", load.url.rstrip("/"),
               "--only-summary", "--loglevel", "WARNING"]  # fmt: skip
    done, cpu_s = run_measured(command, load.seconds + 120)
    output = done.stderr + done.stdout
    totals = LOCUST_TOTALS.search(output)
    if totals is None:
        return f"failed: exit {done.returncode}, no summary: {output.strip()[-300:]}"
    requests, failures, rps = int(totals.group(1)), int(totals.group(2)), float(totals.group(3))
    p50 = p99 = None
    if percentiles := LOCUST_PERCENTILES.search(output):
        values = percentiles.group(1).split()
        p50 = None if values[0] == "N/A" else float(values[0])
        p99 = None if values[7] == "N/A" else float(values[7])
    detail = f"(FastHttpUser, 1 process, {users} users, {load.seconds} s)"
    if failures:
        detail += f"  {failures:,} failed"
    return Figures(
        rps=rps,
        p50_ms=p50,
        p99_ms=p99,
        cpu_us=per_request_us(cpu_s, requests),
        requests=requests - failures,
        errors=failures,
        detail=detail,
    )


# -- optlab ---------------------------------------------------------------------------------------


def experiment_yaml(name: str, load: Load, processes: int, warmup_s: float) -> str:
    inputs = ""
    if load.body is not None:
        inputs = f"  inputs: {{files: '{load.body}'"
        inputs += f", content_type: '{load.content_type}'}}\n" if load.content_type else "}\n"
    return (
        f"name: {name}\n"
        f"target: {{kind: http, url: '{load.url}', method: {load.method}, "
        "code_version: bench}\n"
        "knobs: {}\n"
        "workload:\n"
        f"  load: {{mode: closed, concurrency: {load.connections}, processes: {processes}}}\n"
        f"{inputs}"
        f"protocol: {{name: quick, warmup_s: {warmup_s:g}, duration_s: {load.seconds}}}\n"
    )


def recorded_in_db(db: Path, run_id: int) -> int | None:
    # Used only if the summary's total latency carries no count: the stored stage_stats row.
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT count FROM stage_stats WHERE run_id = ? AND stage = 'total' "
            "AND phase = 'measure'",
            (run_id,),
        ).fetchone()
    return None if row is None else int(row[0])


def run_optlab(
    load: Load, processes: int, warmup_s: float, workdir: Path, tag: str
) -> Figures | str:
    name = f"bench-{tag}-{processes}p"
    exp = workdir / f"{name}.yaml"
    exp.write_text(experiment_yaml(name, load, processes, warmup_s))
    db = workdir / f"{name}.db"
    db.unlink(missing_ok=True)
    command = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{db}", "run", str(exp),
               "--quick", "--json"]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    done, _ = run_measured(command, load.seconds + 180, env=env, cwd=workdir)
    lines = done.stdout.strip().splitlines()
    try:
        summary: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        message = " | ".join(done.stderr.strip().splitlines()[-3:]) or "no summary on stdout"
        return f"failed: exit {done.returncode}: {message[:400]}"
    if summary.get("status") != "FINISHED":
        why = "; ".join(str(r) for r in summary.get("reasons") or []) or "no reason given"
        return f"failed: run {summary.get('status')}: {why[:400]}"
    requests = int(summary.get("requests") or 0)
    duration = float(summary.get("duration_s") or 0.0)
    rps = float(summary.get("qps") or (requests / duration if duration else 0.0))
    total = (summary.get("latency_ms") or {}).get("total") or {}
    recorded = total.get("count")
    if recorded is None and summary.get("run_id") is not None:
        recorded = recorded_in_db(db, int(summary["run_id"]))
    cpu_pct = ((summary.get("resources") or {}).get("cpu_process_pct") or {}).get("mean")
    # Percent of one core, averaged over the measured phase's one-second readings.
    cpu_us = 1e4 * float(cpu_pct) / rps if cpu_pct is not None and rps > 0 else None
    if processes > 1 and warmup_s <= CHILD_SCAN_S:
        cpu_us = None  # the worker processes were not yet seen when the measurement began
    errors = int(summary.get("errors") or 0)
    shown = "?" if recorded is None else f"{int(recorded):,}"
    every = recorded is not None and int(recorded) == requests and requests > 0
    reasons = [str(r) for r in summary.get("reasons") or []]
    state = "valid" if summary.get("valid") else "NOT VALID: " + "; ".join(reasons)
    return Figures(
        rps=rps,
        p50_ms=total.get("p50"),
        p99_ms=total.get("p99"),
        cpu_us=cpu_us,
        requests=requests,
        errors=errors,
        detail=f"latency recorded for {shown} of {requests:,} requests",
        extra=[
            f"every request recorded: {'yes' if every else 'NO'} ({shown} of {requests:,}); "
            f"errors {errors:,}; run {state}"
        ],
    )
