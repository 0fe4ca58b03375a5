"""The request side of a streaming LLM workload: `workload.prompts` (docs/experiment-files.md
"Streaming LLM targets").

Lengths are in tokens of the target's tokenizer (`target.tokenizer`): a fixed number, or a
distribution (`uniform`, `normal`, `list`) drawn with the workload's seed. Prompts are
synthetic (seeded words, token-exact under the `words` tokenizer), or read from a JSONL
`file` whose sha256 the loader adds (`file_sha256`), so a step whose prompts file changed
under the same name differs from its parent in its workload and is refused as a hidden
variable. `shared_prefix` gives groups of requests one system prompt of N tokens.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from optlab.config.knobs import StrictModel

__all__ = ["LengthDist", "Length", "Prompts", "SharedPrefix", "MAX_PROMPT_TOKENS"]

MAX_PROMPT_TOKENS = 1_000_000
MAX_PROMPTS = 100_000


class LengthDist(StrictModel):
    """A token length drawn per request: `uniform` in [min, max], `normal` (mean, sd, cut to
    [min, max], rounded), or one of `values` in turn."""

    dist: Literal["uniform", "normal", "list"]
    min: int | None = Field(None, ge=0, le=MAX_PROMPT_TOKENS)
    max: int | None = Field(None, ge=0, le=MAX_PROMPT_TOKENS)
    mean: float | None = Field(None, ge=0, le=MAX_PROMPT_TOKENS)
    sd: float | None = Field(None, ge=0, le=MAX_PROMPT_TOKENS)
    values: list[int] | None = Field(None, min_length=1, max_length=MAX_PROMPTS)

    @model_validator(mode="after")
    def _complete(self) -> LengthDist:
        if self.dist == "uniform" and (self.min is None or self.max is None):
            raise ValueError("a uniform length needs min and max")
        if self.dist == "normal" and (self.mean is None or self.sd is None):
            raise ValueError("a normal length needs mean and sd (min and max cut it)")
        if self.dist == "list" and not self.values:
            raise ValueError("a list length needs values")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        if self.values is not None and any(v < 0 or v > MAX_PROMPT_TOKENS for v in self.values):
            raise ValueError(f"every value is a length from 0 to {MAX_PROMPT_TOKENS:,}")
        return self


Length = int | LengthDist


class SharedPrefix(StrictModel):
    """`groups` groups of requests, each sharing one system prompt of `tokens` tokens (before
    each request's own `input_tokens`). `salt`: each group's requests carry a `cache_salt` of
    their own (servers that honour it never share a cache entry between groups)."""

    tokens: int = Field(ge=1, le=MAX_PROMPT_TOKENS)
    groups: int = Field(1, ge=1, le=MAX_PROMPTS)
    salt: bool = False


class Prompts(StrictModel):
    """What each streamed request asks for. The requests are built once per run (`count` of
    them, sent round robin; a `file`'s lines otherwise) and are part of the experiment's
    workload: a step may not change them."""

    input_tokens: Length = 128
    output_tokens: Length = 128
    count: int = Field(256, ge=1, le=MAX_PROMPTS, description="distinct synthetic requests")
    file: str | None = Field(
        None,
        min_length=1,
        description='JSONL beside the experiment: each line {"prompt": ...} or '
        '{"messages": [...]}, optionally "max_tokens"',
    )
    file_sha256: str | None = Field(
        None, pattern=r"^[0-9a-f]{64}$", description="set by the loader from the file"
    )
    shared_prefix: SharedPrefix | None = None
    turns: int = Field(
        1,
        ge=1,
        le=64,
        description="multi-turn sessions: each request of a conversation sends the earlier "
        "turns (its prompts and the answers asked for) back as history",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Prompts:
        if self.file is not None and (self.shared_prefix is not None or self.turns > 1):
            raise ValueError("a prompts file is sent as it is: no shared_prefix or turns")
        return self


class TokenizerFile(StrictModel):
    """A streaming target's tokenizer from a file: a Hugging Face fast tokenizer's
    `tokenizer.json` (the `tokenizers` package, `pip install 'optlab[llm]'`), beside the
    experiment. Its sha256 is part of the target's code identity."""

    file: str = Field(min_length=1, description="a tokenizer.json beside the experiment")
