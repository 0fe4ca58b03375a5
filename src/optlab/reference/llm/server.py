"""The reference LLM served OpenAI-compatibly (docs/reference-llm.md):
``python -m optlab.reference.llm.server --port 8200 --kv-cache true --batching continuous``.

`POST /v1/completions` and `/v1/chat/completions` stream (`stream: true`) one word per event;
with `stream_options.include_usage` the last chunk carries `usage` and the server's `timings`
for the request (queue, prompt and decode time, prompt tokens computed and copied from the
prefix cache). `ignore_eos`, `min_tokens`, `temperature` and `seed` are honoured. A prompt is
words (`<unk>` where a word is not in the vocabulary); prompt + `max_tokens` must fit the
model's context. `GET /metrics` is Prometheus text (running and waiting requests, KV-cache
usage, prefix-cache queries and hits, preemptions, tokens); `GET /stats` the same counters as
JSON (an experiment's `metrics_url`), `POST /stats/reset` zeroes them; `GET /engine` the
knobs and the model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from optlab.errors import OptlabError
from optlab.reference.llm.engine import Engine, Sequence, Stats
from optlab.reference.llm.knobs import LlmKnobs
from optlab.reference.llm.model import load_reference
from optlab.reference.llm.tokenizer import EOS
from optlab.reference.openai_http import (
    Connection,
    GenerateRequest,
    Listener,
    OpenAIServer,
    closing_events,
    delta_event,
    serve_until_signalled,
)
from optlab.reference.serve_knobs import assemble_knobs, knobs_summary

__all__ = ["LlmServer", "main"]

MODEL = "optlab-tiny-lm"


class LlmServer(OpenAIServer):
    model = MODEL

    def __init__(self, knobs: LlmKnobs) -> None:
        model, self.tokenizer = load_reference()
        self.max_len = model.config.max_len
        self.max_tokens = self.max_len - 1
        self.knobs = knobs
        self.engine = Engine(knobs, model, self._emit)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.preemptions = 0  # the engine never preempts: a sequence keeps its slot to the end
        self.params = sum(p.numel() for p in model.parameters())

    def warm_up(self) -> None:
        """A few forward passes before the port opens: the first requests measured are not
        the ones that page the weights in."""
        finished: list[Sequence] = []
        original = self.engine.emit
        self.engine.emit = lambda _out, done: finished.extend(done)
        self.engine.start()
        for _ in range(2):
            self.engine.submit(Sequence(ids=[EOS] * 17, max_tokens=4, ignore_eos=True))
        deadline = time.monotonic() + 60
        while len(finished) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        self.engine.emit = original
        self.engine.stats = Stats()

    async def start(self, host: str, port: int) -> Listener:
        self.loop = asyncio.get_running_loop()
        return await super().start(host, port)

    def stop(self) -> None:
        self.engine.stop()

    def generate(self, conn: Connection, request: GenerateRequest, arrived: int) -> None:
        ids = [EOS, *self.tokenizer.encode(request.prompt)]
        if len(ids) + request.max_tokens > self.max_len:
            conn.bad(
                f"prompt ({len(ids) - 1} tokens) + max_tokens ({request.max_tokens}) exceeds "
                f"the model's context of {self.max_len - 1} tokens"
            )
            return
        seq = Sequence(
            ids=ids,
            max_tokens=request.max_tokens,
            min_tokens=request.min_tokens,
            ignore_eos=request.ignore_eos,
            temperature=request.temperature,
            seed=request.seed,
            arrived_ns=arrived,
            context=(conn.open_stream(), request),
        )
        self.engine.submit(seq)

    def _emit(self, out: list[tuple[Sequence, list[int]]], finished: list[Sequence]) -> None:
        """On the engine thread: hand one step's tokens and ends to the event loop."""
        assert self.loop is not None
        self.loop.call_soon_threadsafe(self._write, out, finished)

    def _write(self, out: list[tuple[Sequence, list[int]]], finished: list[Sequence]) -> None:
        for seq, tokens in out:
            stream, request = seq.context
            if stream.closed:
                seq.cancelled = True
                continue
            text = "".join(" " + self.tokenizer.word(t) for t in tokens)
            stream.write(delta_event(MODEL, request.chat, text))
        for seq in finished:
            stream, request = seq.context
            if stream.closed:
                continue
            usage = (seq.prompt_len - 1, len(seq.tokens)) if request.include_usage else None
            stream.write(
                closing_events(
                    MODEL, request.chat, seq.finish_reason or "stop", usage, timings=_timings(seq)
                )
            )
            stream.close()

    def route(self, conn: Connection, method: str, path: str, body: bytes) -> bool:
        if path == "/metrics" and method == "GET":
            conn.respond_bytes(200, self.prometheus().encode(), "text/plain; version=0.0.4")
        elif path == "/stats" and method == "GET":
            conn.respond(200, self.engine.stats.as_dict())
        elif path == "/stats/reset" and method == "POST":
            self.engine.stats = Stats()
            conn.respond(200, {"status": "reset"})
        elif path == "/engine" and method == "GET":
            conn.respond(
                200,
                {
                    "model": MODEL,
                    "parameters": self.params,
                    "max_len": self.max_len,
                    "knobs": self.knobs.model_dump(mode="json"),
                },
            )
        else:
            return False
        return True

    def prometheus(self) -> str:
        """vLLM's metric names under `optlab:` (gauges now, counters since the start)."""
        engine, stats = self.engine, self.engine.stats
        lines = []

        def metric(name: str, kind: str, value: float, help_text: str) -> None:
            lines.append(f"# HELP optlab:{name} {help_text}")
            lines.append(f"# TYPE optlab:{name} {kind}")
            lines.append(f'optlab:{name}{{model_name="{MODEL}"}} {value}')

        metric("num_requests_running", "gauge", len(engine.running), "sequences in the batch")
        metric("num_requests_waiting", "gauge", len(engine.waiting), "requests queued")
        metric(
            "kv_cache_usage_perc",
            "gauge",
            round(engine.kv_usage, 6),
            "KV-cache positions held (1 = full)",
        )
        metric(
            "prefix_cache_queries_total",
            "counter",
            stats.prefix_query_tokens,
            "prompt tokens looked up",
        )
        metric(
            "prefix_cache_hits_total",
            "counter",
            stats.prefix_hit_tokens,
            "prompt tokens found cached",
        )
        metric("num_preemptions_total", "counter", self.preemptions, "sequences preempted")
        metric(
            "prompt_tokens_total",
            "counter",
            stats.prompt_tokens,
            "prompt tokens of finished requests",
        )
        metric("generation_tokens_total", "counter", stats.output_tokens, "tokens generated")
        metric("request_success_total", "counter", stats.requests, "finished requests")
        return "\n".join(lines) + "\n"


