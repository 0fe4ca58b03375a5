"""How many requests/s optlab's HTTP load generator drives, against Locust and wrk.

One fixed, fast local server: nginx (Debian's) with one worker process returning a constant
3-byte body (`return 200 "ok\\n"`, no access log), started here with its own prefix and config in
a temporary folder and stopped at the end. Without nginx (a CI runner), a minimal aiohttp
server in a subprocess stands in, and the server line says so. Against it, one after another,
for the same number of seconds and with the same number of connections:

1. wrk (1 thread, `--latency`): a C load generator, the ceiling;
2. Locust (FastHttpUser, one process, headless, `wait_time = constant(0)`), the Python tool
   people reach for; installed on first use in its own venv (`--locust-venv`), never into
   optlab's environment;
3. optlab (`python -m optlab run EXP --quick --json`, an `http` target, closed loop) with 1 and
   2 load-generator processes, each checked for every request's latency being recorded.

Goal: optlab with one process drives >= 1.3x what Locust does. Like the other benchmarks this is
a measurement, not a test: it exits 0 whether the goal is met or not, and a tool that is missing
or fails is reported on its line and the rest still runs.

    PYTHONPATH=src python benchmarks/http_load.py [--seconds 15] [--connections 64] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provenance import source_hashes

REPO = Path(__file__).resolve().parents[1]
GOAL_VS_LOCUST = 1.3
DEFAULT_LOCUST_VENV = Path("/tmp/optlab-bench-locust")
BODY = b"ok\n"
# Debian puts nginx in /usr/sbin, which is not on an ordinary user's PATH.
SBIN = os.pathsep.join(("/usr/sbin", "/usr/local/sbin", "/sbin"))
LABEL = "{:<14}"  # the tool-name column every figure line starts with

NGINX_CONF = """\
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    default_type text/plain;
    keepalive_requests 1000000;
    client_body_temp_path {prefix}/tmp;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        location / {{ return 200 "ok\\n"; }}
    }}
}}
"""

# The fallback server: aiohttp, one process, the same constant body.
AIOHTTP_SERVER = """\
import sys
from aiohttp import web

async def ok(request):
    return web.Response(body=b"ok\\n", content_type="text/plain")

app = web.Application()
app.router.add_get("/", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=None)
"""

# The reference for optlab's own cost: the smallest aiohttp client loop (the same pooled
# session, the same event loop optlab uses), timing nothing and recording nothing.
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

LOCUSTFILE = """\
from locust import FastHttpUser, constant, task


class Get(FastHttpUser):
    wait_time = constant(0)

    @task
    def root(self):
        self.client.get("/")
