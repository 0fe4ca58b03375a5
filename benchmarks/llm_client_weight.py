"""How much CPU optlab's streaming client spends per output token, against a peer client (NVIDIA
AIPerf) driving the same token streamer at 32 concurrent streams in the same run.

The streamer (`optlab.reference.streamer`): 32 slots, a 10 ms decode step, 128 output tokens
per request (one per event), 32 input tokens: 3,200 tokens/s at 32 streams, whoever drives
it. Each client is run twice, a short and a long invocation, and its CPU (user + system of its
whole process tree, from `wait4`) per output token is the difference of the two over the
difference of their tokens: start-up, imports and reports cancel out, what is left is the
cost of streaming. optlab: `optlab run` (closed loop, 32 clients, quick protocol, 1 s warmup,
3 s then 25 s measured; tokens = the measured phase's, the warmups being equal). AIPerf:
`aiperf profile --streaming --concurrency 32` with 64 then 640 requests (tokens = requests x
128), a word-level tokenizer on disk (`/tmp`, built with `tokenizers`: every word one token, as
the streamer counts them).

Goal: optlab's CPU per output token at most 0.5x AIPerf's. The same run also sets each
client's same-definition figures against the streamer's own log (`GET /truth`, reset before
each run): TTFT P50/P99 (first event's write minus the request's arrival) and the per-request
mean ITL ((last - first) / (n - 1), AIPerf's `inter_token_latency`), within max(1 ms, 3%).
AIPerf is installed in its own virtual environment (`pip install aiperf`; default `/tmp/peer`,
`--peer-venv`); without it the benchmark says so and measures optlab alone. A measurement,
not a test.

Run: ``PYTHONPATH=src python benchmarks/llm_client_weight.py [--peer-venv /tmp/peer]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
STREAMS, OUTPUT_TOKENS, INPUT_TOKENS, DECODE_MS = 32, 128, 32, 10.0
OPTLAB_SECONDS = (3.0, 25.0)
AIPERF_REQUESTS = (64, 640)


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cpu_of(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    """(CPU seconds of the command and every descendant it waited for, its stdout)."""
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {proc.returncode}: {text[-1500:]}")
    return usage.ru_utime + usage.ru_stime, text


def optlab_run(port: int, seconds: float, folder: Path) -> tuple[float, int, dict[str, Any]]:
    """(CPU seconds, output tokens of the measured phase, its `llm` section) of one run."""
    experiment = folder / f"weight-{seconds:g}.yaml"
    experiment.write_text(
        f"name: weight-{int(seconds)}\n"
        f'target: {{kind: openai, url: "http://127.0.0.1:{port}/v1", model: optlab-streamer}}\n'
        "workload:\n"
        f"  load: {{mode: closed, concurrency: {STREAMS}}}\n"
        f"  prompts: {{input_tokens: {INPUT_TOKENS}, output_tokens: {OUTPUT_TOKENS}}}\n"
        f"protocol: {{name: quick, warmup_s: 1, duration_s: {seconds:g}}}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    argv = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{folder}/w.db", "run",
            str(experiment), "--json", "--allow-invalid"]  # fmt: skip
    cpu, text = _cpu_of(argv, env, folder)
    summary = json.loads([line for line in text.splitlines() if line.startswith("{")][-1])
    return cpu, int(summary["llm"]["output_tokens"]), summary["llm"]


def aiperf_run(
    venv: Path, port: int, requests: int, folder: Path, tokenizer: Path
) -> tuple[float, dict[str, Any]]:
    """(CPU seconds, its JSON export) of one `aiperf profile`."""
    argv = [
        str(venv / "bin" / "aiperf"), "profile", "--url", f"http://127.0.0.1:{port}",
        "--endpoint-type", "completions", "--streaming", "-m", "optlab-streamer",
        "--tokenizer", str(tokenizer), "--concurrency", str(STREAMS),
        "--request-count", str(requests), "--prompt-input-tokens-mean", str(INPUT_TOKENS),
        "--prompt-input-tokens-stddev", "0", "--prompt-output-tokens-mean", str(OUTPUT_TOKENS),
        "--prompt-output-tokens-stddev", "0", "--extra-inputs", "ignore_eos:true",
        "--output-artifact-dir", str(folder / f"aiperf-{requests}"), "--no-server-metrics",
        "--no-gpu-telemetry", "--no-auto-plot", "--ui-type", "none",
    ]  # fmt: skip
    cpu, _ = _cpu_of(argv, dict(os.environ), folder)
    export = folder / f"aiperf-{requests}" / "profile_export_aiperf.json"
    return cpu, json.loads(export.read_text())


def _truth(port: int, reset: bool = False) -> dict[str, tuple[float, float]]:
    """The server's own TTFT (first event's write - arrival) and per-request mean ITL
    ((last - first event) / (events - 1)), P50 and P99 in ms, over its log since the reset."""
    base = f"http://127.0.0.1:{port}"
    if reset:
        request = urllib.request.Request(base + "/truth/reset", data=b"", method="POST")
        urllib.request.urlopen(request, timeout=10).close()
        return {}
    with urllib.request.urlopen(base + "/truth", timeout=30) as response:
        log = json.load(response)
    ttft = [(r["events"][0][0] - r["arrived_ns"]) / 1e6 for r in log if r["events"]]
    itl = [
        (r["events"][-1][0] - r["events"][0][0]) / 1e6 / (len(r["events"]) - 1)
        for r in log
        if len(r["events"]) > 1
    ]
    return {
        "ttft": (float(np.percentile(ttft, 50)), float(np.percentile(ttft, 99))),
        "itl_mean": (float(np.percentile(itl, 50)), float(np.percentile(itl, 99))),
    }


def _compare(name: str, client: dict[str, tuple[float, float]], server: dict[str, Any]) -> None:
    """One client's same-definition figures against the server's log."""
    cells = []
    for key, label in (("ttft", "TTFT"), ("itl_mean", "ITL (per-request mean)")):
        for index, pct in enumerate(("P50", "P99")):
            mine, truth = client[key][index], server[key][index]
            ok = abs(mine - truth) <= max(1.0, 0.03 * truth)
            cells.append(f"{label} {pct} {mine:.2f}/{truth:.2f}{'' if ok else ' MISS'}")
    print(f"  {name} (client/server ms): " + "; ".join(cells))


def word_tokenizer(venv: Path, folder: Path) -> Path:
    """A Hugging Face tokenizer on disk whose tokens are whitespace-separated words."""
    path = folder / "word-tokenizer"
    script = (
        "from tokenizers import Tokenizer, models, pre_tokenizers, decoders\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "vocab = {'[UNK]': 0, '[EOS]': 1, **{w: i + 2 for i, w in enumerate("
        "'the of and to a in is that for it'.split())}}\n"
        "tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token='[UNK]'))\n"
        "tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()\n"
        "tok.decoder = decoders.WordPiece(prefix='##')\n"
        "PreTrainedTokenizerFast(tokenizer_object=tok, unk_token='[UNK]', eos_token='[EOS]')"
        f".save_pretrained({str(path)!r})\n"
    )
    subprocess.run([str(venv / "bin" / "python"), "-c", script], check=True, capture_output=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--peer-venv", type=Path, default=Path("/tmp/peer"))
    args = parser.parse_args()
    port = _port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    server = subprocess.Popen(
        [sys.executable, "-m", "optlab.reference.streamer", "--port", str(port),
         "--slots", str(STREAMS), "--decode-base-ms", str(DECODE_MS)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )  # fmt: skip
    assert server.stdout is not None
    server.stdout.readline()
    print(
        f"# llm_client_weight: {STREAMS} streams, {OUTPUT_TOKENS} tokens x {DECODE_MS:g} ms "
        f"({STREAMS * 1000 / DECODE_MS:,.0f} tokens/s); 2 CPUs, load average "
        f"{os.getloadavg()[0]:.2f}"
    )
    try:
        with tempfile.TemporaryDirectory() as name:
            folder = Path(name)
            runs = []
            for seconds in OPTLAB_SECONDS:
                _truth(port, reset=True)
                runs.append(optlab_run(port, seconds, folder))
            ours_truth = _truth(port)
            (cpu_a, tok_a, _), (cpu_b, tok_b, llm) = runs
            ours = (cpu_b - cpu_a) / (tok_b - tok_a)
            print(
                f"optlab run: {cpu_a:.2f} s CPU / {tok_a:,} tokens, {cpu_b:.2f} s / {tok_b:,}: "
                f"{ours * 1e6:.1f} us CPU per output token"
            )
            aiperf = args.peer_venv / "bin" / "aiperf"
            if not aiperf.exists():
                print(f"AIPerf not installed at {aiperf} (pip install aiperf in its own venv)")
                return
            tokenizer = word_tokenizer(args.peer_venv, folder)
            peer = []
            for n in AIPERF_REQUESTS:
                _truth(port, reset=True)
                peer.append(aiperf_run(args.peer_venv, port, n, folder, tokenizer))
            theirs_truth = _truth(port)
            cpus = [cpu for cpu, _ in peer]
            export = peer[-1][1]
            tokens = [n * OUTPUT_TOKENS for n in AIPERF_REQUESTS]
            theirs = (cpus[1] - cpus[0]) / (tokens[1] - tokens[0])
            print(
                f"aiperf profile: {cpus[0]:.2f} s CPU / {tokens[0]:,} tokens, {cpus[1]:.2f} s / "
                f"{tokens[1]:,}: {theirs * 1e6:.1f} us CPU per output token"
            )
            ratio = ours / theirs
            verdict = "PASS" if ratio <= 0.5 else "MISS"
            print(f"optlab / AIPerf: {ratio:.2f}x  {verdict} (goal <= 0.5x)")
            print("same-definition figures of each long run against the server's log, "
                  "within max(1 ms, 3%):")  # fmt: skip

            def of(section: dict[str, Any]) -> tuple[float, float]:
                return float(section["p50"]), float(section["p99"])

            mine = {"ttft": of(llm["ttft_ms"]), "itl_mean": of(llm["itl_request_mean_ms"])}
            _compare("optlab", mine, ours_truth)
            peers = {
                "ttft": of(export["time_to_first_token"]),
                "itl_mean": of(export["inter_token_latency"]),
            }
            _compare("AIPerf", peers, theirs_truth)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=10)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
