"""A streaming LLM target's requests, built once per run from `workload.prompts` and the target
(docs/experiment-files.md "Streaming LLM targets"): each one's body (the bytes sent), the
output length it asks for, and its input length.

Synthetic prompts are seeded words (`w1 w2 …`, one token each under the `words` tokenizer, so
their lengths are exact there); a shared prefix is one such run of words per group, before each
request's own; a multi-turn conversation's k-th request sends the k−1 turns before it (their
prompts, and answers of the length they asked for) as its history. A prompts file's lines are
sent as they are, in order.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from optlab.config.llm import Length, Prompts
from optlab.config.models import OpenAITarget
from optlab.errors import ConfigError
from optlab.targets.http_wire import Body

__all__ = ["LlmRequest", "draw_lengths", "file_sha256", "llm_requests", "read_prompts_file"]

VOCABULARY = 4096  # distinct synthetic words
MAX_FILE_LINES = 100_000


@dataclass(frozen=True)
class LlmRequest:
    body: Body
    max_tokens: int
    input_tokens: int  # under the `words` tokenizer (what a synthetic prompt was built to)


def draw_lengths(length: Length, n: int, rng: np.random.Generator) -> list[int]:
    """`n` token lengths from `length` (a number, or a distribution)."""
    if isinstance(length, int):
        return [length] * n
    if length.dist == "list":
        values = length.values or [0]
        return [values[i % len(values)] for i in range(n)]
    if length.dist == "uniform":
        assert length.min is not None and length.max is not None
        return [int(v) for v in rng.integers(length.min, length.max + 1, size=n)]
    assert length.mean is not None and length.sd is not None
    drawn = np.rint(rng.normal(length.mean, length.sd, size=n))
    low = length.min if length.min is not None else 0
    high = length.max if length.max is not None else None
    drawn = np.clip(drawn, low, high)
    return [int(v) for v in drawn]


def _words(rng: np.random.Generator, n: int) -> str:
    return " ".join(f"w{v}" for v in rng.integers(0, VOCABULARY, size=n))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_prompts_file(path: Path, where: str) -> list[dict[str, Any]]:
    """A JSONL prompts file's lines, each {"prompt": str} or {"messages": [...]}, optionally
    with "max_tokens"; errors name the file and the line."""
    found: list[dict[str, Any]] = []
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise ConfigError(
            f"{where}: cannot read {path}: {exc.strerror or exc}",
            hint="give a JSONL file beside the experiment, one request per line",
        ) from None
    with handle:
        for number, raw in enumerate(handle, 1):
            if not raw.strip():
                continue
            if len(found) >= MAX_FILE_LINES:
                raise ConfigError(f"{where}: {path} has more than {MAX_FILE_LINES:,} prompts",
                                  hint="split the file, or sample it")  # fmt: skip
            try:
                line = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise ConfigError(f"{path}:{number}: not JSON ({exc})",
                                  hint='each line is {"prompt": "..."} or {"messages": [...]}'
                                  ) from None  # fmt: skip
            ok = isinstance(line, dict) and (
                isinstance(line.get("prompt"), str) or isinstance(line.get("messages"), list)
            )
            tokens = line.get("max_tokens") if isinstance(line, dict) else None
            if not ok or (
                tokens is not None
                and (not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1)
            ):
                raise ConfigError(
                    f"{path}:{number}: a prompt is an object with a string `prompt` or a list "
                    "`messages`, and optionally a whole `max_tokens` of at least 1",
                    hint='e.g. {"prompt": "Summarise ...", "max_tokens": 128}',
                )
            found.append(line)
    if not found:
        raise ConfigError(f"{where}: {path} holds no prompts", hint="one JSON object per line")
    return found


def llm_requests(
    target: OpenAITarget, prompts: Prompts, seed: int, folder: Path
) -> list[LlmRequest]:
    """Every request of the run, in the order they are sent (round robin)."""
    rng = np.random.default_rng(seed)
    if prompts.file is not None:
        lines = read_prompts_file(folder / prompts.file, "workload.prompts.file")
        outputs = draw_lengths(prompts.output_tokens, len(lines), rng)
        return [
            _request(
                target,
                line.get("prompt"),
                line.get("messages"),
                int(line.get("max_tokens") or outputs[i]),
                None,
                i,
            )  # fmt: skip
            for i, line in enumerate(lines)
        ]
    n = prompts.count
    inputs = draw_lengths(prompts.input_tokens, n, rng)
    outputs = draw_lengths(prompts.output_tokens, n, rng)
    prefixes: list[str] = []
    if prompts.shared_prefix is not None:
        prefixes = [_words(rng, prompts.shared_prefix.tokens)
                    for _ in range(prompts.shared_prefix.groups)]  # fmt: skip
    found: list[LlmRequest] = []
    turns = prompts.turns
    history: list[tuple[str, int]] = []
    for i in range(n):
        if i % turns == 0:
            history = []
        own = _words(rng, inputs[i])
        prefix = prefixes[i % len(prefixes)] if prefixes else None
        salt = None
        if prefixes and prompts.shared_prefix is not None and prompts.shared_prefix.salt:
            salt = f"optlab-{seed}-group-{i % len(prefixes)}"
        messages: list[dict[str, str]] = []
        if prefix is not None:
            messages.append({"role": "system", "content": prefix})
        for asked, answer_tokens in history:
            messages.append({"role": "user", "content": asked})
            messages.append({"role": "assistant", "content": _words(rng, answer_tokens)})
        messages.append({"role": "user", "content": own})
        history.append((own, outputs[i]))
        found.append(_request(target, None, messages, outputs[i], salt, i))
    return found


def _request(
    target: OpenAITarget,
    prompt: str | None,
    messages: list[dict[str, Any]] | None,
    max_tokens: int,
    salt: str | None,
    index: int,
) -> LlmRequest:
    body: dict[str, Any] = {"model": target.model}
    if target.api == "chat":
        body["messages"] = (
            messages if messages is not None else [{"role": "user", "content": prompt or ""}]
        )
    else:
        body["prompt"] = prompt if prompt is not None else _as_text(messages or [])
    body["max_tokens"] = max_tokens
    body["stream"] = True
    if target.include_usage:
        body["stream_options"] = {"include_usage": True}
    if target.temperature is not None:
        body["temperature"] = target.temperature
    if target.seed is not None:
        body["seed"] = target.seed
    if target.ignore_eos:
        body["ignore_eos"] = True
    if target.min_tokens:
        body["min_tokens"] = max_tokens
    if salt is not None:
        body["cache_salt"] = salt
    body["user"] = f"optlab-{index}"
    body.update(target.extra_body)
    text = messages or [{"content": prompt or ""}]
    input_tokens = sum(len(str(m.get("content", "")).split()) for m in text)
    data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    return LlmRequest(Body(data, "application/json"), max_tokens, input_tokens)


def _as_text(messages: list[dict[str, Any]]) -> str:
    """A conversation as one completions prompt: its contents, in order."""
    return " ".join(str(m.get("content", "")) for m in messages)