"""


@dataclass
class Server:
    description: str
    url: str
    process: subprocess.Popen[bytes]


@dataclass
class OptlabResult:
    rps: float
    requests: int
    recorded: int | None
    errors: int
    p50_ms: float | None
    p99_ms: float | None
    valid: bool
    reasons: list[str]


def label(name: str) -> str:
    return LABEL.format(name)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_listening(port: int, process: subprocess.Popen[bytes], deadline_s: float = 15.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on 127.0.0.1:{port} after {deadline_s:g} s")


def find_nginx() -> str | None:
    return shutil.which("nginx", path=os.pathsep.join((os.environ.get("PATH", ""), SBIN)))


def nginx_version(nginx: str) -> str:
    done = subprocess.run([nginx, "-v"], capture_output=True, text=True, check=False)
    found = re.search(r"nginx/(\S+)", done.stderr + done.stdout)
    return found.group(1) if found else "?"


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def start_server(workdir: Path, choice: str) -> Iterator[Server]:
    nginx = find_nginx() if choice in ("auto", "nginx") else None
    if choice == "nginx" and nginx is None:
        raise RuntimeError("--server nginx: nginx not found")
    port = free_port()
    if nginx is not None:
        prefix = workdir / "nginx"
        (prefix / "tmp").mkdir(parents=True)
        conf = prefix / "nginx.conf"
        conf.write_text(NGINX_CONF.format(prefix=prefix, port=port))
        command = [nginx, "-p", str(prefix), "-c", str(conf), "-e", str(prefix / "error.log"),
                   "-g", "daemon off;"]  # fmt: skip
        description = (
            f"nginx {nginx_version(nginx)}, 1 worker, constant {len(BODY)}-byte body, "
            f"127.0.0.1:{port}"
        )
    else:
        why = "nginx not found" if choice == "auto" else "--server aiohttp"
        command = [sys.executable, "-c", AIOHTTP_SERVER, str(port)]
        description = (
            f"aiohttp fallback ({why}), 1 process, constant {len(BODY)}-byte body, 127.0.0.1:{port}"
        )
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    try:
        wait_listening(port, process)
        yield Server(description, f"http://127.0.0.1:{port}/", process)
    finally:
        stop(process)


def run_wrk(url: str, seconds: int, connections: int) -> str:
    wrk = shutil.which("wrk")
    if wrk is None:
        return "skipped: wrk not found"
    command = [wrk, "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if done.returncode != 0 or rate is None:
        return f"failed: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    rps = float(rate.group(1))
    quantiles = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", done.stdout, re.MULTILINE))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors: (.*)", done.stdout)
    line = (
        f"{rps:>10,.0f} requests/s   (1 thread, {connections} connections, {seconds} s)"
        f"  P50 {quantiles.get('50', '?')} P99 {quantiles.get('99', '?')}"
    )
    if errors:
        line += f"  errors: {errors.group(0)}"
    return line


def run_bare(url: str, seconds: int, connections: int) -> tuple[float | None, str]:
    command = [sys.executable, "-c", BARE_AIOHTTP, url, str(seconds), str(connections)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    try:
        rps, count = done.stdout.split()
        rate = float(rps)
    except ValueError:
        return None, f"failed: exit {done.returncode}: {done.stderr.strip()[-300:]}"
    line = f"{rate:>10,.0f} requests/s   (one process, {connections} coroutines, {seconds} s, "
    return rate, line + f"{int(count):,} requests, nothing recorded)"


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


# The final summary Locust prints (its stats CSV is a periodic snapshot, a second or two stale):
# "Aggregated  12264  0(0.00%) |  17  2  87  15 | 2569.37  0.00" (requests, failures | avg min
# max median ms | req/s failures/s), then the percentile table's row "Aggregated  15  19 ... 12264"
# (50% 66% 75% 80% 90% 95% 98% 99% 99.9% 99.99% 100%, requests).
LOCUST_TOTALS = re.compile(r"^\s*Aggregated\s+(\d+)\s+(\d+)\(.*?\)\s*\|.*\|\s*([\d.]+)", re.M)
LOCUST_PERCENTILES = re.compile(r"^\s*Aggregated((?:\s+[\d.]+|\s+N/A){12})\s*$", re.M)


def run_locust(
    locust: Path, url: str, seconds: int, users: int, workdir: Path
) -> tuple[float | None, str]:
    locustfile = workdir / "locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    command = [str(locust), "-f", str(locustfile), "--headless", "-u", str(users),
               "-r", str(users * 10), "-t", f"{seconds}s", "--host", url.rstrip("/"),
               "--only-summary", "--loglevel", "WARNING"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 120)
    output = done.stderr + done.stdout
    totals = LOCUST_TOTALS.search(output)
    if totals is None:
        return None, f"failed: exit {done.returncode}, no summary: {output.strip()[-300:]}"
    requests, failures, rps = int(totals.group(1)), int(totals.group(2)), float(totals.group(3))
    line = f"{rps:>10,.0f} requests/s    (FastHttpUser, 1 process, {users} users, {seconds} s)"
    if percentiles := LOCUST_PERCENTILES.search(output):
        values = percentiles.group(1).split()
        line += f"  P50 {values[0]} ms P99 {values[7]} ms"
    line += f"  {requests:,} requests"
    if failures:
        line += f", {failures:,} failed"
    return rps, line


def experiment_yaml(name: str, url: str, connections: int, processes: int, warmup_s: float,
                    seconds: int) -> str:  # fmt: skip
    return (
        f"name: {name}\n"
        f'target: {{kind: http, url: "{url}", method: GET, code_version: nginx-constant}}\n'
        "knobs: {}\n"
        "workload:\n"
        f"  load: {{mode: closed, concurrency: {connections}, processes: {processes}}}\n"
        f"protocol: {{name: quick, warmup_s: {warmup_s:g}, duration_s: {seconds}}}\n"
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
    url: str, seconds: int, connections: int, processes: int, warmup_s: float, workdir: Path
) -> OptlabResult | str:
    name = f"bench-http-{processes}p"
    exp = workdir / f"{name}.yaml"
    exp.write_text(experiment_yaml(name, url, connections, processes, warmup_s, seconds))
    db = workdir / f"{name}.db"
    command = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{db}", "run", str(exp),
               "--quick", "--json"]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=workdir, timeout=seconds + 180
    )
    lines = done.stdout.strip().splitlines()
    try:
        summary: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        message = " | ".join(done.stderr.strip().splitlines()[-3:]) or "no summary on stdout"
        return f"failed: exit {done.returncode}: {message[:400]}"
    if summary.get("status") != "FINISHED":
        reasons = "; ".join(str(r) for r in summary.get("reasons") or []) or "no reason given"
        return f"failed: run {summary.get('status')}: {reasons[:400]}"
    requests = int(summary.get("requests") or 0)
    duration = float(summary.get("duration_s") or 0.0)
    rps = float(summary.get("qps") or (requests / duration if duration else 0.0))
    total = (summary.get("latency_ms") or {}).get("total") or {}
    recorded = total.get("count")
    if recorded is None and summary.get("run_id") is not None:
        recorded = recorded_in_db(db, int(summary["run_id"]))
    return OptlabResult(
        rps=rps,
        requests=requests,
        recorded=None if recorded is None else int(recorded),
        errors=int(summary.get("errors") or 0),
        p50_ms=total.get("p50"),
        p99_ms=total.get("p99"),
        valid=bool(summary.get("valid")),
        reasons=[str(r) for r in summary.get("reasons") or []],
    )


def optlab_lines(processes: int, result: OptlabResult | str) -> list[str]:
    name = label(f"optlab {processes} proc")
    if isinstance(result, str):
        return [f"{name}{result}"]
    recorded = "?" if result.recorded is None else f"{result.recorded:,}"

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    lines = [
        f"{name}{result.rps:>10,.0f} requests/s    latency recorded for {recorded} of "
        f"{result.requests:,} requests  P50 {ms(result.p50_ms)} ms P99 {ms(result.p99_ms)} ms"
    ]
    every = result.recorded == result.requests and result.requests > 0
    state = "valid" if result.valid else "NOT VALID: " + "; ".join(result.reasons)
    lines.append(
        f"{'':14}every request recorded: {'yes' if every else 'NO'} ({recorded} of "
        f"{result.requests:,}); errors {result.errors:,}; run {state}"
    )
    return lines


def ratio(num: float | None, den: float | None) -> str:
    return "n/a" if num is None or not den else f"{num / den:.2f}"


def code_id() -> str:
    return source_hashes("targets/http.py", "load/aio.py", "load/processes.py")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 s per tool, 16 connections; Locust only if already installed",
    )
    parser.add_argument("--seconds", type=int, help="measured seconds per tool (default 15)")
    parser.add_argument(
        "--rounds", type=int, help="rounds of every tool, interleaved (default 3; smoke 1)"
    )
    parser.add_argument("--connections", type=int, help="connections / users (default 64)")
    parser.add_argument(
        "--locust-venv",
        type=Path,
        default=DEFAULT_LOCUST_VENV,
        help=f"Locust's own venv, created on first use (default {DEFAULT_LOCUST_VENV})",
    )
    parser.add_argument(
        "--server",
        choices=("auto", "nginx", "aiohttp"),
        default="auto",
        help="auto: nginx if found, else the aiohttp fallback",
    )
    args = parser.parse_args(argv)
    seconds = args.seconds or (1 if args.smoke else 15)
    connections = args.connections or (8 if args.smoke else 64)
    warmup_s = 0.5 if args.smoke else 2.0

    rounds = args.rounds or (1 if args.smoke else 3)
    load1, _, _ = os.getloadavg()
    print(
        f"# http_load: Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load1:.2f}; code: {code_id()}; {seconds} s per tool, {connections} connections; "
        f"optlab warmup {warmup_s:g} s; {rounds} round(s), the tools interleaved in each",
        flush=True,
    )
    rates: dict[str, list[float]] = {}
    pairs: list[float] = []  # optlab 1 proc / locust within each round: drift cancels
    with tempfile.TemporaryDirectory(prefix="optlab-http-load-") as tmp:
        workdir = Path(tmp)
        with start_server(workdir, args.server) as server:
            print(f"{label('server')}{server.description}", flush=True)
            locust, why = locust_ready(args.locust_venv, install=not args.smoke)
            for number in range(1, rounds + 1):
                if rounds > 1:
                    print(f"# round {number} of {rounds}", flush=True)
                found = one_round(server.url, seconds, connections, warmup_s, workdir, locust, why)
                for tool, rate in found.items():
                    if rate is not None:
                        rates.setdefault(tool, []).append(rate)
                if found.get("optlab 1 proc") and found.get("locust"):
                    pairs.append(found["optlab 1 proc"] / found["locust"])  # type: ignore[operator]

    def median(tool: str) -> float | None:
        values = rates.get(tool)
        return statistics.median(values) if values else None

    if rounds > 1:
        for tool, values in rates.items():
            listed = ", ".join(f"{v:,.0f}" for v in values)
            print(f"{label(tool)}median {median(tool):>10,.0f} requests/s   ({listed})")
    one, two, bare = median("optlab 1 proc"), median("optlab 2 proc"), median("bare aiohttp")
    locust_rps, wrk_rps = median("locust"), median("wrk")
    print(f"ratio optlab 1 proc / locust  {ratio(one, locust_rps)}    "
          f"optlab 2 proc / locust {ratio(two, locust_rps)}")  # fmt: skip
    print(f"ratio optlab 1 proc / wrk     {ratio(one, wrk_rps)}    "
          f"optlab 2 proc / wrk    {ratio(two, wrk_rps)}")  # fmt: skip
    print(f"ratio optlab 1 proc / bare aiohttp loop {ratio(one, bare)} (optlab's own cost)")
    if pairs:
        times = statistics.median(pairs)
        verdict = "PASS" if times >= GOAL_VS_LOCUST else "MISS"
        listed = ", ".join(f"{p:.2f}" for p in pairs)
        print(
            f"optlab 1 process >= {GOAL_VS_LOCUST:g}x locust: {times:.2f}x "
            f"(median of {len(pairs)} rounds: {listed}) {verdict}"
        )
    return 0


def one_round(
    url: str,
    seconds: int,
    connections: int,
    warmup_s: float,
    workdir: Path,
    locust: Path | None,
    why: str,
) -> dict[str, float | None]:
    """Each tool once against the same server; the line each prints; its requests/s."""
    found: dict[str, float | None] = {}
    try:
        wrk_line = run_wrk(url, seconds, connections)
    except (OSError, subprocess.SubprocessError) as exc:
        wrk_line = f"failed: {exc!r}"
    found["wrk"] = None
    if rate := re.match(r"\s*([\d,]+) requests/s", wrk_line):
        found["wrk"] = float(rate.group(1).replace(",", ""))
    print(f"{label('wrk')}{wrk_line}", flush=True)

    if locust is None:
        print(f"{label('locust')}skipped: {why}", flush=True)
    else:
        try:
            found["locust"], line = run_locust(locust, url, seconds, connections, workdir)
        except (OSError, subprocess.SubprocessError) as exc:
            line = f"failed: {exc!r}"
        print(f"{label('locust')}{line}", flush=True)

    try:
        found["bare aiohttp"], line = run_bare(url, seconds, connections)
    except (OSError, subprocess.SubprocessError) as exc:
        line = f"failed: {exc!r}"
    print(f"{label('bare aiohttp')}{line}", flush=True)

    for processes in (1, 2):
        try:
            result = run_optlab(url, seconds, connections, processes, warmup_s, workdir)
        except (OSError, subprocess.SubprocessError) as exc:
            result = f"failed: {exc!r}"
        found[f"optlab {processes} proc"] = None if isinstance(result, str) else result.rps
        for line in optlab_lines(processes, result):
            print(line, flush=True)
    return found


if __name__ == "__main__":
    sys.exit(main())
