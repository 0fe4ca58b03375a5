"""`kind: openai`: an OpenAI-compatible endpoint streaming tokens over Server-Sent Events
(docs/experiment-files.md "Streaming LLM targets"), already listening at `url` or started by
optlab from `command` as a command target's service is.

Its requests are the workload's `prompts` (`optlab.targets.llm_requests`); its responses are
timed event by event as their bytes arrive (`optlab.targets.sse`), and the run's `llm` section
holds TTFT, ITL, TPOT, E2E, tokens/s and goodput (docs/run-json.md "llm"). A prompts file's
sha256 is added to the workload at load, so a step whose file changed is refused as a hidden
variable, as one whose lengths or tokenizer differ is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optlab.config.llm import Prompts, TokenizerFile
from optlab.config.models import OpenAITarget, ResolvedConfig, Target, Workload
from optlab.config.source import SourceFile
from optlab.errors import ConfigError, TargetError
from optlab.metrics.server_metrics import MAX_TEXT, server_figures
from optlab.targets.base import LoadedTarget
from optlab.targets.http import HttpRecipe, check_listening, fetch_bytes, fetch_json, http_spec
from optlab.targets.http_client import StreamSpec
from optlab.targets.kind import TargetKind
from optlab.targets.kinds.command import command_identity
from optlab.targets.llm_requests import file_sha256, llm_requests
from optlab.targets.llm_tokenizer import load_counter, tokenizer_sha256
from optlab.targets.network import (
    adopt_listener,
    check_templates,
    folder_of,
    network_knob_model,
    not_in_process,
    service_hooks,
    start_service,
)
from optlab.targets.service_env import inspect_service
from optlab.targets.templates import Secrets

__all__ = ["KIND", "OpenAI"]

PATHS = {"completions": "/completions", "chat": "/chat/completions"}
PROMETHEUS_TIMEOUT_S = 2.0  # a page slower than this is a missed sample, not a stalled run


class OpenAI(TargetKind):
    name = "openai"
    in_process = False
    service_note = (
        "not checked: optlab does not start this endpoint and cannot see its interpreter or "
        "packages; its declared code_version is its only identity"
    )
    batch_figures = None  # an LLM server's batches are its running sequences, not `batching`

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        assert isinstance(target, OpenAITarget)
        return network_knob_model(target, paths)

    def check_knobs(self, target: Target, knobs: dict[str, Any]) -> None:
        assert isinstance(target, OpenAITarget)
        check_templates(target, knobs)
        super().check_knobs(target, knobs)

    def resolve_inputs(self, workload: Workload, source: SourceFile) -> Workload:
        if workload.inputs:
            raise ConfigError(
                f"{source.where(('workload', 'inputs'))}: an openai target's requests are "
                "its workload.prompts, not inputs",
                hint="give workload.prompts: {input_tokens: N, output_tokens: N} (or a "
                "prompts file)",
            )
        prompts = workload.prompts or Prompts()
        if prompts.file is not None:
            path = source.path.resolve().parent / prompts.file
            if not path.is_file():
                raise ConfigError(
                    f"{source.where(('workload', 'prompts', 'file'))}: {path} does not exist",
                    hint="give a JSONL file beside the experiment, one request per line",
                )
            prompts = prompts.model_copy(update={"file_sha256": file_sha256(path)})
        return workload.model_copy(update={"prompts": prompts})

    def check_code(self, target: Target, paths: Sequence[Path], source: SourceFile) -> None:
        # A tokenizer file that cannot be read is refused at load, before anything is stored.
        assert isinstance(target, OpenAITarget)
        if isinstance(target.tokenizer, TokenizerFile):
            try:
                load_counter(target.tokenizer, paths)
            except ConfigError as exc:
                where = source.where(("target", "tokenizer", "file"))
                raise ConfigError(f"{where}: {exc.message}", exc.hint) from None

    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        if target.get("command"):
            found = {**command_identity(target, paths), "kind": "openai"}
        else:
            found = {"kind": "openai", "declared": target.get("code_version")}
        tokenizer = target.get("tokenizer")
        if isinstance(tokenizer, dict):  # a tokenizer file: its bytes are part of the code
            found["tokenizer_sha256"] = tokenizer_sha256(TokenizerFile(**tokenizer), paths)
        return found

    def service_environment(
        self, target: Mapping[str, Any], folder: Path, environ: Mapping[str, str] | None
    ) -> dict[str, Any] | None:
        return inspect_service(target, folder, environ) if target.get("command") else None

    def preflight(self, config: ResolvedConfig, where: str) -> None:
        assert isinstance(config.target, OpenAITarget)
        if not config.target.command:
            check_listening(config.target, config.knobs, where)
            check_openai(config.target, config.knobs, Secrets(), where)

    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
        target = config.target
        assert isinstance(target, OpenAITarget)
        prompts = config.workload.prompts or Prompts()
        folder = folder_of(paths)
        requests = llm_requests(target, prompts, config.workload.seed, folder)
        base = http_spec(target, config.workload, secrets, config.knobs)
        spec = dataclasses.replace(base, url=base.url.rstrip("/") + PATHS[target.api])
        bodies = tuple(r.body for r in requests)
        stream = StreamSpec(
            tokenizer=(
                load_counter(target.tokenizer, paths)
                if isinstance(target.tokenizer, TokenizerFile)
                else target.tokenizer
            ),
            max_tokens=tuple(r.max_tokens for r in requests),
            input_tokens=tuple(r.input_tokens for r in requests),
            exact=target.ignore_eos or target.min_tokens,
        )
        loaded = LoadedTarget(
            not_in_process,
            bodies,
            f"openai {target.api} {target.model} at {secrets.redact(spec.url)}",
            client=HttpRecipe(spec, bodies, stream),
        )
        service_hooks(loaded, target, config.knobs, secrets)
        if target.prometheus_url:
            url = secrets.fill(target.prometheus_url, config.knobs, "target.prometheus_url")

            def read() -> dict[str, float]:
                page = fetch_bytes("GET", url, "target.prometheus_url", secrets,
                                   timeout_s=PROMETHEUS_TIMEOUT_S, limit=MAX_TEXT)  # fmt: skip
                return server_figures(page.decode("utf-8", errors="replace"))

            loaded.server_metrics = read
        if target.command:
            start_service(loaded, target, config.knobs, secrets, folder)
            try:
                check_openai(target, config.knobs, secrets, "target.command")
            except ConfigError:
                loaded.close()
                raise
        else:
            adopt_listener(loaded, spec.url)
        return loaded


def check_openai(target: OpenAITarget, knobs: dict[str, Any], secrets: Secrets, where: str) -> None:
    """The service at `target.url` answers `GET {url}/models` as an OpenAI-compatible API
    does (a JSON object with a `data` list); a ConfigError that says what it answered
    otherwise (a URL without `/v1`, a service of another kind)."""
    url = secrets.fill(target.url, knobs, "target.url").rstrip("/") + "/models"
    headers = {k: secrets.fill(v, knobs, f"target.headers.{k}") for k, v in target.headers.items()}
    hint = (
        "target.url is the API's base, e.g. http://127.0.0.1:8000/v1, of a server that "
        "speaks the OpenAI API (vLLM, SGLang, TGI, llama.cpp, `transformers serve`)"
    )
    try:
        found = fetch_json("GET", url, "target.url", secrets, timeout_s=10.0, headers=headers)
    except TargetError as exc:
        raise ConfigError(
            f"{where}: {secrets.redact(target.url)} is not an OpenAI-compatible endpoint: "
            f"{exc.message}",
            hint=hint,
        ) from None
    if not isinstance(found.get("data"), list):
        raise ConfigError(
            f"{where}: {secrets.redact(url)} answered a JSON object without a `data` list: "
            "not an OpenAI-compatible endpoint",
            hint=hint,
        )


KIND = OpenAI()
