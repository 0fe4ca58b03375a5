"""A streaming target's `tokenizer: {file: tokenizer.json}` (docs/experiment-files.md): a
Hugging Face fast tokenizer, loaded with the `tokenizers` package (`pip install 'optlab[llm]'`),
that counts each event's tokens where the server does not stream `usage` with every chunk.

A delta is encoded on its own (no special tokens added), so a word split across two events
may count differently from the whole answer's encoding; the request's total is the server's
final `usage` wherever it sends one (docs/run-json.md "llm").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from optlab.config.llm import TokenizerFile
from optlab.errors import ConfigError
from optlab.targets.llm_requests import file_sha256

__all__ = ["TokenCounter", "load_counter", "tokenizer_path", "tokenizer_sha256"]

FIELD = "target.tokenizer.file"


def tokenizer_path(spec: TokenizerFile, paths: Sequence[Path]) -> Path:
    folder = paths[0] if paths else Path.cwd()
    return (folder / spec.file).resolve()


def tokenizer_sha256(spec: TokenizerFile, paths: Sequence[Path]) -> str:
    path = tokenizer_path(spec, paths)
    if not path.is_file():
        raise ConfigError(
            f"{FIELD}: {path} does not exist",
            hint="give a Hugging Face tokenizer.json beside the experiment (a model's "
            "tokenizer.json, or the `save` of a `tokenizers.Tokenizer`)",
        )
    return file_sha256(path)


class TokenCounter:
    """Tokens in a text by a tokenizer file; picklable (a load generator's worker processes
    each load the file again)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._encode: Callable[[str], int] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path, "_encode": None}

    def __call__(self, text: str) -> int:
        if self._encode is None:
            self._encode = _load(self.path)
        return self._encode(text)


def load_counter(spec: TokenizerFile, paths: Sequence[Path]) -> TokenCounter:
    """The number of tokens in a text, by the file's tokenizer; a ConfigError that names the
    field and the fix when the package is missing or the file is not a tokenizer."""
    tokenizer_sha256(spec, paths)  # exists
    counter = TokenCounter(tokenizer_path(spec, paths))
    counter("")  # loads it now: a file that is not a tokenizer is refused here
    return counter


def _load(path: Path) -> Callable[[str], int]:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError(
            f"{FIELD}: the `tokenizers` package is not installed",
            hint="pip install 'optlab[llm]' (or tokenizers), or count by `tokenizer: words`",
        ) from None
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # the package's own error for a file that is not one
        first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{FIELD}: {path} cannot be loaded as a Hugging Face tokenizer: {first}",
            hint="give the tokenizer.json of a fast tokenizer (not tokenizer_config.json, a "
            "vocabulary or a SentencePiece model)",
        ) from None

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    return count
