"""The reference LLM's network: a small GPT (pre-norm blocks, learned positions, tied output
head) with the three forward passes a server needs, so that each serving knob changes real
work:

- `full`: every position of a batch of (right-padded) sequences, no cache. Training uses it,
  and so does a server without a KV cache, which recomputes the whole prefix for every token;
- `prefill`: a chunk of one sequence's prompt, attending to what its cache slot already holds
  (a cached prefix, earlier chunks), written into that slot;
- `decode`: one new token for each of several sequences, each attending to its own slot.

Sized so that a forward pass on one or two CPU cores costs a millisecond or two, a good part
of it per-operator overhead: batching sequences pays off, as it does on a real server.
This module imports torch; `optlab.reference.llm` itself does not.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from optlab.errors import OptlabError
from optlab.reference.llm.tokenizer import Tokenizer

__all__ = ["KVCache", "LmConfig", "TinyLM", "load_reference", "weights_path"]

WEIGHTS_FILE = "llm.pt"
_REGENERATE_HINT = (
    "regenerate the weights with scripts/train_reference_llm.sh "
    "(python -m optlab.reference.llm.train; a few minutes on a CPU)"
)


@dataclass(frozen=True)
class LmConfig:
    vocab: int = 2048
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    max_len: int = 512  # prompt + answer, in tokens

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class KVCache:
    """Keys and values per layer, `slots` sequences of up to `max_len` positions each."""

    def __init__(self, config: LmConfig, slots: int, dtype: torch.dtype) -> None:
        shape = (slots, config.n_heads, config.max_len, config.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype) for _ in range(config.n_layers)]
        self.v = [torch.zeros(shape, dtype=dtype) for _ in range(config.n_layers)]
        self.slots = slots
        self.max_len = config.max_len

    def copy_in(
        self, slot: int, start: int, keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> None:
        """Blocks of a cached prefix ([heads, n, head_dim] per layer) into `slot` at `start`."""
        for layer, (k, v) in enumerate(zip(keys, values, strict=True)):
            n = k.shape[1]
            self.k[layer][slot, :, start : start + n] = k
            self.v[layer][slot, :, start : start + n] = v

    def copy_out(
        self, slot: int, start: int, end: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        keys = [k[slot, :, start:end].clone() for k in self.k]
        values = [v[slot, :, start:end].clone() for v in self.v]
        return keys, values


class Block(nn.Module):
    def __init__(self, config: LmConfig) -> None:
        super().__init__()
        d = config.d_model
        self.heads = config.n_heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, d)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)

        def heads(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, -1).transpose(1, 2)  # [b, heads, t, head_dim]

        return heads(q), heads(k), heads(v)

    def _finish(self, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = attended.shape
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, -1))
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        return out

    def full(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(x)
        return self._finish(x, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))

    def prefill(
        self, x: torch.Tensor, cache: KVCache, layer: int, slot: int, start: int
    ) -> torch.Tensor:
        q, k, v = self._split(x)  # one sequence: [1, heads, n, head_dim]
        n = x.shape[1]
        cache.k[layer][slot, :, start : start + n] = k[0]
        cache.v[layer][slot, :, start : start + n] = v[0]
        keys = cache.k[layer][slot : slot + 1, :, : start + n]
        values = cache.v[layer][slot : slot + 1, :, : start + n]
        # Position start + i sees every position up to itself.
        rows = torch.arange(start, start + n).unsqueeze(1)
        mask = torch.arange(start + n).unsqueeze(0) <= rows
        return self._finish(x, F.scaled_dot_product_attention(q, keys, values, attn_mask=mask))

    def decode(
        self,
        x: torch.Tensor,
        cache: KVCache,
        layer: int,
        slots: torch.Tensor,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        q, k, v = self._split(x)  # [b, heads, 1, head_dim]
        cache.k[layer][slots, :, positions] = k[:, :, 0]
        cache.v[layer][slots, :, positions] = v[:, :, 0]
        span = int(positions.max()) + 1
        keys = cache.k[layer][slots, :, :span]
        values = cache.v[layer][slots, :, :span]
        mask = (torch.arange(span).unsqueeze(0) <= positions.unsqueeze(1))[:, None, None, :]
        return self._finish(x, F.scaled_dot_product_attention(q, keys, values, attn_mask=mask))


class TinyLM(nn.Module):
    def __init__(self, config: LmConfig) -> None:
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab, config.d_model)
        self.pos = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.tok(ids) + self.pos(positions)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.ln_f(hidden)).float()
        return out

    def layers(self) -> list[Block]:
        return [cast(Block, block) for block in self.blocks]

    def full(self, ids: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states of every position of `ids` [b, t]; sequences right-padded to t, each
        of its `lengths` (None: all t long)."""
        _, t = ids.shape
        x = self._embed(ids, torch.arange(t).unsqueeze(0))
        causal = torch.ones(t, t, dtype=torch.bool).tril()
        if lengths is None:
            mask = causal
        else:
            # Padding keys are never attended to (a padded query still sees its own prefix).
            keys = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
            mask = causal & keys[:, None, None, :]
        for block in self.layers():
            x = block.full(x, mask)
        return x

    def last_logits(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Without a cache: each sequence's next-token logits, recomputing all of it."""
        hidden = self.full(ids, lengths)
        last = hidden[torch.arange(ids.shape[0]), lengths - 1]
        return self.logits(last)

    def prefill(self, ids: list[int], cache: KVCache, slot: int, start: int) -> torch.Tensor:
        """Positions start.. of one sequence into its slot; the last one's next-token logits."""
        tokens = torch.tensor([ids])
        x = self._embed(tokens, torch.arange(start, start + len(ids)).unsqueeze(0))
        for layer, block in enumerate(self.layers()):
            x = block.prefill(x, cache, layer, slot, start)
        return self.logits(x[:, -1])[0]

    def decode(
        self, ids: list[int], cache: KVCache, slots: list[int], positions: list[int]
    ) -> torch.Tensor:
        """One token per sequence, at its position in its slot: next-token logits [b, vocab]."""
        where = torch.tensor(positions)
        x = self._embed(torch.tensor(ids).unsqueeze(1), where.unsqueeze(1))
        rows = torch.tensor(slots)
        for layer, block in enumerate(self.layers()):
            x = block.decode(x, cache, layer, rows, where)
        return self.logits(x[:, 0])


def weights_path() -> Path:
    return Path(__file__).with_name(WEIGHTS_FILE)


def save_reference(model: TinyLM, tokenizer: Tokenizer, path: Path, meta: dict[str, Any]) -> str:
    """The weights as float16 (half the bytes; loaded back as float32), the vocabulary and the
    config; returns the file's sha256."""
    state = {
        k: v.detach().to(torch.float16) for k, v in model.state_dict().items() if k != "head.weight"
    }
    torch.save(
        {
            "config": asdict(model.config),
            "vocabulary": tokenizer.vocabulary,
            "state": state,
            "meta": meta,
        },
        path,
    )
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_reference(path: Path | None = None) -> tuple[TinyLM, Tokenizer]:
    """The shipped model (float32, eval mode) and its tokenizer."""
    path = path or weights_path()
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise OptlabError(
            f"the reference LLM's weights are missing: {path}", hint=_REGENERATE_HINT
        ) from None
    except Exception as exc:  # a truncated or foreign file
        raise OptlabError(
            f"the reference LLM's weights at {path} cannot be read: {exc}", hint=_REGENERATE_HINT
        ) from None
    config = LmConfig(**saved["config"])
    model = TinyLM(config)
    state = {k: v.float() for k, v in saved["state"].items()}
    state["head.weight"] = state["tok.weight"]
    model.load_state_dict(state)
    model.eval()
    return model, Tokenizer(saved["vocabulary"])


def init_weights(model: TinyLM, seed: int) -> None:
    """GPT-2's initialisation, seeded."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(param)
        elif "ln" in name:
            nn.init.ones_(param)
        else:
            std = (
                0.02 / math.sqrt(2 * model.config.n_layers)
                if name.endswith(("proj.weight", "fc2.weight"))
                else 0.02
            )
            with torch.no_grad():
                param.normal_(0.0, std, generator=generator)
