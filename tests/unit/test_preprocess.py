"""The preprocess variants against the canonical `decode_reference`, and their contracts.

Tolerances, in normalised units (one uint8 level is 1 / (255 * 0.25) = 0.0157):

- ``numpy`` and ``numpy-pooled`` agree bit for bit (same pixels, same float32 operations).
- ``torch`` is within one level of ``numpy``: the same draft decode and the same antialiased
  bilinear algorithm, computed in float and rounded, where PIL uses 22-bit fixed point.
- Where no resize is needed (64 px in, 64 px out) every variant equals the reference up to float
  rounding: only the decode is left, and it is the same.
- Otherwise the variants filter differently from PIL's resize of the full-size decode: draft
  mode lets libjpeg reduce 2:1 to 8:1 in the DCT domain (a box-like filter, not PIL's triangle),
  and ``python`` interpolates the 2 x 2 nearest source pixels with no antialiasing. Both leave
  more of the renders' sensor noise and glyph-edge detail in; measured over 600 held-out renders
  (32-2048 px) the largest single-value difference was 0.48 (python) and 0.42 (draft), the
  largest per-image mean 0.063 and 0.036. The bounds below leave about 1.5x headroom. What
  matters is the classifier's answer, checked separately (tests/integration/
  test_preprocess_real.py): top-1 agreement >= 99% with the reference inputs, and held-out
  top-1 within 0.5 points of the reference's. That the CPU variants never import torch is
  tests/integration/test_import_weight.py.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from optlab.errors import OptlabError
from optlab.reference.classifier.data import MODEL_SIDE, Sample, decode_reference, render, requests
from optlab.reference.classifier.preprocess import VARIANTS, make_preprocessor
from tests.support.capabilities import without_cuda
from tests.support.preprocessed import as_array

LEVEL = 1.0 / (255.0 * 0.25)  # one uint8 step after normalisation with STD 0.25
MAX_DIFF = {"python": 0.75, "numpy": 0.6, "numpy-pooled": 0.6, "torch": 0.6 + LEVEL}
MEAN_DIFF = {"python": 0.1, "numpy": 0.06, "numpy-pooled": 0.06, "torch": 0.06}
SIZES = (64, 256, 300, 512)


@pytest.fixture(scope="module")
def preprocessors() -> dict[str, Callable[[bytes], Any]]:
    return {variant: make_preprocessor(variant) for variant in VARIANTS}


@pytest.fixture(scope="module")
def renders() -> dict[int, list[Sample]]:
    return {size: requests(split="holdout", count=6, size=size, seed=3) for size in SIZES}


def jpeg_of(image: Image.Image, **options: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=options.pop("format", "JPEG"), **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def odd_payloads() -> dict[str, bytes]:
    """Inputs the renders never produce: other modes, shapes, encodings."""
    base = Image.open(io.BytesIO(render(11, size=300).jpeg)).convert("RGB")
    return {
        "greyscale": jpeg_of(base.convert("L"), quality=90),
        "cmyk": jpeg_of(base.convert("CMYK"), quality=90),
        "wide": jpeg_of(base.resize((300, 200)), quality=90),
        "tall-odd": jpeg_of(base.resize((97, 411)), quality=90),
        "progressive": jpeg_of(base, quality=90, progressive=True),
        "tiny": jpeg_of(base.resize((32, 32)), quality=90),
        "large": jpeg_of(base.resize((2048, 2048)), quality=90),
        "png": jpeg_of(base, format="PNG"),
    }


# --- shape and contract ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("side", [MODEL_SIDE, 48])
def test_output_is_float32_chw(variant: str, side: int) -> None:
    image = make_preprocessor(variant, side=side)(render(0, size=256).jpeg)
    if variant == "torch":
        assert isinstance(image, torch.Tensor)
        assert image.device.type == "cpu" and image.is_contiguous()
        assert image.dtype == torch.float32
    else:
        assert isinstance(image, np.ndarray)
        assert image.dtype == np.float32 and image.flags.c_contiguous
    assert tuple(image.shape) == (3, side, side)


# --- against the reference ---------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_close_to_reference(
    variant: str,
    size: int,
    preprocessors: dict[str, Callable[[bytes], Any]],
    renders: dict[int, list[Sample]],
) -> None:
    for sample in renders[size]:
        reference = decode_reference(sample.jpeg, MODEL_SIDE)
        difference = np.abs(as_array(preprocessors[variant](sample.jpeg)) - reference)
        if size == MODEL_SIDE:
            assert difference.max() < 1e-5  # no resize: the same decode, float rounding only
        else:
            assert difference.max() <= MAX_DIFF[variant], (sample.index, difference.max())
            assert difference.mean() <= MEAN_DIFF[variant], (sample.index, difference.mean())


def test_numpy_is_the_reference_when_draft_does_not_apply(
    preprocessors: dict[str, Callable[[bytes], Any]],
) -> None:
    # Under twice the side libjpeg cannot scale, so numpy does exactly the reference's resize.
    payload = render(7, size=100).jpeg
    reference = decode_reference(payload, MODEL_SIDE)
    assert np.abs(as_array(preprocessors["numpy"](payload)) - reference).max() < 1e-5


@pytest.mark.parametrize("size", [*SIZES, 301])
def test_numpy_variants_agree_exactly_and_torch_within_a_level(
    size: int, preprocessors: dict[str, Callable[[bytes], Any]]
) -> None:
    # 301 is not a multiple of the draft scale: the resize starts from a fractional box.
    for index in (1, 2, 3):
        payload = render(index, size=size).jpeg
        fresh = as_array(preprocessors["numpy"](payload))
        assert np.array_equal(fresh, as_array(preprocessors["numpy-pooled"](payload)))
        torch_image = as_array(preprocessors["torch"](payload))
        assert np.abs(torch_image - fresh).max() <= LEVEL + 1e-5


@pytest.mark.parametrize("variant", VARIANTS)
def test_other_modes_shapes_and_formats(
    variant: str,
    preprocessors: dict[str, Callable[[bytes], Any]],
    odd_payloads: dict[str, bytes],
) -> None:
    for name, payload in odd_payloads.items():
        image = as_array(preprocessors[variant](payload))
        assert image.shape == (3, MODEL_SIDE, MODEL_SIDE), name
        difference = np.abs(image - decode_reference(payload, MODEL_SIDE))
        assert difference.max() <= MAX_DIFF[variant], (name, difference.max())


# --- numpy-pooled: reuse and threads -----------------------------------------------------------


def test_pooled_returns_its_reused_buffer() -> None:
    first_payload, second_payload = render(4, size=256).jpeg, render(5, size=256).jpeg
    pooled = make_preprocessor("numpy-pooled")
    first = pooled(first_payload)
    kept = first.copy()
    second = pooled(second_payload)
    # The documented lifetime: the same thread's next call overwrites the previous result.
    assert second is first
    assert not np.array_equal(first, kept)
    assert np.array_equal(second, make_preprocessor("numpy")(second_payload))
    # Another preprocessor has buffers of its own.
    other = make_preprocessor("numpy-pooled")(first_payload)
    assert not np.shares_memory(other, second)
    assert np.array_equal(other, kept)


def test_pooled_is_thread_safe() -> None:
    payloads = [render(index, size=size).jpeg for index in range(6) for size in (128, 300, 512)]
    expected = [as_array(make_preprocessor("numpy")(payload)) for payload in payloads]
    pooled = make_preprocessor("numpy-pooled")
    threads_count, rounds = 8, 4
    start = threading.Barrier(threads_count)
    mismatches: list[tuple[int, int]] = []
    buffers: dict[int, int] = {}
    failures: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            start.wait()
            for _ in range(rounds):
                # Each thread walks the payloads from its own offset, so threads overlap on
                # different images at the same moment.
                for step in range(len(payloads)):
                    item = (worker + step) % len(payloads)
                    image = pooled(payloads[item])
                    buffers[worker] = image.__array_interface__["data"][0]
                    if not np.array_equal(image, expected[item]):
                        mismatches.append((worker, item))
        except BaseException as exc:  # surfaced in the main thread below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert not mismatches, mismatches
    assert len(set(buffers.values())) == threads_count  # one buffer per thread


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("payload", [b"", b"definitely not an image", "truncated"])
def test_undecodable_bytes_raise_optlab_error(variant: str, payload: bytes | str) -> None:
    if payload == "truncated":
        whole = render(0, size=256).jpeg
        payload = whole[: len(whole) // 2]
    assert isinstance(payload, bytes)
    with pytest.raises(OptlabError, match="not a decodable image") as raised:
        make_preprocessor(variant)(payload)
    assert raised.value.hint


def test_unknown_variant_names_the_knob_and_the_values() -> None:
    with pytest.raises(OptlabError, match="unknown preprocess variant 'opencv'") as raised:
        make_preprocessor("opencv")
    hint = raised.value.hint or ""
    assert "knobs.preprocess" in hint
    assert all(variant in hint for variant in VARIANTS)


@pytest.mark.parametrize("side", [0, -3])
def test_bad_side_is_refused(side: int) -> None:
    with pytest.raises(OptlabError, match="side"):
        make_preprocessor("numpy", side=side)


@without_cuda()
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_torch_on_cuda_without_cuda_is_a_clear_error(device: str) -> None:
    with pytest.raises(OptlabError, match="needs CUDA") as raised:
        make_preprocessor("torch", device=device)
    assert "device: cpu" in (raised.value.hint or "")


@pytest.mark.parametrize("device", ["tpu", "mps"])
def test_torch_on_an_unsupported_device_is_refused(device: str) -> None:
    with pytest.raises(OptlabError, match="device"):
        make_preprocessor("torch", device=device)