def _timings(seq: Sequence) -> dict[str, Any]:
    """The request's server-side times, in llama.cpp's keys where they exist."""
    end = time.monotonic_ns()
    return {
        "queue_ms": (seq.admitted_ns - seq.arrived_ns) / 1e6,
        "prompt_n": seq.prompt_len - seq.cached,
        "cache_n": seq.cached,
        "prompt_ms": seq.prefill_ns / 1e6,
        "predicted_n": len(seq.tokens),
        "predicted_ms": (end - seq.first_ns) / 1e6 if seq.first_ns else 0.0,
        "ttft_ms": (seq.first_ns - seq.arrived_ns) / 1e6 if seq.first_ns else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    for name, info in LlmKnobs.model_fields.items():
        parser.add_argument(
            "--" + name.replace("_", "-"), dest=name, default=None, help=info.description
        )
    args = parser.parse_args(argv)
    try:
        options = {name: getattr(args, name) for name in LlmKnobs.model_fields}
        knobs = LlmKnobs.model_validate(assemble_knobs(options, LlmKnobs, "reference LLM"))
        print(
            f"optlab llm: building {knobs_summary(knobs.model_dump(mode='json'))}",
            file=sys.stderr,
            flush=True,
        )
        server = LlmServer(knobs)
        server.warm_up()
    except OptlabError as exc:
        print(f"optlab llm: {exc}" + (f"\nhint: {exc.hint}" if exc.hint else ""), file=sys.stderr)
        raise SystemExit(2) from None
    serve_until_signalled(server, args.host, args.port, "optlab llm")


if __name__ == "__main__":
    main()
