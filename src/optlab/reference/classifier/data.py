"""Requests for the reference target: scikit-learn's digits rendered to realistic JPEG payloads.

The 1,797 labelled 8x8 digits ship inside scikit-learn, so nothing is downloaded. Each one is
drawn onto a textured, coloured background with jitter and sensor noise and JPEG-encoded: the
bytes a client would send, costing a real decode and resize on the serving side. Everything is a
pure function of (index, size, seed), so a run can be repeated byte for byte.

numpy is imported at module level (a core dependency that pandas loads anyway); PIL and
scikit-learn are imported inside the functions that need them.
"""

from __future__ import annotations

import functools
import io
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from optlab.errors import OptlabError

Split = Literal["train", "holdout"]

# The model's input side. 64 keeps a batch-1 forward pass at a few milliseconds on one or two CPU
# cores (about 2.5 ms measured on the 2-core dev machine), so batching pays off (see model.py).
MODEL_SIDE = 64
# Per-channel statistics of the rendered images (measured about 0.49 and 0.24 over train renders,
# rounded). Constants, never recomputed, so every preprocess variant normalises identically.
MEAN: tuple[float, float, float] = (0.5, 0.5, 0.5)
STD: tuple[float, float, float] = (0.25, 0.25, 0.25)

HOLDOUT_FRACTION = 0.2
JPEG_QUALITY = 90
MIN_SIDE = 32
MAX_SIDE = 2048

# Fixed seeds and stream tags. Changing any of them changes the split or every payload, so they
# are part of the reference target's identity, like the weights.
_SPLIT_SEED = 20_240_917
_RENDER_TAG = 1
_ORDER_TAG = 2
_SIZE_TAG = 3
_NOISE_SEED = 7
_NOISE_BANK = 1 << 21


@dataclass(frozen=True)
class Sample:
    """One request payload: the JPEG bytes, the true digit and the data set index it shows."""

    jpeg: bytes
    label: int
    index: int


@functools.lru_cache(maxsize=1)
def digits() -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int64]]:
    """scikit-learn's 1,797 digits: 8x8 images in [0, 1] and their labels, read-only, once."""
    # scikit-learn ships no type information.
    from sklearn.datasets import load_digits  # type: ignore[import-untyped]

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float32) / 16.0
    labels = np.asarray(bunch.target, dtype=np.int64)
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def dataset_size() -> int:
    return int(digits()[1].shape[0])


@functools.lru_cache(maxsize=1)
def _splits() -> tuple[tuple[int, ...], tuple[int, ...]]:
    # Own stratified split rather than sklearn's train_test_split: its shuffling is an
    # implementation detail that may change between releases; numpy's PCG64 stream is stable.
    labels = digits()[1]
    rng = np.random.default_rng(_SPLIT_SEED)
    train: list[int] = []
    holdout: list[int] = []
    for label in range(10):
        members = rng.permutation(np.flatnonzero(labels == label))
        n_holdout = round(len(members) * HOLDOUT_FRACTION)
        holdout.extend(int(i) for i in members[:n_holdout])
        train.extend(int(i) for i in members[n_holdout:])
    return tuple(sorted(train)), tuple(sorted(holdout))


def split_indices(split: Split) -> list[int]:
    """Data set indices of a split, sorted. The held-out split is never used for training."""
    train, holdout = _splits()
    if split == "train":
        return list(train)
    if split == "holdout":
        return list(holdout)
    raise OptlabError(f"unknown split {split!r}", hint="use 'train' or 'holdout'")


def _check_side(size: int) -> None:
    if not MIN_SIDE <= size <= MAX_SIDE:
        raise OptlabError(
            f"image size {size} is out of range",
            hint=f"choose a side between {MIN_SIDE} and {MAX_SIDE} pixels",
        )


def _rng(seed: int, *keys: int) -> np.random.Generator:
    if seed < 0:
        raise OptlabError(f"seed {seed} is negative", hint="use a seed >= 0")
    return np.random.default_rng(np.random.SeedSequence([seed, *keys]))


def _resize_float(
    array: npt.NDArray[np.float32], width: int, height: int
) -> npt.NDArray[np.float32]:
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(array, dtype=np.float32))
    resized = image.resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(resized, dtype=np.float32)


