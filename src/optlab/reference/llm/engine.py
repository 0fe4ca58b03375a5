"""The reference LLM's engine: one thread that schedules sequences and runs the model, a step
at a time, as a serving engine does (docs/reference-llm.md).

A step: admit waiting sequences (batching off: one at a time; static: a batch only when the
last one has finished; continuous: into any free slot), then prefill (with a KV cache: each
admitted prompt into its slot, `chunked_prefill` tokens per step at most, a cached prefix
copied in rather than computed), then one decode pass over every sequence that already has its
first token. Without a KV cache there is no prefill: each step is one forward pass over every
running sequence's whole text, prompt and answer so far, padded to the longest.

Tokens leave through `emit` (called on the engine thread, once per step with that step's
tokens); the server hands them to the event loop.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from optlab.reference.llm.knobs import BatchingOff, LlmKnobs
from optlab.reference.llm.model import KVCache, TinyLM
from optlab.reference.llm.tokenizer import EOS, UNK

__all__ = ["Engine", "Sequence"]

PREFIX_BLOCK = 16  # tokens per prefix-cache block
PREFIX_CAPACITY_BLOCKS = 512  # least recently used blocks are dropped beyond this


@dataclass(eq=False)
class Sequence:
    """One request inside the engine; `ids` starts with `<eos>` (a document's start)."""

    ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    temperature: float = 0.0
    seed: int | None = None
    arrived_ns: int = 0
    context: Any = None  # the server's (its stream)
    slot: int = -1
    prefilled: int = 0  # prompt positions in its slot
    cached: int = 0  # of them, copied from the prefix cache
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cancelled: bool = False  # the client went away
    admitted_ns: int = 0
    first_ns: int = 0
    prefill_ns: int = 0
    _generator: torch.Generator | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.ids)

    def generator(self) -> torch.Generator | None:
        if self.temperature <= 0:
            return None
        if self._generator is None:
            self._generator = torch.Generator()
            if self.seed is None:
                self._generator.seed()
            else:
                self._generator.manual_seed(self.seed)
        return self._generator


@dataclass
class Stats:
    """Counters since the last reset (the /stats endpoint)."""

    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    prefill_tokens: int = 0  # prompt positions computed (not copied from the prefix cache)
    prefix_hit_tokens: int = 0
    prefix_query_tokens: int = 0
    steps: int = 0
    forward_passes: int = 0
    decode_rows: int = 0  # sequences summed over decode passes
    decode_passes: int = 0
    queue_ns: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(vars(self))
        out["mean_decode_batch"] = (
            self.decode_rows / self.decode_passes if self.decode_passes else None
        )
        out["mean_queue_ms"] = self.queue_ns / self.requests / 1e6 if self.requests else None
        out["prefix_hit_rate"] = (
            self.prefix_hit_tokens / self.prefix_query_tokens if self.prefix_query_tokens else None
        )
        del out["queue_ns"]
        return out


class PrefixCache:
    """Keys and values of prompt blocks, keyed by the whole prefix up to the block's end."""

    def __init__(self, capacity: int = PREFIX_CAPACITY_BLOCKS) -> None:
        self.blocks: OrderedDict[tuple[int, ...], tuple[list[torch.Tensor], list[torch.Tensor]]]
        self.blocks = OrderedDict()
        self.capacity = capacity

    def restore(self, seq: Sequence, cache: KVCache) -> int:
        """Copy the longest cached prefix of `seq` (whole blocks, leaving at least its last
        token to compute) into its slot; the tokens restored."""
        n = 0
        while n + PREFIX_BLOCK <= len(seq.ids) - 1:
            found = self.blocks.get(tuple(seq.ids[: n + PREFIX_BLOCK]))
            if found is None:
                break
            self.blocks.move_to_end(tuple(seq.ids[: n + PREFIX_BLOCK]))
            cache.copy_in(seq.slot, n, *found)
            n += PREFIX_BLOCK
        return n

    def remember(self, seq: Sequence, cache: KVCache) -> None:
        for end in range(PREFIX_BLOCK, len(seq.ids) + 1, PREFIX_BLOCK):
            key = tuple(seq.ids[:end])
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            self.blocks[key] = cache.copy_out(seq.slot, end - PREFIX_BLOCK, end)
            if len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)


