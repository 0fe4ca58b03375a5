"""The reference target's preprocess variants: JPEG bytes in, one normalised model input out.

Every variant returns float32, 3 x side x side, normalised with MEAN/STD like
`data.decode_reference` (the canonical preprocess), and decodes with PIL: nobody writes a JPEG
decoder. They differ in how the rest is done, which is what the `preprocess` knob measures:

- ``python``: full-size decode, then a bilinear resize and the normalisation in per-pixel Python
  loops, the way a first service is written. Classic bilinear (the 2 x 2 source pixels around
  each output pixel) does not antialias when downscaling, unlike PIL's resize: a triangle filter
  widened by the scale, which replicated exactly in Python loops cost 60-80 ms per 256 px image
  against 6-9 ms for this. So it differs from the reference on high-frequency detail (sensor
  noise, glyph edges); on the held-out renders the classifier's top-1 agreed with the reference
  inputs on every sample (benchmarks/README.md, tests/integration/test_preprocess_real.py).
- ``numpy``: PIL decodes in JPEG draft mode (`Image.draft`: libjpeg scales by 1/2, 1/4 or 1/8 in
  the DCT domain while decoding, to the smallest size still >= side), PIL's antialiased bilinear
  resize finishes the job, numpy normalises. Fresh arrays per call. Most of its gain over the
  reference (itself vectorised) is the draft decode, which changes pixels (libjpeg's DCT-domain
  downscale is not PIL's triangle filter); the same accuracy checks cover it.
- ``numpy-pooled``: the same maths, bit for bit, into per-thread buffers reused across calls.
- ``torch``: the same draft decode on the CPU, the uint8 pixels uploaded to `device` (pinned and
  non-blocking on CUDA), then the resize (antialiased bilinear, PIL's algorithm in float) and the
  normalisation on the device.

Errors: bytes that are not a decodable image raise `OptlabError` (the pipeline answers that
request with an error). numpy and PIL are the only imports needed for the CPU variants; torch is
imported by the torch variant alone.
"""

from __future__ import annotations

import functools
import io
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from optlab.errors import OptlabError
from optlab.reference.classifier.data import MEAN, MODEL_SIDE, STD

if TYPE_CHECKING:
    from PIL import Image

VARIANTS = ("python", "numpy", "numpy-pooled", "torch")

Preprocess = Callable[[bytes], Any]
# A box inside the decoded image, as PIL's resize takes it: (left, top, right, bottom).
Box = tuple[float, float, float, float]

# Normalisation folded into one multiply and one add per value: (v / 255 - mean) / std
# == v * scale + offset. Computed once in float32 so that every numpy variant rounds alike.
_SCALE = tuple(float(np.float32(1.0 / (255.0 * s))) for s in STD)
_OFFSET = tuple(float(np.float32(-m / s)) for m, s in zip(MEAN, STD, strict=True))

_DECODE_HINT = "send the bytes of a JPEG (or another image format PIL reads)"


def make_preprocessor(variant: str, *, side: int = MODEL_SIDE, device: str = "cpu") -> Preprocess:
    """`preprocess(jpeg_bytes)` for one variant of the `preprocess` knob (see the module doc).

    The result is float32, 3 x side x side: a numpy array for the CPU variants (`device` is
    ignored by them), a torch tensor on `device` for ``torch``. ``numpy-pooled`` returns a
    buffer it reuses: it stays valid until the same thread calls the same preprocessor again,
    so copy it (into the batch) before that. Thread-safe: call it from any number of threads.
    """
    if variant not in VARIANTS:
        raise OptlabError(
            f"unknown preprocess variant {variant!r}",
            hint=f"knobs.preprocess must be one of: {', '.join(VARIANTS)}",
        )
    if isinstance(side, bool) or not isinstance(side, int) or side < 1:
        raise OptlabError(f"preprocess side {side!r} is invalid", hint="use a side >= 1 pixels")
    if variant == "python":
        return functools.partial(_python_preprocess, side=side)
    if variant == "numpy":
        return functools.partial(_numpy_preprocess, side=side)
    if variant == "numpy-pooled":
        return _PooledPreprocessor(side)
    return _torch_preprocessor(side, device)


# --- decoding, shared ------------------------------------------------------------------------