def _background(rng: np.random.Generator, size: int) -> npt.NDArray[np.float32]:
    """A two-colour linear gradient at a random angle with low-frequency texture on top."""
    start, end = rng.uniform(0.0, 1.0, size=(2, 3)).astype(np.float32)
    angle = float(rng.uniform(0.0, 2.0 * np.pi))
    # Python floats, not numpy float64 scalars: those would promote every array op to float64
    # and double the render time.
    # The ramp's extremes sit at the corners, so it is normalised to [0, 1] without a pass
    # over the canvas to find them.
    cos, sin = math.cos(angle), math.sin(angle)
    axis = np.linspace(-0.5, 0.5, size, dtype=np.float32) * (1.0 / (abs(cos) + abs(sin)))
    ramp = cos * axis[None, :] + sin * axis[:, None] + 0.5
    # Coarse noise upsampled smoothly reads as paper or fabric texture, not per-pixel grain.
    grid = int(rng.integers(4, 13))
    coarse = rng.standard_normal((grid, grid), dtype=np.float32)
    texture = _resize_float(coarse, size, size)
    strength = float(rng.uniform(0.02, 0.08))
    tint = rng.uniform(0.5, 1.0, size=3).astype(np.float32) * strength
    # One (pixels x 3) @ (3 x 3) product instead of three broadcast passes over the canvas.
    features = np.stack([np.ones_like(ramp), ramp, texture], axis=-1)
    weights = np.stack([start, end - start, tint])
    return np.asarray(features @ weights, dtype=np.float32)


def _ink_colour(
    rng: np.random.Generator, background: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """A random colour whose luminance differs enough from the background's to be legible."""
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32)
    # A sparse grid of pixels estimates the mean colour well enough, at a fraction of the cost.
    backdrop = float(background[::8, ::8].mean(axis=(0, 1)) @ weights)
    colour = rng.uniform(0.0, 1.0, size=3).astype(np.float32)
    for _ in range(32):
        if abs(float(colour @ weights) - backdrop) >= 0.35:
            return colour
        colour = rng.uniform(0.0, 1.0, size=3).astype(np.float32)
    # Rare: a mid-grey background where no draw contrasted; black or white always does.
    return np.full(3, 0.0 if backdrop > 0.5 else 1.0, dtype=np.float32)


def _glyph(
    rng: np.random.Generator, digit: npt.NDArray[np.float32], size: int
) -> tuple[npt.NDArray[np.float32], int, int]:
    """The digit as an alpha mask, scaled, sharpened and rotated, with its jittered top-left
    corner on the canvas. Returned uncropped to the canvas so compositing touches only its box."""
    from PIL import Image

    box = max(8, int(size * rng.uniform(0.55, 0.8)))
    smooth = np.clip(_resize_float(np.pad(digit, 1), box, box), 0.0, 1.0)
    # The 8x8 source is blurry; a contrast curve turns the upscaled blob into ink-like strokes.
    ink = np.clip((smooth - 0.25) * 2.2, 0.0, 1.0)
    angle = float(rng.uniform(-12.0, 12.0))
    rotated = Image.fromarray(ink).rotate(angle, resample=Image.Resampling.BILINEAR, expand=True)
    glyph = np.asarray(rotated, dtype=np.float32)[:size, :size]
    height, width = glyph.shape
    jitter = 0.08 * size
    top = round((size - height) / 2 + float(rng.uniform(-jitter, jitter)))
    left = round((size - width) / 2 + float(rng.uniform(-jitter, jitter)))
    return glyph, min(max(top, 0), size - height), min(max(left, 0), size - width)


@functools.lru_cache(maxsize=1)
def _noise_bank() -> npt.NDArray[np.float32]:
    bank = np.random.default_rng(_NOISE_SEED).standard_normal(_NOISE_BANK, dtype=np.float32)
    bank.setflags(write=False)
    return bank


def _noise(rng: np.random.Generator, shape: tuple[int, ...]) -> npt.NDArray[np.float32]:
    """Unit Gaussian sensor noise. Drawing it fresh dominated the render time, so it is a window
    into a fixed bank at a random offset: still seeded and deterministic, and two renders almost
    never line up on the same stretch of the bank."""
    count = math.prod(shape)
    bank = _noise_bank()
    if count > len(bank):
        return rng.standard_normal(shape, dtype=np.float32)
    offset = int(rng.integers(0, len(bank) - count + 1))
    return bank[offset : offset + count].reshape(shape)


