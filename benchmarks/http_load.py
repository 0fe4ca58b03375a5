"""How optlab's HTTP client compares with hey, wrk and Locust: requests/s, latency, client CPU.

Two local servers, one after the other, each started here and stopped at the end:

1. **nginx** (Debian's) with one worker returning a constant 3-byte body, for the most
   requests/s each tool drives (64 connections). Without nginx (a CI runner) a minimal aiohttp
   server stands in, and the server line says so. Tools: wrk (C, 1 thread), hey (Go), Locust
   (FastHttpUser, one process, its own venv, installed on first use), a bare aiohttp loop, and
   optlab (`optlab run --quick --json` on an `http` target, closed loop) with 1 and 2 processes.
2. **a batching server**: `optlab serve` (the reference image classifier, torch, numpy-pooled
   preprocessing) with dynamic batching (a 5 ms window), POST of one 256 px JPEG, 16 closed-loop
   connections: the case where a client's CPU changes what it measures, because the server
   shares the machine's cores and forms smaller batches when its clients come back slower.
   Tools: hey, wrk (a Lua script sends the body) and optlab, one process.

The tools take turns within each round (the order reversed every other round) and the rounds
repeat, so a noisy neighbour hits every tool alike; each figure is a median over the rounds and
each ratio the median of the per-round ratios (a paired comparison). Every line gives
requests/s, P50, P99 and the client's CPU per request (see http_tools.py for how each is taken).

Goals: on the batching server, optlab's CPU per request <= hey's and its requests/s and P50
within 5% of hey's; on nginx, optlab with one process >= 1.3x Locust's requests/s. Like the
other benchmarks this is a measurement, not a test: it exits 0 whether the goals are met or not,
and a tool that is missing or fails is reported on its line and the rest still runs.

    PYTHONPATH=src python benchmarks/http_load.py [--seconds 15] [--rounds 3] [--batch-rounds 5]
        [--only nginx|batching] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from http_tools import (
    CHILD_SCAN_S,
    REPO,
    Figures,
    Load,
    locust_ready,
    run_bare,
    run_hey,
    run_locust,
    run_optlab,
    run_wrk,
)
from provenance import source_hashes

GOAL_VS_LOCUST = 1.3
GOAL_VS_HEY = 0.05  # requests/s and P50 within 5% of hey's on the batching server
DEFAULT_LOCUST_VENV = Path("/tmp/optlab-bench-locust")
DEFAULT_BATCHING = '{"mode":"dynamic","max_batch_size":16,"max_wait_ms":5}'
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


@dataclass
class Server:
    description: str
    url: str
    process: subprocess.Popen[bytes]


Result = Figures | str
Tool = tuple[str, Callable[[], Result]]


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


def optlab_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    return env


@contextmanager
def start_constant_server(workdir: Path, choice: str) -> Iterator[Server]:
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


@contextmanager
def start_batching_server(workdir: Path, batching: str) -> Iterator[Server]:
    port = free_port()
    log = (workdir / "serve.log").open("wb")
    command = [sys.executable, "-m", "optlab", "serve", "--port", str(port),
               "--batching", batching, "--preprocess", "numpy-pooled"]  # fmt: skip
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=optlab_env()
    )
    try:
        wait_listening(port, process, deadline_s=180.0)  # bound after the model is built
        description = (
            f"optlab serve (dynamic batching {batching}, torch, numpy-pooled), "
            f"POST /predict, 127.0.0.1:{port}"
        )
        yield Server(description, f"http://127.0.0.1:{port}/predict", process)
    finally:
        stop(process)
        log.close()


def write_jpeg(path: Path) -> int:
    """One of the reference classifier's 256 px renders: the body every tool sends."""
    from optlab.config.models import Workload
    from optlab.reference import pipeline

    workload = Workload.model_validate(
        {"load": {"mode": "closed", "concurrency": 1}, "inputs": {"count": 1, "size": 256}}
    )
    data = pipeline.inputs(workload)[0].jpeg
    path.write_bytes(data)
    return len(data)


