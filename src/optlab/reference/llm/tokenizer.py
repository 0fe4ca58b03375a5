"""The reference LLM's words: its corpus and its tokenizer.

The corpus is the text of Python's own help topics (`pydoc_data.topics`, shipped with CPython),
one document per topic. A token is a whitespace-separated word, exactly as optlab's `words`
tokenizer counts them, so a prompt's length and an answer's are the same on both sides: a word
in the vocabulary is its own id. Training reads any other word as `<unk>`; serving hashes it
onto a word of the vocabulary (crc32), so that distinct prompts stay distinct token sequences
(synthetic prompts, `w17 w3051 ...`, are all outside it, and a prefix cache must not see them as
one). Answers never contain `<unk>`, and end early only at `<eos>` (unless the request
ignores it).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Sequence

__all__ = ["EOS", "UNK", "Tokenizer", "corpus_documents"]

UNK = 0
EOS = 1
SPECIALS = ("<unk>", "<eos>")


def corpus_documents() -> list[str]:
    """The training text: Python's help topics, in their sorted order."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # a Python built without its pydoc data
        raise RuntimeError(
            "pydoc_data.topics is missing from this Python; the reference LLM's corpus is the "
            "text of Python's help topics (train on a CPython that ships pydoc_data)"
        ) from exc
    return [str(topics[key]) for key in sorted(topics)]


class Tokenizer:
    """Words to ids and back; `vocabulary[i]` is id i's word."""

    def __init__(self, vocabulary: Sequence[str]) -> None:
        if tuple(vocabulary[: len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary starts with {SPECIALS}")
        self.vocabulary = list(vocabulary)
        self._ids = {word: i for i, word in enumerate(self.vocabulary)}

    @classmethod
    def build(cls, documents: Iterable[str], size: int) -> Tokenizer:
        """The `size - 2` most frequent words (ties by first appearance), after the specials."""
        counts: Counter[str] = Counter()
        for text in documents:
            counts.update(text.split())
        common = [word for word, _ in counts.most_common(size - len(SPECIALS))]
        return cls([*SPECIALS, *common])

    def __len__(self) -> int:
        return len(self.vocabulary)

    def encode(self, text: str, hash_unknown: bool = True) -> list[int]:
        """One id per word; an unknown word hashed onto the vocabulary (`<unk>` when
        `hash_unknown` is false, as in training)."""
        ids = []
        words = len(self.vocabulary) - len(SPECIALS)
        for word in text.split():
            found = self._ids.get(word)
            if found is None:
                found = len(SPECIALS) + zlib.crc32(word.encode()) % words if hash_unknown else UNK
            ids.append(found)
        return ids

    def word(self, token: int) -> str:
        return self.vocabulary[token]
