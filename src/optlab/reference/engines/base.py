"""What every inference engine shares: the protocol, the errors, argument checks, input
conversion and the on-disk artefact cache.

Nothing here imports torch, onnxruntime or tensorrt: `load_engine` imports the one backend module
that was asked for, and that module imports its framework when an engine is built.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from optlab.errors import OptlabError
from optlab.reference.classifier.data import MODEL_SIDE

ENGINES = ("torch", "onnxruntime", "tensorrt")
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
CACHE_ENV = "OPTLAB_CACHE_DIR"
CHANNELS = 3
NUM_CLASSES = 10

# engine name -> module that holds its `build(precision, device, threads, cache_dir)`.
_MODULES = {
    "torch": "optlab.reference.engines.torch_engine",
    "onnxruntime": "optlab.reference.engines.onnx_engine",
    "tensorrt": "optlab.reference.engines.tensorrt_engine",
}


class EngineError(OptlabError):
    """An engine cannot be built or cannot run a batch as configured."""


class EngineUnavailableError(EngineError):
    """The engine needs a package or a device that this machine does not have."""


class UnsupportedPrecisionError(EngineError):
    """The engine does not implement this precision on this device."""


@runtime_checkable
class Engine(Protocol):
    """A loaded model that turns a batch of preprocessed images into logits.

    `description` says what actually runs: engine, precision, device, threads, the providers in
    use, the cached artefact (or None), how long building it took, and backend versions.
    `infer` takes a float32 numpy array N x 3 x 64 x 64 (normalised as `data.decode_reference`
    does) or a torch tensor of that shape (any float dtype, possibly already on the engine's
    device) and returns float32 logits N x 10 on the host.
    """

    description: dict[str, Any]

    def infer(self, batch: Any) -> npt.NDArray[np.float32]: ...

    def close(self) -> None: ...


def load_engine(
    engine: str, precision: str, device: str, threads: int, *, cache_dir: Path | None = None
) -> Engine:
    """Build the engine the knobs ask for, or raise an EngineError that says which knob to change.

    Never falls back: an engine that cannot do what was asked raises instead of running
    something else under the requested name.
    """
    if engine not in _MODULES:
        raise EngineError(
            f"unknown engine {engine!r}",
            hint=f"knobs.engine: choose one of {', '.join(ENGINES)}",
        )
    if precision not in PRECISIONS:
        raise EngineError(
            f"unknown precision {precision!r}",
            hint=f"knobs.precision: choose one of {', '.join(PRECISIONS)}",
        )
    check_device(device)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise EngineError(
            f"threads must be a positive integer, not {threads!r}",
            hint="knobs.threads: use 1 or more intra-op threads",
        )
    module = importlib.import_module(_MODULES[engine])
    built: Engine = module.build(precision, device, threads, cache_dir)
    return built


def check_device(device: str) -> None:
    if device == "cpu" or device == "cuda":
        return
    index = device.removeprefix("cuda:")
    if device.startswith("cuda:") and index.isdigit():
        return
    raise EngineError(f"unknown device {device!r}", hint="knobs.device: choose cpu or cuda")


def cuda_unavailable(engine: str) -> EngineUnavailableError:
    return EngineUnavailableError(
        f"engine {engine} was asked for device cuda, but torch sees no usable CUDA GPU here",
        hint="knobs.device: use cpu on this machine, or run on a machine with an NVIDIA GPU "
        "and a CUDA build of torch",
    )


# --- inputs ---------------------------------------------------------------------------------


def is_torch_tensor(batch: object) -> bool:
    """True for a torch.Tensor, without importing torch (it is loaded if one exists)."""
    return type(batch).__module__.startswith("torch") and hasattr(batch, "data_ptr")


def check_batch_shape(shape: tuple[int, ...]) -> None:
    expected = (CHANNELS, MODEL_SIDE, MODEL_SIDE)
    if len(shape) != 4 or tuple(shape[1:]) != expected or shape[0] < 1:
        raise EngineError(
            f"a batch must have shape N x {CHANNELS} x {MODEL_SIDE} x {MODEL_SIDE} with N >= 1, "
            f"not {tuple(shape)}",
            hint="stack preprocessed images (data.decode_reference) along a new first axis",
        )


def host_array(batch: Any) -> npt.NDArray[np.float32]:
    """The batch as a C-contiguous float32 numpy array (a copy only where one is needed)."""
    array = batch.detach().float().cpu().numpy() if is_torch_tensor(batch) else np.asarray(batch)
    if array.dtype != np.float32 or not array.flags.c_contiguous:
        array = np.ascontiguousarray(array, dtype=np.float32)
    check_batch_shape(array.shape)
    return array


def check_open(closed: bool, engine: str) -> None:
    if closed:
        raise EngineError(
            f"the {engine} engine was closed", hint="load a new engine with load_engine(...)"
        )


# --- the artefact cache ----------------------------------------------------------------------


def cache_root(cache_dir: Path | None = None) -> Path:
    """Where built artefacts live: `cache_dir`, else $OPTLAB_CACHE_DIR, else
    ~/.cache/optlab/engines. Created if missing."""
    if cache_dir is not None:
        root = Path(cache_dir)
    elif os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        root = Path.home() / ".cache" / "optlab" / "engines"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EngineError(
            f"the engine cache folder {root} cannot be created: {exc}",
            hint=f"set {CACHE_ENV} to a writable folder",
        ) from exc
    return root


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_bytes(path.read_bytes())


def content_key(parts: Mapping[str, Any]) -> str:
    """A stable hash of everything an artefact depends on (JSON with sorted keys)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return sha256_bytes(text.encode("utf-8"))


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename over `path`: a reader sees the
    old file or the new one, never a half-written one, even with two writers at once."""
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        # mkstemp creates the file private (0600); a shared cache must be readable by others.
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _build_lock(path: Path) -> Iterator[None]:
    """Serialise builds of one artefact across processes, so a second process waits for the
    first and then hits the cache instead of building the same thing again. Correctness does
    not depend on it (writes are atomic and verified); where fcntl is missing it is skipped."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


