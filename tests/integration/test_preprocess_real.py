"""The preprocess variants judged by what matters: the reference classifier, run for real on
held-out renders, gives the same answers on them as on the reference inputs. Their pixel-level
contracts are tests/unit/test_preprocess.py."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from optlab.reference.classifier.data import MODEL_SIDE, decode_reference, requests
from optlab.reference.classifier.model import load_trained
from optlab.reference.classifier.preprocess import VARIANTS, make_preprocessor
from tests.support.preprocessed import as_array

AGREEMENT_SAMPLES = 100


def test_classifier_agrees_with_reference_inputs() -> None:
    """Top-1 agreement >= 99% and held-out top-1 within 0.5 points, per variant, on held-out
    renders of spread sizes (64-512 px: draft scales 1, 2, 4 and 8, fractional boxes)."""
    samples = requests(split="holdout", count=AGREEMENT_SAMPLES, size=(64, 512), seed=1)
    truth = np.array([sample.label for sample in samples])
    model = load_trained("cpu")

    def labels(images: list[npt.NDArray[np.float32]]) -> npt.NDArray[np.int64]:
        with torch.inference_mode():
            logits = model(torch.from_numpy(np.stack(images)))
        return logits.argmax(dim=1).numpy()

    reference = labels([decode_reference(sample.jpeg, MODEL_SIDE) for sample in samples])
    for variant in VARIANTS:
        preprocess = make_preprocessor(variant)
        predicted = labels([as_array(preprocess(sample.jpeg)) for sample in samples])
        agreement = float(np.mean(predicted == reference))
        top1_gap = abs(float(np.mean(predicted == truth)) - float(np.mean(reference == truth)))
        assert agreement >= 0.99, (variant, agreement)
        assert top1_gap <= 0.005, (variant, top1_gap)
