"""A held-out check of `optlab sweep` on a batching server no one here wrote: LitServe.

A two-step chain on a LitServe server of a small torch MLP: the baseline serves one request
per forward pass (`max_batch_size: 1`), the step turns batching on (`max_batch_size: 8`, the
batch timeout fixed at 5 ms in both). Each step is swept closed-loop, then open-loop, under
`--slo p99=100ms` (`optlab sweep --chain`, quick levels), and the stacked table is read back.

Goals (the open loop's capacity is a rate the server sustains within the SLO; the closed
loop's is the throughput its best number of clients gets within it, so on a server that does
not lose throughput to more connections in flight the two agree):
- each step's open-loop capacity within 15% of its closed-loop capacity;
- the table's capacity column calls the batching step a gain.

LitServe is not a dependency of optlab. Install it in a separate environment, torch pinned:

    python -m venv /tmp/ls && /tmp/ls/bin/pip install litserve torch==2.13.0
    PYTHONPATH=src python benchmarks/held_out_litserve.py --python /tmp/ls/bin/python

(~15 minutes on 2 cores: four sweeps). Without litserve the script says so and exits 2.

Then a peer that is not optlab's generator: an open-loop Poisson client written on aiohttp
(`poisson_p99`, latency from each request's intended send time, as wrk2 counts it) drives a
fresh baseline server at the open sweep's capacity, at 1.15x it, and at 85% of the closed
sweep's: whether the server itself sustains those rates within the SLO, whoever sends them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SLO_MS = 100.0
GOAL_RATIO = 0.15
FEATURES = 256

SERVER = '''\
"""A LitServe server of a torch MLP: python server.py PORT MAX_BATCH_SIZE."""
import sys

import litserve as ls
import torch

torch.set_num_threads(1)


class MLP(ls.LitAPI):
    def setup(self, device):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Linear({features}, 1024), torch.nn.ReLU(),
            torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
            torch.nn.Linear(1024, 10),
        ).eval()

    def decode_request(self, request):
        return torch.tensor(request["x"], dtype=torch.float32)

    def batch(self, inputs):
        return torch.stack(inputs)

    def predict(self, x):
        with torch.inference_mode():
            return self.model(x if x.dim() == 2 else x.unsqueeze(0))

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        return {{"class": int(output.reshape(-1, 10)[0].argmax())}}


if __name__ == "__main__":
    port, batch = int(sys.argv[1]), int(sys.argv[2])
    api = MLP(max_batch_size=batch, batch_timeout=0.005)
    ls.LitServer(api, accelerator="cpu", workers_per_device=1).run(
        port=port, log_level="warning", generate_client_file=False
    )
'''

BASELINE = """\
name: litserve-baseline
description: LitServe, torch MLP, one request per forward pass
target:
  kind: command
  command: ["{python}", "{server}", "{port}", "{{knobs.max_batch_size}}"]
  url: "http://127.0.0.1:{port}/predict"
  health_url: "http://127.0.0.1:{port}/health"
  method: POST
  ready_timeout_s: 180
knobs: {{max_batch_size: 1}}
workload:
  load: {{mode: open, rate: 10, arrival: poisson}}
  inputs: {{template: {template}, count: 1}}
protocol: {{name: quick}}
"""

STEP = """\
name: litserve-batching
parent: litserve-baseline
hypothesis: one forward pass over up to 8 requests costs far less than 8 passes
change:
  max_batch_size: 8
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def optlab(db: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{db}", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd, timeout=3600)


def sweep(db: Path, step: Path, mode: str) -> list[dict[str, Any]]:
    started = time.monotonic()
    done = optlab(
        db, "sweep", str(step), "--chain", "--mode", mode, "--slo", f"p99={SLO_MS:g}ms",
        "--quick", "--json", cwd=step.parent,
    )  # fmt: skip
    if done.returncode not in (0, 1):
        raise SystemExit(f"optlab sweep --mode {mode} failed ({done.returncode}):\n{done.stderr}")
    documents = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    print(f"# {mode} sweeps: {time.monotonic() - started:.0f} s, load {os.getloadavg()[0]:.2f}")
    for d in documents:
        iv = d.get("capacity_interval") or [0, 0]
        print(
            f"  {d['experiment']:<18} {mode:<6} capacity {d['capacity_qps'] or 0:8.1f}/s "
            f"[{iv[0]:.1f}, {iv[1]:.1f}] limited by {d.get('limited_by')}: {d['message']}"
        )
    return documents


async def _poisson(url: str, body: bytes, rate: float, seconds: float, seed: int) -> list[float]:
    import aiohttp

    rng = random.Random(seed)
    latencies: list[float] = []

    async def one(session: aiohttp.ClientSession, intended: float) -> None:
        headers = {"Content-Type": "application/json"}
        async with session.post(url, data=body, headers=headers) as response:
            await response.read()
            if response.status == 200:
                latencies.append(time.perf_counter() - intended)

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        intended = start = time.perf_counter() + 0.1
        tasks = []
        while intended < start + seconds:
            intended += rng.expovariate(rate)
            wait = intended - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(session, intended)))
        await asyncio.gather(*tasks, return_exceptions=True)
    return latencies


