"""Reproduce the shipped weights: `python -m optlab.reference.llm.train [--steps N]`.

Next-word prediction on Python's help topics (`pydoc_data.topics`, see `tokenizer`), the last
5% of the words held out for the report. Seeded throughout; with the same torch build and
thread count the weights are bit-identical. The model is small and the corpus smaller: it
learns the topics' phrasing, not much more, which is all a serving benchmark needs from it
(a real forward pass per token, and answers that are words).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch
from torch.nn import functional as F  # noqa: N812

from optlab.reference.llm.model import LmConfig, TinyLM, init_weights, save_reference, weights_path
from optlab.reference.llm.tokenizer import EOS, Tokenizer, corpus_documents

DEFAULT_STEPS = 1200
BATCH = 16
WINDOW = 256
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.05
SEED = 0


def _stream(tokenizer: Tokenizer, documents: list[str]) -> torch.Tensor:
    ids: list[int] = []
    for text in documents:
        ids += tokenizer.encode(text, hash_unknown=False)
        ids.append(EOS)
    return torch.tensor(ids)


def _loss(model: TinyLM, batch: torch.Tensor) -> torch.Tensor:
    hidden = model.full(batch[:, :-1])
    logits = model.logits(hidden)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def _windows(ids: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    return torch.stack([ids[s : s + WINDOW + 1] for s in starts.tolist()])


def train(steps: int, out: Path) -> None:
    torch.manual_seed(SEED)
    documents = corpus_documents()
    config = LmConfig()
    tokenizer = Tokenizer.build(documents, config.vocab)
    ids = _stream(tokenizer, documents)
    split = int(len(ids) * 0.95)
    train_ids, held_ids = ids[:split], ids[split:]
    model = TinyLM(config)
    init_weights(model, SEED)
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    generator = torch.Generator().manual_seed(SEED)
    started = time.monotonic()
    model.train()
    for step in range(steps):
        lr = (
            LEARNING_RATE
            * min(1.0, (step + 1) / 100)
            * 0.5
            * (1 + math.cos(math.pi * step / steps))
        )
        for group in optimiser.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_ids) - WINDOW - 1, (BATCH,), generator=generator)
        loss = _loss(model, _windows(train_ids, starts))
        optimiser.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        if step % 100 == 0 or step == steps - 1:
            print(
                f"step {step:5d}  loss {loss.item():.3f}  {time.monotonic() - started:6.1f} s",
                flush=True,
            )
    model.eval()
    with torch.no_grad():
        starts = torch.arange(0, len(held_ids) - WINDOW - 1, WINDOW)
        held = float(_loss(model, _windows(held_ids, starts)).item())
    unk = float((ids == 0).float().mean())
    meta = {
        "steps": steps,
        "held_out_loss": round(held, 4),
        "held_out_perplexity": round(math.exp(held), 1),
        "corpus_words": len(ids),
        "unknown_share": round(unk, 4),
        "torch": str(torch.__version__),
    }
    digest = save_reference(model, tokenizer, out, meta)
    print(
        f"held-out loss {held:.3f} (perplexity {math.exp(held):.1f}) over {len(held_ids)} words; "
        f"{unk:.1%} of the corpus is <unk>; {time.monotonic() - started:.0f} s"
    )
    print(f"wrote {out} sha256 {digest}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--out", type=Path, default=weights_path())
    args = parser.parse_args(argv)
    train(args.steps, args.out)


if __name__ == "__main__":
    main()
