"""The reference target's data and model: deterministic renders, a clean split, skewed streams,
and missing weights that say how to regenerate them. The shipped weights' accuracy is
tests/integration/test_builtin_model_real.py; that the package stays light to import,
tests/integration/test_import_weight.py."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from optlab.errors import OptlabError
from optlab.reference.classifier import data


def _image(jpeg: bytes) -> tuple[str, tuple[int, int]]:
    with Image.open(io.BytesIO(jpeg)) as image:
        image.load()
        return str(image.format), image.size


def test_render_is_deterministic_and_a_valid_jpeg() -> None:
    first = data.render(5, size=200, seed=3)
    assert first == data.render(5, size=200, seed=3)
    assert first.jpeg != data.render(5, size=200, seed=4).jpeg
    assert first.index == 5
    assert 0 <= first.label <= 9
    assert _image(first.jpeg) == ("JPEG", (200, 200))


def test_spread_sizes_stay_in_range_and_repeat_per_sample() -> None:
    stream = data.requests(count=40, size=(100, 300), seed=1, repeat_skew=1.1)
    sides = {sample.index: _image(sample.jpeg)[1] for sample in stream}
    assert all(width == height and 100 <= width <= 300 for width, height in sides.values())
    assert len({width for width, _ in sides.values()}) > 1
    # A repeated sample is the same payload, so a content-keyed cache can hit it.
    by_index: dict[int, set[bytes]] = {}
    for sample in stream:
        by_index.setdefault(sample.index, set()).add(sample.jpeg)
    assert all(len(payloads) == 1 for payloads in by_index.values())


def test_split_is_disjoint_stratified_and_covers_every_index() -> None:
    train, holdout = data.split_indices("train"), data.split_indices("holdout")
    assert not set(train) & set(holdout)
    assert sorted(train + holdout) == list(range(data.dataset_size()))
    assert 0.18 < len(holdout) / data.dataset_size() < 0.22
    labels = data.digits()[1]
    assert set(Counter(int(labels[i]) for i in holdout).values()) <= set(range(33, 40))


def test_skewed_stream_repeats_and_plain_stream_does_not() -> None:
    count = 300
    pool = len(data.split_indices("holdout"))
    plain = Counter(index for index, _ in data.request_plan(count=count))
    skewed = Counter(index for index, _ in data.request_plan(count=count, repeat_skew=1.1))
    assert max(plain.values()) == 1
    assert max(skewed.values()) > 10 * count / pool
    assert data.request_plan(count=count, repeat_skew=1.1, seed=2) != data.request_plan(
        count=count, repeat_skew=1.1
    )
    with pytest.raises(OptlabError):
        data.request_plan(repeat_skew=0.0)


def test_decode_reference_shape_and_normalisation() -> None:
    tensor = data.decode_reference(data.render(0, size=160).jpeg, data.MODEL_SIDE)
    assert tensor.shape == (3, data.MODEL_SIDE, data.MODEL_SIDE)
    assert str(tensor.dtype) == "float32"
    assert tensor.flags["C_CONTIGUOUS"]
    lowest = (0.0 - max(data.MEAN)) / min(data.STD)
    highest = (1.0 - min(data.MEAN)) / min(data.STD)
    assert lowest <= float(tensor.min()) and float(tensor.max()) <= highest


def test_missing_weights_say_how_to_regenerate(monkeypatch: pytest.MonkeyPatch) -> None:
    from optlab.reference.classifier import model

    monkeypatch.setattr(model, "weights_path", lambda: Path("/nonexistent/classifier.pt"))
    with pytest.raises(OptlabError) as raised:
        model.load_trained()
    assert raised.value.hint is not None
    assert "train_reference_model.sh" in raised.value.hint


def test_agreement_counts_matching_labels() -> None:
    from optlab.reference.classifier.accuracy import agreement

    assert agreement([1, 2, 3, 4], [1, 2, 0, 4]) == 0.75
    with pytest.raises(OptlabError):
        agreement([1], [1, 2])