def render(index: int, *, size: int = 256, seed: int = 0) -> Sample:
    """Sample `index` of the digits as a `size` x `size` JPEG; identical bytes for equal args."""
    from PIL import Image

    images, labels = digits()
    if not 0 <= index < len(labels):
        raise OptlabError(
            f"sample index {index} is out of range",
            hint=f"the digits data set has indices 0 to {len(labels) - 1}",
        )
    _check_side(size)
    rng = _rng(seed, _RENDER_TAG, index, size)
    canvas = _background(rng, size)
    ink = _ink_colour(rng, canvas)
    glyph, top, left = _glyph(rng, images[index], size)
    region = canvas[top : top + glyph.shape[0], left : left + glyph.shape[1]]
    region += glyph[:, :, None] * (ink - region)
    canvas += float(rng.uniform(0.01, 0.04)) * _noise(rng, canvas.shape)
    canvas *= 255.0
    canvas += 0.5
    pixels = np.clip(canvas, 0.0, 255.0, out=canvas).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return Sample(jpeg=buffer.getvalue(), label=int(labels[index]), index=index)


def sample_side(index: int, size: int | tuple[int, int], seed: int = 0) -> int:
    """The side `requests` uses for a sample: fixed, or drawn per sample (not per request), so a
    repeated sample is a byte-identical payload that a content-keyed cache can hit."""
    if isinstance(size, int):
        return size
    low, high = size
    if low > high:
        raise OptlabError(f"size range {size} is empty", hint="give (low, high) with low <= high")
    _check_side(low)
    _check_side(high)
    return low + int(_rng(seed, _SIZE_TAG, index).integers(0, high - low + 1))


def request_plan(
    *,
    split: Split = "holdout",
    count: int = 256,
    size: int | tuple[int, int] = 256,
    seed: int = 0,
    repeat_skew: float | None = None,
) -> list[tuple[int, int]]:
    """The (index, side) pairs `requests` renders, in order, without rendering them."""
    if count < 0:
        raise OptlabError(f"request count {count} is negative", hint="use a count >= 0")
    if repeat_skew is not None and repeat_skew <= 0:
        raise OptlabError(
            f"repeat_skew {repeat_skew} must be positive",
            hint="use a Zipf exponent such as 1.1, or leave it unset for no repetition",
        )
    pool = np.array(split_indices(split), dtype=np.int64)
    rng = _rng(seed, _ORDER_TAG)
    order = rng.permutation(pool)
    if repeat_skew is None:
        passes = [order]
        while sum(len(p) for p in passes) < count:
            passes.append(rng.permutation(pool))
        picks = np.concatenate(passes)[:count]
    else:
        weights = 1.0 / np.arange(1, len(pool) + 1, dtype=np.float64) ** repeat_skew
        ranks = rng.choice(len(pool), size=count, p=weights / weights.sum())
        picks = order[ranks]
    return [(int(index), sample_side(int(index), size, seed)) for index in picks]


def requests(
    *,
    split: Split = "holdout",
    count: int = 256,
    size: int | tuple[int, int] = 256,
    seed: int = 0,
    repeat_skew: float | None = None,
) -> list[Sample]:
    """A request stream of `count` payloads drawn from `split`.

    Without `repeat_skew`, samples come in a seeded random order and none repeats until the
    split is exhausted. With it, sample ranks follow a Zipf law of that exponent (1.1 is typical
    of real traffic): a few samples recur often, which is what a response cache exploits. A
    repeated sample is the same `Sample` object, byte-identical payload included.
    """
    plan = request_plan(split=split, count=count, size=size, seed=seed, repeat_skew=repeat_skew)
    rendered: dict[int, Sample] = {}
    for index, side in plan:
        if index not in rendered:
            rendered[index] = render(index, size=side, seed=seed)
    return [rendered[index] for index, _ in plan]


def decode_reference(jpeg: bytes, side: int) -> npt.NDArray[np.float32]:
    """The canonical preprocess: JPEG decode, PIL bilinear resize to `side` x `side`, scale to
    [0, 1], normalise with MEAN/STD, channels first. Training uses it, and faster variants are
    checked against it."""
    from PIL import Image

    with Image.open(io.BytesIO(jpeg)) as image:
        resized = image.convert("RGB").resize((side, side), Image.Resampling.BILINEAR)
    pixels = np.asarray(resized, dtype=np.float32) * np.float32(1.0 / 255.0)
    mean = np.asarray(MEAN, dtype=np.float32)
    std = np.asarray(STD, dtype=np.float32)
    return np.ascontiguousarray(((pixels - mean) / std).transpose(2, 0, 1))