def _decode(jpeg: bytes, side: int, *, draft: bool) -> tuple[Image.Image, Box]:
    """The payload as a loaded RGB image and the box of it that holds the whole picture.

    With `draft`, libjpeg decodes at 1/2, 1/4 or 1/8 scale when the result stays >= side; the
    box is then fractional where the image side is not a multiple of the scale (the last DCT
    column is partial), exactly what `Image.thumbnail` passes to its resize.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(jpeg)) as image:
            box: Box = (0.0, 0.0, float(image.width), float(image.height))
            if draft:
                drafted = image.draft("RGB", (side, side))
                if drafted is not None:
                    box = drafted[1]
            image.load()
            # Greyscale, CMYK, palette: the model takes RGB, as decode_reference converts.
            rgb = image if image.mode == "RGB" else image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        # OSError covers PIL's UnidentifiedImageError and truncated files.
        message = f"the payload is not a decodable image: {exc}"
        raise OptlabError(message, hint=_DECODE_HINT) from exc
    return rgb, box


def _is_full(image: Image.Image, box: Box) -> bool:
    return box == (0.0, 0.0, float(image.width), float(image.height))


def _resized_pixels(jpeg: bytes, side: int) -> npt.NDArray[np.uint8]:
    """Draft decode plus PIL's antialiased bilinear resize: uint8, side x side x 3 (HWC).

    Shared by both numpy variants, so they see identical pixels. `tobytes` is one copy out of
    PIL's storage; `np.frombuffer` wraps it without another (np.asarray(image) does the same
    `tobytes` behind its array interface, plus a little overhead).
    """
    from PIL import Image

    image, box = _decode(jpeg, side, draft=True)
    if image.size != (side, side) or not _is_full(image, box):
        image = image.resize((side, side), Image.Resampling.BILINEAR, box=box)
    return np.frombuffer(image.tobytes(), dtype=np.uint8).reshape(side, side, 3)


# --- python: per-pixel loops -----------------------------------------------------------------


@functools.lru_cache(maxsize=256)
def _bilinear_taps(in_size: int, out_size: int) -> tuple[tuple[int, int, float], ...]:
    """Per output coordinate: the two source indices around its centre and the weight of the
    second. Pixel centres align as in PIL ((o + 0.5) * scale - 0.5), clamped at the edges."""
    scale = in_size / out_size
    taps = []
    for out in range(out_size):
        source = min(max((out + 0.5) * scale - 0.5, 0.0), in_size - 1.0)
        low = int(source)
        high = min(low + 1, in_size - 1)
        taps.append((low, high, source - low))
    return tuple(taps)


def _python_preprocess(jpeg: bytes, side: int) -> npt.NDArray[np.float32]:
    image, _ = _decode(jpeg, side, draft=False)
    width, height = image.size
    pixels = image.tobytes()  # RGB, row by row: indexing bytes yields ints, cheaply
    stride = width * 3
    columns = [(x0 * 3, x1 * 3, fx) for x0, x1, fx in _bilinear_taps(width, side)]
    rows = [(y0 * stride, y1 * stride, fy) for y0, y1, fy in _bilinear_taps(height, side)]
    (r_scale, g_scale, b_scale), (r_offset, g_offset, b_offset) = _SCALE, _OFFSET
    plane = side * side
    values = [0.0] * (3 * plane)  # channels first, filled in place
    index = 0
    for top, bottom, fy in rows:
        gy = 1.0 - fy
        for left, right, fx in columns:
            gx = 1.0 - fx
            w00, w01, w10, w11 = gy * gx, gy * fx, fy * gx, fy * fx
            a, b, c, d = top + left, top + right, bottom + left, bottom + right
            red = pixels[a] * w00 + pixels[b] * w01 + pixels[c] * w10 + pixels[d] * w11
            green = (
                pixels[a + 1] * w00
                + pixels[b + 1] * w01
                + pixels[c + 1] * w10
                + pixels[d + 1] * w11
            )
            blue = (
                pixels[a + 2] * w00
                + pixels[b + 2] * w01
                + pixels[c + 2] * w10
                + pixels[d + 2] * w11
            )
            values[index] = red * r_scale + r_offset
            values[index + plane] = green * g_scale + g_offset
            values[index + 2 * plane] = blue * b_scale + b_offset
            index += 1
    return np.array(values, dtype=np.float32).reshape(3, side, side)


# --- numpy and numpy-pooled: vectorised, fresh arrays or reused ones -----------------------

# Per-channel numpy float32 scalars: multiplying a plane by a scalar in place runs without
# numpy's iterator buffers, where broadcasting a (3, 1, 1) scale, or multiplying the uint8
# pixels straight into the float buffer, allocates 32-64 KiB of them per call (tracemalloc).
# Scaling an HWC float array by a (3,) vector, the obvious numpy, is worse still: an inner
# loop of length 3, about 70 us against 10 us for the three planes here at 64 px.
_SCALE32 = tuple(np.float32(value) for value in _SCALE)
_OFFSET32 = tuple(np.float32(value) for value in _OFFSET)


def _normalise_into(pixels: npt.NDArray[np.uint8], out: npt.NDArray[np.float32]) -> None:
    """uint8 HWC pixels into the float32 CHW `out`: a casting copy that also transposes, then
    one in-place multiply and add per channel. No temporaries; both numpy variants call it,
    so they agree bit for bit."""
    np.copyto(out, pixels.transpose(2, 0, 1), casting="unsafe")
    for channel in range(3):
        plane = out[channel]
        np.multiply(plane, _SCALE32[channel], out=plane)
        np.add(plane, _OFFSET32[channel], out=plane)


def _numpy_preprocess(jpeg: bytes, side: int) -> npt.NDArray[np.float32]:
    out = np.empty((3, side, side), dtype=np.float32)
    _normalise_into(_resized_pixels(jpeg, side), out)
    return out


class _PooledPreprocessor:
    """`numpy` into a buffer per thread: the result IS that 3 x side x side float32 buffer,
    overwritten by the same thread's next call (threading.local, so threads never share one).

    What is left to allocate per call is PIL's: the decoded and resized images, and the bytes
    `tobytes` hands over (it encodes into a 64 KiB chunk, ImageFile.MAXBLOCK, and trims it).
    PIL has no public way to decode or export into a caller's buffer: `Image.frombuffer` maps
    one, but pasting into the mapped image copies it first (it is read-only).
    """

    def __init__(self, side: int) -> None:
        self.side = side
        self._local = threading.local()

    def _buffer(self) -> npt.NDArray[np.float32]:
        out: npt.NDArray[np.float32] | None = getattr(self._local, "out", None)
        if out is None:
            out = np.empty((3, self.side, self.side), dtype=np.float32)
            self._local.out = out
        return out

    def __call__(self, jpeg: bytes) -> npt.NDArray[np.float32]:
        pixels = _resized_pixels(jpeg, self.side)
        out = self._buffer()
        _normalise_into(pixels, out)
        return out


# --- torch: resize and normalise on the device -----------------------------------------------


def _torch_device(device: str) -> Any:
    import torch

    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise OptlabError(
            f"preprocess device {device!r} is not a torch device: {exc}", hint="use cpu or cuda"
        ) from exc
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise OptlabError(
                f"preprocess 'torch' on device {device!r} needs CUDA, but this torch "
                f"({torch.__version__}) sees no CUDA device",
                hint="use device: cpu (or another preprocess), or run on a machine with an "
                "NVIDIA GPU and a CUDA build of torch (installed with -c constraints.txt)",
            )
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise OptlabError(
                f"preprocess device {device!r} does not exist: "
                f"{torch.cuda.device_count()} CUDA device(s) visible",
                hint="use cuda or cuda:0",
            )
    elif resolved.type != "cpu":
        raise OptlabError(
            f"preprocess 'torch' does not support device {device!r}", hint="use cpu or cuda"
        )
    return resolved


def _torch_preprocessor(side: int, device: str) -> Preprocess:
    import torch
    import torch.nn.functional as functional

    target = _torch_device(device)
    on_cuda = target.type == "cuda"
    # Made once, on the device: per call they would be two small host-to-device copies.
    scale = torch.tensor(_SCALE, dtype=torch.float32, device=target).view(1, 3, 1, 1)
    offset = torch.tensor(_OFFSET, dtype=torch.float32, device=target).view(1, 3, 1, 1)

    def preprocess(jpeg: bytes) -> torch.Tensor:
        image, box = _decode(jpeg, side, draft=True)
        pixels = np.asarray(image)  # uint8 HWC, read-only (a view of PIL's bytes)
        if on_cuda:
            # Pinned through torch's caching host allocator, which also keeps the block alive
            # until the asynchronous copy has read it.
            host = torch.empty(pixels.shape, dtype=torch.uint8, pin_memory=True)
            host.numpy()[...] = pixels
            uploaded = host.to(target, non_blocking=True)
        else:
            uploaded = torch.from_numpy(pixels.copy())  # from_numpy wants a writable array
        batch = uploaded.permute(2, 0, 1).unsqueeze(0)
        batch = batch.to(torch.float32, memory_format=torch.contiguous_format)
        if image.size != (side, side) or not _is_full(image, box):
            batch = _resize(functional, batch, image.size, box, side)
            # PIL stores its resize in uint8; rounding here keeps the variants within a level.
            batch = batch.round_().clamp_(0.0, 255.0)
        batch.mul_(scale).add_(offset)
        return batch[0]

    return preprocess


def _resize(functional: Any, batch: Any, size: tuple[int, int], box: Box, side: int) -> Any:
    """Antialiased bilinear to side x side from the `box` of the image (box starts at 0, 0).

    interpolate takes no box. When the box ends inside the last pixel (a draft decode of a side
    that is not a multiple of the scale), scale factors of side / box map output centres onto
    the box exactly as PIL's resize does; interpolate's output size is then
    floor(size * factor), which is `side` unless rounding says otherwise (then the whole image
    is used, off by under one source pixel).
    """
    width, height = size
    if box != (0.0, 0.0, float(width), float(height)):
        factors = (side / box[3], side / box[2])
        if int(height * factors[0]) == side and int(width * factors[1]) == side:
            return functional.interpolate(
                batch,
                scale_factor=factors,
                mode="bilinear",
                align_corners=False,
                antialias=True,
                recompute_scale_factor=False,
            )
    return functional.interpolate(
        batch, size=(side, side), mode="bilinear", align_corners=False, antialias=True
    )


__all__ = ["VARIANTS", "Preprocess", "make_preprocessor"]
