"""Reproduce the shipped weights: `python -m optlab.reference.classifier.train [--epochs N]`.

Each epoch trains on a fresh render of the train split (its own seed, so new backgrounds,
colours, jitter and noise, and sizes spread over TRAIN_SIZES): the model learns the digits, not
the renders, and generalises to the held-out renders it is judged on. The held-out split is used
only for the final report. Seeded throughout; with the same torch build and thread count the
weights are bit-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from optlab.reference.classifier.data import (
    MODEL_SIDE,
    decode_reference,
    render,
    request_plan,
    split_indices,
)

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    import torch
    from torch import nn

DEFAULT_EPOCHS = 20
# Small batches: the train split is only ~1,400 images, and the number of steps, not the
# throughput, is what limits how fast this model learns.
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 1e-4
# Wider than any size the reference chain serves, so a workload that spreads sizes stays in
# the range the model has seen.
TRAIN_SIZES = (96, 448)
# Render seeds for training start here; the served renders use seed 0.
_EPOCH_SEED_BASE = 1_000


@dataclass(frozen=True)
class TrainResult:
    path: Path
    epochs: int
    seconds: float
    holdout_top1: float
    holdout_top1_spread: float
    n_holdout: int
    weights_sha256: str


def _epoch_tensors(epoch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One fresh render of the whole train split, decoded the canonical way."""
    import numpy as np
    import torch

    render_seed = _EPOCH_SEED_BASE + 100 * seed + epoch
    plan = request_plan(
        split="train", count=len(split_indices("train")), size=TRAIN_SIZES, seed=render_seed
    )

    def decoded(item: tuple[int, int]) -> tuple[npt.NDArray[np.float32], int]:
        sample = render(item[0], size=item[1], seed=render_seed)
        return decode_reference(sample.jpeg, MODEL_SIDE), sample.label

    # Rendering dominates an epoch; numpy and PIL release the GIL, so threads share it out.
    # Each render is a pure function of its arguments and map keeps the order: still seeded.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        pairs = list(pool.map(decoded, plan))
    images = np.stack([image for image, _ in pairs])
    labels = np.array([label for _, label in pairs], dtype=np.int64)
    return torch.from_numpy(images), torch.from_numpy(labels)


def weights_digest(state: Mapping[str, torch.Tensor]) -> str:
    """A digest of the tensors themselves: the file's own bytes also depend on its name, which
    torch.save writes into the archive."""
    digest = hashlib.sha256()
    for name in sorted(state):
        digest.update(name.encode())
        digest.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _fit(epochs: int, seed: int, log: Callable[[str], None]) -> nn.Module:
    import torch
    from torch import nn

    from optlab.reference.classifier.model import build_model

    torch.manual_seed(seed)
    model = build_model()
    optimiser = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY)
    steps_per_epoch = -(-len(split_indices("train")) // BATCH_SIZE)
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimiser, max_lr=LEARNING_RATE, total_steps=epochs * steps_per_epoch, pct_start=0.15
    )
    loss_fn = nn.CrossEntropyLoss()
    shuffle = torch.Generator().manual_seed(seed)
    for epoch in range(epochs):
        tick = time.perf_counter()
        images, labels = _epoch_tensors(epoch, seed)
        rendered = time.perf_counter() - tick
        model.train()
        order = torch.randperm(len(labels), generator=shuffle)
        total_loss, correct = 0.0, 0
        for start in range(0, len(order), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            logits = model(images[batch])
            loss = loss_fn(logits, labels[batch])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            total_loss += float(loss.detach()) * len(batch)
            correct += int((logits.argmax(dim=1) == labels[batch]).sum())
        log(
            f"epoch {epoch + 1}/{epochs}: loss {total_loss / len(order):.4f}, "
            f"train top-1 {correct / len(order):.4f} "
            f"(render {rendered:.1f}s, train {time.perf_counter() - tick - rendered:.1f}s)"
        )
    return model.eval()


def train(
    *,
    epochs: int = DEFAULT_EPOCHS,
    out: Path,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> TrainResult:
    """Train from scratch, save the fp32 state_dict to `out`, report held-out top-1."""
    import torch

    from optlab.reference.classifier.accuracy import evaluate, model_predict

    started = time.perf_counter()
    # Deterministic kernels, restored afterwards: the switch is process-wide.
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        model = _fit(epochs, seed, log)
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    state = {name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()}
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    seconds = time.perf_counter() - started
    predict = model_predict(model)
    served = evaluate(predict)
    spread = evaluate(predict, size=(128, 512))
    digest = weights_digest(state)
    log(
        f"held-out top-1: {served.top1:.4f} on {served.n} renders (seed 0, 256 px); "
        f"{spread.top1:.4f} with sizes spread over 128-512 px"
    )
    size_kib = out.stat().st_size / 1024
    log(f"saved {out} ({size_kib:.0f} KiB, weights sha256 {digest[:16]}) after {seconds:.0f}s")
    return TrainResult(
        path=out,
        epochs=epochs,
        seconds=seconds,
        holdout_top1=served.top1,
        holdout_top1_spread=spread.top1,
        n_holdout=served.n,
        weights_sha256=digest,
    )


def main(argv: Sequence[str] | None = None) -> int:
    from optlab.reference.classifier.model import weights_path

    parser = argparse.ArgumentParser(
        prog="python -m optlab.reference.classifier.train",
        description="Reproduce the reference classifier's shipped weights.",
    )
    parser.add_argument("--epochs", type=int, default=DEFAULT_EPOCHS)
    parser.add_argument("--out", type=Path, default=weights_path(), help="weights file to write")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch intra-op threads (default: torch's)"
    )
    args = parser.parse_args(argv)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    train(epochs=args.epochs, out=args.out, seed=args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
