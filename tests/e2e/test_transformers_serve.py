"""A third-party OpenAI-compatible server measured end to end: Hugging Face's `transformers
serve` on the reference LLM exported to its format (`optlab.reference.llm.export`).

transformers is not one of optlab's dependencies (it pulls a tokenizer stack and a server
framework): the test runs where `OPTLAB_TRANSFORMERS_PYTHON` names a Python with
`transformers[serving]` (`python -m venv V && V/bin/pip install -c constraints torch==2.13.0
'transformers[serving]'`), or where this Python has it, and skips with that reason elsewhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from optlab.reference.llm.model import load_reference
from optlab.reference.llm.tokenizer import EOS, UNK
from tests.support.capabilities import lacks
from tests.support.proc import free_port, kill_group, wait_listening

REPO = Path(__file__).resolve().parents[2]
PROMPT = "The for statement is used to"


def _python() -> str:
    named = os.environ.get("OPTLAB_TRANSFORMERS_PYTHON")
    candidates = [named] if named else [sys.executable]
    for python in candidates:
        probe = subprocess.run(
            [python, "-c", "import transformers, fastapi, uvicorn, tokenizers"],
            capture_output=True,
            check=False,
        )
        if probe.returncode == 0:
            return python
    lacks(
        "transformers[serving] is not installed: install it in a venv (torch pinned to "
        "2.13.0) and set OPTLAB_TRANSFORMERS_PYTHON to its python"
    )


def _greedy(prompt: str, n: int) -> list[str]:
    """The reference model's greedy words (the reference server's answer to `prompt`)."""
    model, tokenizer = load_reference()
    ids = [EOS, *tokenizer.encode(prompt)]
    words = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model.last_logits(torch.tensor([ids]), torch.tensor([len(ids)]))[0]
            logits[UNK] = float("-inf")
            token = int(logits.argmax())
            if token == EOS:
                break
            words.append(tokenizer.word(token))
            ids.append(token)
    return words


def _completion(base: str, model: str, prompt: str, n: int) -> list[str]:
    body = {"model": model, "prompt": prompt, "max_tokens": n, "stream": True, "temperature": 0}
    request = urllib.request.Request(
        base + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    texts = []
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices") or ():
                    texts.append(choice.get("text") or "")
    return "".join(texts).split()


def test_transformers_serve_on_the_exported_reference_llm_measured_end_to_end(
    tmp_path: Path, invoke: Callable[..., Any]
) -> None:
    python = _python()
    exported = tmp_path / "tiny-lm"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1"}
    subprocess.run(
        [python, "-m", "optlab.reference.llm.export", str(exported)],
        env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    port = free_port()
    script = Path(python).with_name("transformers")
    server = subprocess.Popen(
        [str(script), "serve", str(exported), "--host", "127.0.0.1", "--port", str(port),
         "--device", "cpu"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_listening(port, timeout_s=180)
        base = f"http://127.0.0.1:{port}"
        # The export is the reference model: the same greedy words, word for word.
        assert _completion(base, str(exported), PROMPT, 8) == _greedy(PROMPT, 8)
        path = tmp_path / "hf.yaml"
        path.write_text(
            "name: transformers-serve\n"
            f"target: {{kind: openai, url: '{base}/v1', model: '{exported}', "
            "code_version: transformers-serve}\n"
            "workload:\n  load: {mode: closed, concurrency: 2}\n"
            "  prompts: {input_tokens: 8, output_tokens: 12}\n"
            "protocol: {name: quick, warmup_s: 1, duration_s: 4}\n"
        )
        result = invoke("run", str(path), "--json", "--allow-invalid")
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        llm = summary["llm"]
        assert summary["errors"] == 0 and summary["requests"] > 0
        assert llm["ttft_ms"]["p50"] > 0 and llm["itl_ms"]["p50"] > 0
        # It streams one word per event, its usage last, and ends without [DONE].
        assert llm["tokens_per_event"] == pytest.approx(1.0)
        assert llm["totals_from_usage"] == summary["requests"]
        assert llm["streams_without_done"] == summary["requests"]
    finally:
        kill_group(server)
