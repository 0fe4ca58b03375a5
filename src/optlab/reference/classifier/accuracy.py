"""Accuracy of any predictor on the held-out renders, and agreement between two predictors.

A predictor is `predict(payloads) -> labels`: JPEG bytes in, digits out, so every engine,
precision and preprocess variant is checked end to end on the same payloads the target serves.
torch is imported only by the helpers that run the reference model.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from optlab.errors import OptlabError
from optlab.reference.classifier.data import MODEL_SIDE, decode_reference, requests, split_indices

if TYPE_CHECKING:
    from torch import nn

Predict = Callable[[list[bytes]], list[int]]


@dataclass(frozen=True)
class AccuracyReport:
    """Top-1 on `n` held-out payloads, and the fraction of them on which the predictor agreed
    with a reference predictor (None when no reference was given)."""

    top1: float
    n: int
    agreement: float | None


def agreement(labels_a: Sequence[int], labels_b: Sequence[int]) -> float:
    """Fraction of positions where the two label sequences agree."""
    if len(labels_a) != len(labels_b):
        raise OptlabError(
            f"cannot compare {len(labels_a)} labels with {len(labels_b)}",
            hint="compare predictions made on the same payloads",
        )
    if not labels_a:
        raise OptlabError("no labels to compare", hint="evaluate on at least one payload")
    return sum(int(a) == int(b) for a, b in zip(labels_a, labels_b, strict=True)) / len(labels_a)


def _predictions(predict: Predict, payloads: list[bytes]) -> list[int]:
    labels = list(predict(payloads))
    if len(labels) != len(payloads):
        raise OptlabError(
            f"the predictor returned {len(labels)} labels for {len(payloads)} payloads",
            hint="predict must return one label per payload, in order",
        )
    return labels


def evaluate(
    predict: Predict,
    *,
    count: int | None = None,
    size: int | tuple[int, int] = 256,
    seed: int = 0,
    reference: Predict | None = None,
) -> AccuracyReport:
    """Top-1 of `predict` on `count` held-out renders (all of them when None).

    With the defaults these are the payloads the target serves by default (holdout, seed 0,
    256 px). With `reference` (for example `reference_predict`), agreement with it on the same
    payloads is reported too: the measure of what a precision or engine change costs.
    """
    total = len(split_indices("holdout"))
    n = total if count is None else count
    if not 0 < n <= total:
        raise OptlabError(
            f"cannot evaluate on {n} held-out samples",
            hint=f"choose a count between 1 and {total}, or leave it unset for all",
        )
    samples = requests(split="holdout", count=n, size=size, seed=seed)
    payloads = [sample.jpeg for sample in samples]
    predicted = _predictions(predict, payloads)
    top1 = agreement(predicted, [sample.label for sample in samples])
    agreed = None if reference is None else agreement(predicted, _predictions(reference, payloads))
    return AccuracyReport(top1=top1, n=n, agreement=agreed)


def model_predict(model: nn.Module, *, batch_size: int = 64, device: str = "cpu") -> Predict:
    """A predictor that runs `model` (in eval mode) on `decode_reference` inputs, in batches."""
    import numpy as np
    import torch

    def predict(payloads: list[bytes]) -> list[int]:
        labels: list[int] = []
        with torch.inference_mode():
            for start in range(0, len(payloads), batch_size):
                chunk = payloads[start : start + batch_size]
                batch = np.stack([decode_reference(jpeg, MODEL_SIDE) for jpeg in chunk])
                logits = model(torch.from_numpy(batch).to(device))
                labels.extend(int(label) for label in logits.argmax(dim=1).tolist())
        return labels

    return predict


@functools.lru_cache(maxsize=4)
def _reference(device: str) -> Predict:
    from optlab.reference.classifier.model import load_trained

    return model_predict(load_trained(device), device=device)


def reference_predict(payloads: list[bytes], *, device: str = "cpu") -> list[int]:
    """The correctness reference: canonical decode and the shipped fp32 torch model."""
    return _reference(device)(payloads)