def prepare(model: TinyLM, precision: str) -> tuple[TinyLM, torch.dtype]:
    """The model at the knob's precision, and the dtype of its activations (the KV cache's)."""
    if precision == "bf16":
        return model.to(torch.bfloat16), torch.bfloat16
    if precision == "int8":
        from torch.ao.quantization import quantize_dynamic

        quantized = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)  # type: ignore[no-untyped-call]
        return quantized, torch.float32
    return model, torch.float32


class Engine:
    """The scheduling loop on its own thread; `submit` from any thread."""

    def __init__(
        self,
        knobs: LlmKnobs,
        model: TinyLM,
        emit: Callable[[list[tuple[Sequence, list[int]]], list[Sequence]], None],
    ) -> None:
        self.knobs = knobs
        self.model, dtype = prepare(model, knobs.precision)
        self.max_len = model.config.max_len
        self.emit = emit
        self.cache = KVCache(model.config, knobs.slots, dtype) if knobs.kv_cache else None
        self.prefix = PrefixCache() if knobs.prefix_cache else None
        self.free = list(range(knobs.slots))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cond = threading.Condition()
        self.stopping = False
        self.stats = Stats()
        self.thread = threading.Thread(target=self._run, name="optlab-llm-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify()
        self.thread.join(timeout=10)

    def submit(self, seq: Sequence) -> None:
        with self.cond:
            self.waiting.append(seq)
            self.cond.notify()

    @property
    def kv_usage(self) -> float:
        """The share of KV-cache positions that running sequences hold (0 without a cache)."""
        if self.cache is None:
            return 0.0
        held = sum(s.prompt_len + len(s.tokens) for s in self.running)
        return held / (self.cache.slots * self.cache.max_len)

    def _run(self) -> None:
        torch.set_num_threads(self.knobs.threads)
        with torch.inference_mode():
            while True:
                with self.cond:
                    while not self.stopping and not self.running and not self.waiting:
                        self.cond.wait()
                    if self.stopping:
                        return
                    self._admit()
                self.step()

    def _admit(self) -> None:
        static = (
            not isinstance(self.knobs.batching, BatchingOff)
            and self.knobs.batching.mode == "static"
        )
        if static and self.running:
            return  # a static batch runs to its end
        now = time.monotonic_ns()
        while self.waiting and self.free:
            seq = self.waiting.popleft()
            if seq.cancelled:
                continue
            seq.slot = self.free.pop()
            seq.admitted_ns = now
            self.stats.queue_ns += now - seq.arrived_ns
            self.running.append(seq)

    def step(self) -> None:
        """One engine step over the running sequences."""
        self.stats.steps += 1
        out: list[tuple[Sequence, list[int]]] = []
        for seq in [s for s in self.running if s.cancelled]:
            self._release(seq)
        if self.cache is None:
            self._recompute(out)
        else:
            fresh = self._prefill(out)
            self._decode([s for s in self.running if s.tokens and s not in fresh], out)
        finished = [s for s in self.running if s.finish_reason is not None]
        for seq in finished:
            self._release(seq)
            self.stats.requests += 1
            self.stats.prompt_tokens += seq.prompt_len - 1
            self.stats.output_tokens += len(seq.tokens)
        if out or finished:
            self.emit(out, finished)

    def _release(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.free.append(seq.slot)

    def _recompute(self, out: list[tuple[Sequence, list[int]]]) -> None:
        """Without a cache: the whole text of every running sequence, again."""
        batch = self.running
        texts = [s.ids + s.tokens for s in batch]
        lengths = torch.tensor([len(t) for t in texts])
        width = int(lengths.max())
        ids = torch.tensor([t + [EOS] * (width - len(t)) for t in texts])
        started = time.monotonic_ns()
        logits = self.model.last_logits(ids, lengths)
        self.stats.forward_passes += 1
        self.stats.decode_passes += 1
        self.stats.decode_rows += len(batch)
        for seq in batch:
            if not seq.tokens:
                seq.prefill_ns = time.monotonic_ns() - started
                self.stats.prefill_tokens += seq.prompt_len
        self._sample(batch, logits, out)

    def _prefill(self, out: list[tuple[Sequence, list[int]]]) -> list[Sequence]:
        """Prompts into their slots, at most `chunked_prefill` tokens this step; the sequences
        that got their first token here."""
        assert self.cache is not None
        budget = self.knobs.chunked_prefill or self.max_len
        done: list[Sequence] = []
        for seq in self.running:
            if seq.prefilled == seq.prompt_len:
                continue
            if budget <= 0:
                break
            started = time.monotonic_ns()
            if seq.prefilled == 0 and self.prefix is not None:
                seq.cached = seq.prefilled = self.prefix.restore(seq, self.cache)
                self.stats.prefix_hit_tokens += seq.cached
                self.stats.prefix_query_tokens += seq.prompt_len
            n = min(seq.prompt_len - seq.prefilled, budget)
            logits = self.model.prefill(
                seq.ids[seq.prefilled : seq.prefilled + n], self.cache, seq.slot, seq.prefilled
            )
            self.stats.forward_passes += 1
            self.stats.prefill_tokens += n
            seq.prefilled += n
            budget -= n
            seq.prefill_ns += time.monotonic_ns() - started
            if seq.prefilled == seq.prompt_len:
                if self.prefix is not None:
                    self.prefix.remember(seq, self.cache)
                self._sample([seq], logits.unsqueeze(0), out)
                done.append(seq)
        return done

    def _decode(self, batch: list[Sequence], out: list[tuple[Sequence, list[int]]]) -> None:
        if not batch:
            return
        assert self.cache is not None
        logits = self.model.decode(
            [s.tokens[-1] for s in batch],
            self.cache,
            [s.slot for s in batch],
            [s.prompt_len + len(s.tokens) - 1 for s in batch],
        )
        self.stats.forward_passes += 1
        self.stats.decode_passes += 1
        self.stats.decode_rows += len(batch)
        self._sample(batch, logits, out)

    def _sample(
        self, batch: list[Sequence], logits: torch.Tensor, out: list[tuple[Sequence, list[int]]]
    ) -> None:
        """Each sequence's next token (greedy at temperature 0); `<unk>` never, `<eos>` only
        once the answer may end (it ends it, and is not sent)."""
        logits = logits.float()
        logits[:, UNK] = float("-inf")
        for row, seq in enumerate(batch):
            if seq.ignore_eos or len(seq.tokens) < seq.min_tokens:
                logits[row, EOS] = float("-inf")
        if all(s.temperature <= 0 for s in batch):
            chosen = logits.argmax(dim=-1).tolist()
        else:
            chosen = []
            for row, seq in enumerate(batch):
                if seq.temperature <= 0:
                    chosen.append(int(logits[row].argmax()))
                    continue
                probs = torch.softmax(logits[row] / seq.temperature, dim=-1)
                chosen.append(int(torch.multinomial(probs, 1, generator=seq.generator())))
        now = time.monotonic_ns()
        for seq, token in zip(batch, chosen, strict=True):
            if token == EOS:
                seq.finish_reason = "stop"
                continue
            if not seq.tokens:
                seq.first_ns = now
            seq.tokens.append(token)
            out.append((seq, [token]))
            if (
                len(seq.tokens) >= seq.max_tokens
                or seq.prompt_len + len(seq.tokens) >= self.max_len
            ):
                seq.finish_reason = "length"