def service_metrics(url: str, action: str) -> dict[str, object] | None:
    base = url.rsplit("/", 1)[0]
    method, path = ("POST", "/metrics/reset") if action == "reset" else ("GET", "/metrics")
    request = urllib.request.Request(
        base + path, method=method, data=b"" if method == "POST" else None
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            payload = response.read()
    except OSError:
        return None
    try:
        found = json.loads(payload) if payload.strip() else {}
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


# -- lines ----------------------------------------------------------------------------------------


def ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def us(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def tool_lines(name: str, result: Result) -> list[str]:
    if isinstance(result, str):
        return [f"{label(name)}{result}"]
    line = (
        f"{label(name)}{result.rps:>10,.0f} requests/s    {result.detail}  P50 {ms(result.p50_ms)} "
        f"ms P99 {ms(result.p99_ms)} ms  CPU {us(result.cpu_us)} µs/request"
    )
    return [line, *(f"{'':14}{extra}" for extra in result.extra)]


def median_of(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def listed(values: Sequence[float | None], form: str) -> str:
    return ", ".join("-" if v is None else format(v, form) for v in values)


def ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or not den else num / den


def shown(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


class Rounds:
    """Each tool's figures, round by round."""

    def __init__(self) -> None:
        self.by_tool: dict[str, list[Figures | None]] = {}
        self.count = 0

    def run(
        self, tools: Sequence[Tool], number: int, after: Callable[[str, Figures], None]
    ) -> None:
        self.count += 1
        ordered = list(tools) if number % 2 == 1 else list(reversed(tools))
        for name, run in ordered:
            try:
                result = run()
            except (OSError, subprocess.SubprocessError) as exc:
                result = f"failed: {exc!r}"
            if isinstance(result, Figures):
                after(name, result)
            for line in tool_lines(name, result):
                print(line, flush=True)
            figures = result if isinstance(result, Figures) else None
            self.by_tool.setdefault(name, [None] * (self.count - 1)).append(figures)
        for series in self.by_tool.values():
            series.extend([None] * (self.count - len(series)))

    def series(self, tool: str, attr: str) -> list[float | None]:
        return [None if f is None else getattr(f, attr) for f in self.by_tool.get(tool, [])]

    def median(self, tool: str, attr: str) -> float | None:
        return median_of(self.series(tool, attr))

    def paired(self, tool: str, other: str, attr: str) -> list[float]:
        """Per-round ratios tool/other where both have the figure."""
        pairs = zip(self.series(tool, attr), self.series(other, attr), strict=False)
        return [a / b for a, b in pairs if a is not None and b]

    def print_medians(self) -> None:
        for tool in self.by_tool:
            rps = self.series(tool, "rps")
            if not any(v is not None for v in rps):
                continue
            print(
                f"{label(tool)}median {self.median(tool, 'rps'):>10,.0f} requests/s  "
                f"P50 {ms(self.median(tool, 'p50_ms'))} ms  "
                f"CPU {us(self.median(tool, 'cpu_us'))} µs/request   "
                f"(requests/s {listed(rps, ',.0f')}; "
                f"P50 {listed(self.series(tool, 'p50_ms'), '.3f')}; "
                f"CPU {listed(self.series(tool, 'cpu_us'), '.1f')})"
            )


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def paired_text(pairs: Sequence[float]) -> str:
    return f"median of {len(pairs)} rounds: {listed(pairs, '.2f')}"


# -- the two servers ------------------------------------------------------------------------------


def constant_section(args: argparse.Namespace, workdir: Path) -> None:
    seconds, connections, warmup_s = args.seconds, args.connections, args.warmup
    two_warmup_s = warmup_s if args.smoke else max(warmup_s, CHILD_SCAN_S + 1)
    with start_constant_server(workdir, args.server) as server:
        print(f"{label('server')}{server.description}", flush=True)
        load = Load(server.url, seconds, connections)
        locust, why = locust_ready(args.locust_venv, install=not args.smoke)
        tools: list[Tool] = [
            ("wrk", lambda: run_wrk(load, workdir)),
            ("hey", lambda: run_hey(load)),
            (
                "locust",
                (lambda: run_locust(locust, load, workdir))
                if locust
                else (lambda: f"skipped: {why}"),
            ),
            ("bare aiohttp", lambda: run_bare(load)),
            ("optlab 1 proc", lambda: run_optlab(load, 1, warmup_s, workdir, "nginx")),
            # Long enough a warmup for optlab's sampler to have found its worker processes.
            ("optlab 2 proc", lambda: run_optlab(load, 2, two_warmup_s, workdir, "nginx")),
        ]
        rounds = Rounds()
        for number in range(1, args.rounds + 1):
            print(f"# constant server, round {number} of {args.rounds}", flush=True)
            rounds.run(tools, number, lambda name, figures: None)
    if args.rounds > 1:
        rounds.print_medians()
    one, two = rounds.median("optlab 1 proc", "rps"), rounds.median("optlab 2 proc", "rps")
    for other in ("locust", "wrk", "hey"):
        print(
            f"ratio optlab 1 proc / {other:<7}{shown(ratio(one, rounds.median(other, 'rps')))}    "
            f"optlab 2 proc / {other:<7}{shown(ratio(two, rounds.median(other, 'rps')))}"
        )
    bare = rounds.median("bare aiohttp", "rps")
    print(
        f"ratio optlab 1 proc / bare aiohttp loop {shown(ratio(one, bare))} "
        "(aiohttp at its leanest)"
    )
    if pairs := rounds.paired("optlab 1 proc", "locust", "rps"):
        times = statistics.median(pairs)
        print(
            f"optlab 1 process >= {GOAL_VS_LOCUST:g}x locust: {times:.2f}x ({paired_text(pairs)}) "
            f"{verdict(times >= GOAL_VS_LOCUST)}"
        )
    if pairs := rounds.paired("optlab 1 proc", "hey", "cpu_us"):
        times = statistics.median(pairs)
        mine, hey = rounds.median("optlab 1 proc", "cpu_us"), rounds.median("hey", "cpu_us")
        print(
            f"client CPU per request, constant server, optlab 1 proc vs hey: "
            f"{us(mine)} vs {us(hey)} µs, ratio {times:.2f} ({paired_text(pairs)}) "
            f"{verdict(times <= 1.0)}"
        )


def batching_section(args: argparse.Namespace, workdir: Path) -> None:
    body = workdir / "body.jpg"
    size = write_jpeg(body)
    with start_batching_server(workdir, args.batching) as server:
        print(f"{label('server')}{server.description}, a {size:,}-byte JPEG", flush=True)
        load = Load(server.url, args.batch_seconds, args.batch_connections, method="POST",
                    body=body, content_type="image/jpeg")  # fmt: skip
        # The server's first seconds (thread pool, allocator, caches) belong to no tool.
        run_hey(Load(server.url, 2 if args.smoke else 5, args.batch_connections, "POST", body,
                     "image/jpeg"))  # fmt: skip
        tools: list[Tool] = [
            ("hey", lambda: run_hey(load)),
            ("optlab 1 proc", lambda: run_optlab(load, 1, args.warmup, workdir, "batching")),
            ("wrk", lambda: run_wrk(load, workdir)),
        ]

        def batches(name: str, figures: Figures) -> None:
            found = service_metrics(server.url, "read")
            batching = (found or {}).get("batching")
            if isinstance(batching, dict) and batching.get("mean_batch_size") is not None:
                figures.detail += f"  mean batch {float(batching['mean_batch_size']):.2f}"

        rounds = Rounds()
        for number in range(1, args.batch_rounds + 1):
            print(f"# batching server, round {number} of {args.batch_rounds}", flush=True)
            wrapped = [(name, _reset_first(server.url, run)) for name, run in tools]
            rounds.run(wrapped, number, batches)
    if args.batch_rounds > 1:
        rounds.print_medians()
    for other in ("hey", "wrk"):
        qps = rounds.paired("optlab 1 proc", other, "rps")
        p50 = rounds.paired("optlab 1 proc", other, "p50_ms")
        if qps and p50:
            # The goal is hey's; wrk, the leanest client, shows what a cheaper client changes.
            print(
                f"optlab / {other} (batching server): requests/s {statistics.median(qps):.3f} "
                f"({paired_text(qps)}), P50 {statistics.median(p50):.3f} ({paired_text(p50)})"
            )
    qps = rounds.paired("optlab 1 proc", "hey", "rps")
    p50 = rounds.paired("optlab 1 proc", "hey", "p50_ms")
    cpu = rounds.paired("optlab 1 proc", "hey", "cpu_us")
    for name, pairs, better in (("requests/s", qps, 1.0), ("P50", p50, -1.0)):
        if pairs:
            r = statistics.median(pairs)
            ahead = " (optlab ahead)" if (r - 1) * better > GOAL_VS_HEY else ""
            print(
                f"optlab {name} within {GOAL_VS_HEY:.0%} of hey's (batching server): ratio "
                f"{r:.3f}{ahead} {verdict(abs(r - 1) <= GOAL_VS_HEY)}"
            )
    if cpu:
        c = statistics.median(cpu)
        print(
            f"client CPU per request <= hey's (batching server): optlab "
            f"{us(rounds.median('optlab 1 proc', 'cpu_us'))} vs hey "
            f"{us(rounds.median('hey', 'cpu_us'))} µs, ratio {c:.2f} ({paired_text(cpu)}) "
            f"{verdict(c <= 1.0)}"
        )


def _reset_first(url: str, run: Callable[[], Result]) -> Callable[[], Result]:
    def wrapped() -> Result:
        service_metrics(url, "reset")  # each tool's batches counted apart
        return run()

    return wrapped


def code_id() -> str:
    return source_hashes("targets/http.py", "targets/http_client.py", "targets/http_wire.py",
                         "targets/server_timing.py", "load/aio.py", "load/processes.py",
                         "load/timerfd.py")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="1-2 s per tool, one round; Locust only if already installed",
    )
    parser.add_argument("--seconds", type=int, help="seconds per tool, constant server (15)")
    parser.add_argument("--rounds", type=int, help="rounds on the constant server (3; smoke 1)")
    parser.add_argument("--connections", type=int, help="connections, constant server (64)")
    parser.add_argument("--batch-seconds", type=int, help="seconds per tool, batching (15)")
    parser.add_argument("--batch-rounds", type=int, help="rounds, batching server (5; smoke 1)")
    parser.add_argument(
        "--batch-connections", type=int, default=16, help="connections, batching server (16)"
    )
    parser.add_argument(
        "--batching",
        default=DEFAULT_BATCHING,
        help=f"the server's --batching (default {DEFAULT_BATCHING})",
    )
    parser.add_argument("--only", choices=("constant", "batching"), help="one server only")
    parser.add_argument(
        "--locust-venv",
        type=Path,
        default=DEFAULT_LOCUST_VENV,
        help=f"Locust's own venv, created on first use ({DEFAULT_LOCUST_VENV})",
    )
    parser.add_argument(
        "--server",
        choices=("auto", "nginx", "aiohttp"),
        default="auto",
        help="the constant server: nginx if found (auto), or the aiohttp fallback",
    )
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (1 if args.smoke else 15)
    args.batch_seconds = args.batch_seconds or (2 if args.smoke else 15)
    args.connections = args.connections or (8 if args.smoke else 64)
    args.rounds = args.rounds or (1 if args.smoke else 3)
    args.batch_rounds = args.batch_rounds or (1 if args.smoke else 5)
    args.warmup = 0.5 if args.smoke else 2.0
    load1, _, _ = os.getloadavg()
    print(
        f"# http_load: Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load1:.2f}; code: {code_id()}; constant server {args.seconds} s per tool, "
        f"{args.connections} connections, {args.rounds} round(s); batching server "
        f"{args.batch_seconds} s per tool, {args.batch_connections} connections, "
        f"{args.batch_rounds} round(s); optlab warmup {args.warmup:g} s; the tools interleaved",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="optlab-http-load-") as tmp:
        workdir = Path(tmp)
        if args.only in (None, "constant"):
            constant_section(args, workdir)
        if args.only in (None, "batching"):
            batching_section(args, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
