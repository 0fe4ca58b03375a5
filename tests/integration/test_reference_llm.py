"""The reference LLM (`optlab.reference.llm`): its KV cache computes what recomputing does, every
knob leaves a greedy answer as it is while changing the work behind it, and its server speaks
the OpenAI streaming protocol a client reads."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import Result

from optlab.reference.llm.engine import Engine, Sequence
from optlab.reference.llm.knobs import LlmKnobs
from optlab.reference.llm.model import KVCache, load_reference
from optlab.reference.llm.tokenizer import EOS
from optlab.reference.serve_knobs import assemble_knobs
from optlab.targets.sse import SseReader, StreamResult
from tests.support.diagnosing import diagnosed
from tests.support.files import write
from tests.support.httpsvc import summary_of
from tests.support.proc import free_port, kill_group, wait_listening

PROMPTS = [
    "The for statement is used to iterate over the elements of a sequence",
    "A class definition defines a class object",
    "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20",
]


def _run(knobs: LlmKnobs, sequences: list[Sequence], timeout_s: float = 120) -> list[Sequence]:
    """Every sequence through an engine with `knobs`; they come back finished."""
    model, _ = load_reference()
    done: list[Sequence] = []
    engine = Engine(knobs, model, lambda _out, finished: done.extend(finished))
    engine.start()
    try:
        for seq in sequences:
            engine.submit(seq)
        deadline = time.monotonic() + timeout_s
        while len(done) < len(sequences):
            assert time.monotonic() < deadline, f"{len(done)} of {len(sequences)} finished"
            time.sleep(0.01)
    finally:
        engine.stop()
    return done


def _sequences(max_tokens: int = 12, shared: str = "") -> list[Sequence]:
    _, tokenizer = load_reference()
    return [
        Sequence(ids=[EOS, *tokenizer.encode(shared + p)], max_tokens=max_tokens, ignore_eos=True)
        for p in PROMPTS
    ]


def test_the_kv_cache_computes_what_recomputing_does() -> None:
    model, tokenizer = load_reference()
    ids = [EOS, *tokenizer.encode(PROMPTS[0])]
    with torch.inference_mode():
        full = model.last_logits(torch.tensor([ids]), torch.tensor([len(ids)]))[0]
        cache = KVCache(model.config, 2, torch.float32)
        model.prefill(ids[:5], cache, 1, 0)  # in two chunks, into slot 1
        chunked = model.prefill(ids[5:], cache, 1, 5)
        assert torch.allclose(chunked, full, atol=1e-4)
        following = int(full.argmax())
        decoded = model.decode([following], cache, [1], [len(ids)])[0]
        again = model.last_logits(torch.tensor([[*ids, following]]), torch.tensor([len(ids) + 1]))
        assert torch.allclose(decoded, again[0], atol=1e-4)


@pytest.mark.parametrize(
    "knobs",
    [
        {"kv_cache": True, "batching": {"mode": "continuous", "max_num_seqs": 2}},
        {"kv_cache": True, "batching": {"mode": "static", "max_num_seqs": 3}},
        {"kv_cache": True, "chunked_prefill": 4, "batching": {"mode": "continuous"}},
        {"kv_cache": True, "prefix_cache": True},
        {"kv_cache": False, "batching": {"mode": "continuous", "max_num_seqs": 3}},
    ],
    ids=["continuous", "static", "chunked", "prefix-cache", "no-cache-batched"],
)
def test_every_knob_keeps_the_greedy_answers(knobs: dict[str, Any]) -> None:
    """The naive server's answers (no cache, one at a time) are the reference: a serving knob
    changes how the work is done, never what comes out (fp32)."""
    reference = _run(LlmKnobs(kv_cache=False), _sequences())
    found = _run(LlmKnobs.model_validate(knobs), _sequences())
    by_prompt = {tuple(s.ids): s.tokens for s in reference}
    for seq in found:
        assert len(seq.tokens) == 12 and seq.finish_reason == "length"
        assert seq.tokens == by_prompt[tuple(seq.ids)]


def test_the_prefix_cache_skips_a_shared_system_prompt() -> None:
    shared = " ".join(["You are a helpful assistant."] * 8) + " "  # 40 words
    first = _sequences(4, shared)
    knobs = LlmKnobs(prefix_cache=True)
    model, _ = load_reference()
    engine = Engine(knobs, model, lambda _o, _f: None)
    engine.start()
    try:
        for seq in first:
            engine.submit(seq)
        deadline = time.monotonic() + 60
        while engine.stats.requests < len(first):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        engine.stop()
    # The first request fills the cache, the next two copy its 2 whole blocks (32 of the 41
    # shared positions: the third block ends in each prompt's own words).
    assert [s.cached for s in first] == [0, 32, 32]
    assert engine.stats.prefix_hit_tokens == 64
    assert engine.stats.prefill_tokens == sum(s.prompt_len for s in first) - 64


def test_static_batching_admits_no_newcomer_until_its_batch_ends() -> None:
    sequences = _sequences(8)
    knobs = LlmKnobs(batching={"mode": "static", "max_num_seqs": 2})
    done = _run(knobs, sequences)
    first_two, third = sequences[:2], sequences[2]
    assert third.admitted_ns >= max(s.first_ns for s in first_two)
    assert [s.finish_reason for s in done] == ["length"] * 3
    continuous = _sequences(8)
    _run(LlmKnobs(batching={"mode": "continuous", "max_num_seqs": 3}), continuous)
    assert len({s.admitted_ns for s in continuous}) <= 2  # all three admitted at once or so


def test_knobs_the_server_cannot_serve_are_refused_by_name() -> None:
    with pytest.raises(Exception, match="prefix_cache need"):
        assemble_knobs({"kv_cache": "false", "prefix_cache": "true"}, LlmKnobs, "reference LLM")
    with pytest.raises(Exception, match="--precision"):
        assemble_knobs({"precision": "fp8"}, LlmKnobs, "reference LLM")
    knobs = assemble_knobs(
        {"batching": '{"mode":"continuous","max_num_seqs":4}', "threads": "2"}, LlmKnobs
    )
    assert knobs["batching"] == {"mode": "continuous", "max_num_seqs": 4}
    assert knobs["threads"] == 2
    bad = subprocess.run(
        [sys.executable, "-m", "optlab.reference.llm.server", "--batching", "sometimes"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert "--batching" in bad.stderr and "batching modes are off, static, continuous" in bad.stderr


def _read(raw: bytes, max_tokens: int) -> StreamResult:
    """The stream as optlab's client reads it (exactly `max_tokens`, or an error)."""
    reader = SseReader(0, max_tokens=max_tokens, exact=True)
    reader.feed(raw, 1)
    return reader.result()


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_the_server_streams_words_with_usage_timings_and_metrics() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "optlab.reference.llm.server", "--port", str(port),
         "--batching", "continuous", "--prefix-cache", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_listening(port, timeout_s=120)
        base = f"http://127.0.0.1:{port}"
        body = {
            "model": "optlab-tiny-lm",
            "prompt": PROMPTS[1],
            "max_tokens": 9,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        }
        status, raw = _post(base + "/v1/completions", body)
        assert status == 200
        result = _read(raw, 9)
        assert result.usage_tokens == 9 and result.finish_reason == "length"
        assert [tokens for _, tokens in result.timing.events] == [1] * 9  # a word per event
        assert result.timing.input_tokens == len(PROMPTS[1].split())
        tail = [json.loads(line[6:]) for line in raw.decode().splitlines() if '"timings"' in line]
        assert tail[0]["timings"]["predicted_n"] == 9
        chat = {**body, "messages": [{"role": "user", "content": "hi"}]}
        status, raw = _post(base + "/v1/chat/completions", chat)
        assert status == 200 and _read(raw, 9).usage_tokens == 9
        status, raw = _post(base + "/v1/completions", {**body, "max_tokens": 505})
        assert status == 400 and b"context" in raw
        with urllib.request.urlopen(base + "/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert 'optlab:generation_tokens_total{model_name="optlab-tiny-lm"} 18' in metrics
        assert "optlab:num_requests_running" in metrics and "kv_cache_usage_perc" in metrics
        with urllib.request.urlopen(base + "/stats", timeout=10) as response:
            stats = json.loads(response.read())
        assert stats["requests"] == 2 and stats["output_tokens"] == 18
    finally:
        kill_group(proc)


def test_a_client_that_goes_away_mid_answer_frees_its_slot() -> None:
    """A closed connection cancels its sequence at the next step: the one slot is free for the
    next request, which is served at once rather than after 400 tokens of nobody's answer."""
    import socket

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "optlab.reference.llm.server", "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_listening(port, timeout_s=120)
        body = json.dumps(
            {"prompt": "The for statement", "max_tokens": 400, "stream": True, "ignore_eos": True}
        ).encode()
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        with socket.create_connection(("127.0.0.1", port)) as gone:
            gone.sendall(head % len(body) + body)
            read = b""
            while b"data: " not in read:  # its first token, then the client leaves
                chunk = gone.recv(65536)
                assert chunk, "the server closed before the first token"
                read += chunk
        base = f"http://127.0.0.1:{port}"
        short = {"prompt": "hi", "max_tokens": 5, "stream": True, "ignore_eos": True}
        status, raw = _post(base + "/v1/completions", short)
        assert status == 200 and raw.count(b"data: ") == 7  # 5 tokens, the end, [DONE]
        with urllib.request.urlopen(base + "/stats", timeout=10) as response:
            stats = json.loads(response.read())
        # Only the second request finished; the first was dropped long before its 400 tokens.
        assert stats["requests"] == 1 and stats["steps"] < 300  # 400 + 5 had it run out
    finally:
        kill_group(proc)


def test_a_real_engine_shows_its_prefill_and_its_batch_to_diagnose(
    tmp_path: Path, invoke: Callable[..., Result]
) -> None:
    """The reference LLM under Poisson arrivals with prompts of 16 to 400 words: its prefill
    is a real forward pass over the prompt, and a decode step of several sequences costs more
    than one, so both lines a run keeps rise, and diagnose names them."""
    port = free_port()
    path = write(
        tmp_path,
        "engine.yaml",
        "name: engine\n"
        "target:\n"
        f"  kind: openai\n  url: 'http://127.0.0.1:{port}/v1'\n  api: completions\n"
        "  model: optlab-tiny-lm\n  ignore_eos: true\n"
        f"  command: ['{{python}}', '-m', 'optlab.reference.llm.server', '--port', '{port}',\n"
        "            '--kv-cache', 'true', '--batching', '{knobs.batching}']\n"
        f"  health_url: 'http://127.0.0.1:{port}/health'\n  ready_timeout_s: 120\n"
        "knobs:\n  batching: {mode: continuous, max_num_seqs: 8}\n"
        "workload:\n  load: {mode: open, rate: 8, arrival: poisson}\n"
        "  prompts: {input_tokens: {dist: uniform, min: 16, max: 400}, output_tokens: 32}\n"
        "protocol: {name: quick, warmup_s: 2, duration_s: 12}\n",
    )
    result = invoke("run", str(path), "--json", "--allow-invalid")
    assert result.exit_code == 0, result.output
    llm: Any = summary_of(result)["llm"]
    prefill, batch = llm["ttft_by_input"], llm["itl_by_running"]
    # Each slope positive beyond its noise (its t statistic from R² and the count): a busy
    # machine widens the scatter but the prompt's cost and the batch's stay. 32 tokens an
    # answer (not 16): each request's median ITL spans twice the steps and more sequences
    # decode together, so the batch's line stands beside `stress-ng --cpu 4` (t 13-18, where
    # 16 tokens gave 1.4); the prefill's t was 9.3 quiet, 7.4 / 4.7-6.6 beside --cpu 2 / 4.
    assert prefill is not None and slope_t(prefill) > 2.5, prefill
    assert batch is not None and slope_t(batch) > 2.0, batch
    document = diagnosed(invoke, "engine")
    # Both rules read their lines (whether they fire depends on how busy the machine is:
    # tests/integration/test_openai_target.py fires them on the streamer's exact timing).
    skipped = {n["rule"] for n in document["not_evaluated"]}
    assert not skipped & {"llm-prefill-bound", "llm-decode-bound"}, document["not_evaluated"]


def slope_t(line: dict[str, Any]) -> float:
    """The least-squares slope's t statistic, signed: r √(n − 2) / √(1 − r²)."""
    r2, n = line["r2"], line["requests"]
    sign = 1.0 if line["slope"] > 0 else -1.0
    return sign * math.sqrt(r2 * (n - 2) / max(1e-12, 1 - r2))