def poisson_p99(python: str, server: Path, body: bytes, rate: float, seconds: float = 8.0) -> str:
    """P50/P99 of a fresh baseline server under Poisson arrivals at `rate`, sent by aiohttp."""
    port = free_port()
    process = subprocess.Popen(
        [python, str(server), str(port), "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        import urllib.request

        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    return "the server did not come up"
                time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/predict"
        asyncio.run(_poisson(url, body, rate, 2.0, seed=1))  # warm up
        done = sorted(asyncio.run(_poisson(url, body, rate, seconds, seed=2)))
    finally:
        process.terminate()
        process.wait(30)
    if len(done) < 100:
        return f"{len(done)} requests answered"
    n = len(done)
    p50, p99 = done[n // 2] * 1e3, done[min(n - 1, int(n * 0.99))] * 1e3
    verdict = "meets" if p99 <= SLO_MS else "misses"
    return f"{n / seconds:.1f}/s answered, P50 {p50:.1f} ms, P99 {p99:.1f} ms: {verdict} the SLO"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="an interpreter with litserve")
    args = parser.parse_args(argv)
    probe = subprocess.run(
        [args.python, "-c", "import litserve, torch; print(litserve.__version__)"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode != 0:
        print(
            f"{args.python} cannot import litserve and torch: install them in a separate "
            "environment (see this file's docstring) and pass --python",
            file=sys.stderr,
        )
        return 2
    print(
        f"# LitServe {probe.stdout.strip()}, SLO P99 <= {SLO_MS:g} ms, quick levels, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory(prefix="held-out-litserve-") as tmp:
        folder = Path(tmp)
        server = folder / "server.py"
        server.write_text(SERVER.format(features=FEATURES), encoding="utf-8")
        template = json.dumps({"x": [round(0.01 * (i % 97), 2) for i in range(FEATURES)]})
        (folder / "baseline.yaml").write_text(
            BASELINE.format(python=args.python, server=server, port=free_port(),
                            template=template),
            encoding="utf-8",
        )  # fmt: skip
        step = folder / "batching.yaml"
        step.write_text(STEP, encoding="utf-8")
        db = folder / "optlab.db"
        closed = {d["experiment"]: d for d in sweep(db, step, "closed")}
        opened = {d["experiment"]: d for d in sweep(db, step, "open")}
        print("# open-loop capacity / closed-loop capacity (goal: within 15%)")
        met = True
        for name, c in closed.items():
            o = opened.get(name, {})
            if not (c.get("capacity_qps") and o.get("capacity_qps")):
                print(f"  {name}: no capacity to compare (closed {c.get('capacity_qps')}, "
                      f"open {o.get('capacity_qps')})")  # fmt: skip
                met = False
                continue
            ratio = o["capacity_qps"] / c["capacity_qps"]
            ok = abs(ratio - 1) <= GOAL_RATIO
            met &= ok
            print(f"  {name}: {o['capacity_qps']:.1f} / {c['capacity_qps']:.1f} = {ratio:.2f}x "
                  + ("PASS" if ok else "MISS"))  # fmt: skip
        table = optlab(db, "table", "litserve-batching", "--slo", f"p99={SLO_MS:g}ms",
                       "--format", "json", cwd=folder)  # fmt: skip
        if table.returncode != 0:
            raise SystemExit(f"optlab table failed ({table.returncode}):\n{table.stderr}")
        entries = json.loads(table.stdout)["chain"]
        print("# the stacked table's capacity column (the newest sweep: open loop)")
        for entry in entries:
            cap = entry.get("capacity") or {}
            print(
                f"  {entry['experiment']:<18} capacity {cap.get('qps') or 0:8.1f}/s "
                f"loop {cap.get('loop')} verdict {cap.get('verdict')} "
                f"significant {cap.get('significant')} {cap.get('reason') or ''}"
            )
        base = "litserve-baseline"
        if closed.get(base, {}).get("capacity_qps") and opened.get(base, {}).get("capacity_qps"):
            print("# the baseline server under Poisson arrivals from aiohttp (not optlab)")
            body = template.encode()
            for label, rate in (
                ("the open sweep's capacity", opened[base]["capacity_qps"]),
                ("1.15x the open sweep's capacity", 1.15 * opened[base]["capacity_qps"]),
                ("85% of the closed sweep's capacity", 0.85 * closed[base]["capacity_qps"]),
            ):
                shown = poisson_p99(args.python, server, body, rate)
                print(f"  {rate:7.1f}/s ({label}): {shown}")
        gain = entries[-1].get("capacity", {}).get("verdict") == "gain"
        print("the table calls batching a capacity gain: " + ("PASS" if gain else "MISS"))
        return 0 if met and gain else 1


if __name__ == "__main__":
    raise SystemExit(main())