@dataclass(frozen=True)
class Artifact:
    """A built file and its bytes. `cached`: it was read from disk and not built now.
    `repaired`: a file was there but failed its check (corrupt, truncated) and was rebuilt."""

    path: Path
    data: bytes
    key: str
    cached: bool
    repaired: bool
    build_s: float

    @property
    def sha256(self) -> str:
        return sha256_bytes(self.data)


def _read_valid(path: Path, manifest: Path, key: str) -> bytes | None:
    """The artefact's bytes if it and its manifest exist and agree (key and content hash)."""
    try:
        data = path.read_bytes()
        meta = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("key") != key:
        return None
    if meta.get("sha256") != sha256_bytes(data) or meta.get("size") != len(data):
        return None
    return data


def cached_artifact(
    folder: Path, stem: str, suffix: str, parts: Mapping[str, Any], build: Callable[[], bytes]
) -> Artifact:
    """The artefact for `parts`, read from the cache when a verified copy is there, else built
    with `build()` and stored (artefact first, then a JSON manifest with its hash).

    The file name carries the key, so artefacts for other weights, versions or precisions sit
    side by side. Callers load the returned bytes rather than re-reading the file, so a
    concurrent writer can never hand them a different file than the one verified.
    """
    folder.mkdir(parents=True, exist_ok=True)
    key = content_key(parts)
    path = folder / f"{stem}-{key[:20]}{suffix}"
    manifest = path.with_name(path.name + ".json")
    data = _read_valid(path, manifest, key)
    if data is not None:
        return Artifact(path, data, key, cached=True, repaired=False, build_s=0.0)
    with _build_lock(path):
        # Another process may have built it while this one waited for the lock.
        data = _read_valid(path, manifest, key)
        if data is not None:
            return Artifact(path, data, key, cached=True, repaired=False, build_s=0.0)
        repaired = path.exists()
        start = time.perf_counter()
        data = build()
        build_s = time.perf_counter() - start
        atomic_write(path, data)
        meta = {
            "key": key,
            "sha256": sha256_bytes(data),
            "size": len(data),
            "build_s": round(build_s, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "parts": dict(parts),
        }
        atomic_write(manifest, json.dumps(meta, indent=1, default=str).encode("utf-8"))
    return Artifact(path, data, key, cached=False, repaired=repaired, build_s=build_s)


def artifact_description(artifact: Artifact) -> dict[str, Any]:
    return {
        "artifact": str(artifact.path),
        "artifact_sha256": artifact.sha256,
        "cache_key": artifact.key,
        "cached": artifact.cached,
        "repaired": artifact.repaired,
        "build_s": round(artifact.build_s, 3),
    }


__all__ = [
    "ENGINES",
    "PRECISIONS",
    "Artifact",
    "Engine",
    "EngineError",
    "EngineUnavailableError",
    "UnsupportedPrecisionError",
    "cache_root",
    "cached_artifact",
    "load_engine",
]
