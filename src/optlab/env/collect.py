"""Collecting the environment fingerprint: a photograph of the machine and software a run
measured on, and the version hazards it shows.

Nothing heavy is imported at module level; package versions come from importlib.metadata, and
NVML is loaded on use. Comparing two fingerprints is `optlab.env.compare`'s job.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from optlab._version import __version__

FINGERPRINT_SCHEMA = 1

# Variables that change thread pools, kernels or visible devices: as material as a library version.
PERFORMANCE_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "KMP_AFFINITY",
    "OMP_PROC_BIND",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_LAUNCH_BLOCKING",
    "NVIDIA_TF32_OVERRIDE",
    "PYTORCH_CUDA_ALLOC_CONF",
)

# Short: provenance is a nicety, and a hung git (network filesystem, lock) must not stall a run.
_GIT_TIMEOUT_S = 5.0


# --------------------------------------------------------------------------- hazards


def _major_minor(version: str | None) -> tuple[int, int] | None:
    if not version:
        return None
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def hazard_warnings(fp: dict[str, Any]) -> list[str]:
    """Known version hazards in a fingerprint. Pure, so it is testable by editing the dict."""
    software = fp.get("software") or {}
    packages = software.get("packages") or {}
    nvidia = software.get("nvidia") or {}
    gpu_count = (fp.get("hardware") or {}).get("gpu_count") or 0
    ort, ort_gpu = packages.get("onnxruntime"), packages.get("onnxruntime_gpu")
    torch, torch_cuda = packages.get("torch"), packages.get("torch_cuda")
    warnings: list[str] = []

    if ort and ort_gpu:
        # Both wheels unpack into the same `onnxruntime/` folder; whichever installed last wins,
        # and uninstalling one deletes files the other needs.
        warnings.append(
            f"onnxruntime {ort} and onnxruntime-gpu {ort_gpu} are both installed; they share one "
            "module folder. Uninstall both, then reinstall only one."
        )
    built, driver = _major_minor(torch_cuda), _major_minor(nvidia.get("cuda_driver_version"))
    if built and driver and built > driver:
        warnings.append(
            f"torch {torch} was built for CUDA {torch_cuda} but the driver supports at most CUDA "
            f"{nvidia.get('cuda_driver_version')}; upgrade the driver or install a torch build "
            "for an older CUDA."
        )
    if gpu_count and torch and not torch_cuda:
        warnings.append(
            f"{gpu_count} GPU(s) present but torch {torch} is a CPU build; install a CUDA build "
            "to use them."
        )
    if gpu_count and ort and not ort_gpu:
        warnings.append(
            f"onnxruntime {ort} (CPU only) is installed on a machine with {gpu_count} GPU(s); "
            "install onnxruntime-gpu instead to use them."
        )
    return warnings


# --------------------------------------------------------------------------- collection


def _version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _torch_cuda(torch_version: str | None) -> str | None:
    """The CUDA version torch was built for, without importing torch where it can be avoided."""
    if torch_version is None:
        return None
    local = torch_version.partition("+")[2]
    match = re.fullmatch(r"cu(\d+)(\d)", local)
    if match:
        return f"{match.group(1)}.{match.group(2)}"
    if local:
        # +cpu, +rocm6.0, +xpu: not a CUDA build.
        return None
    # PyPI's Linux wheels carry no local tag yet are CUDA builds; torch/version.py says which.
    try:
        text = Path(str(metadata.distribution("torch").locate_file("torch/version.py")))
        source = text.read_text(encoding="utf-8")
    except (OSError, metadata.PackageNotFoundError):
        source = ""
    found = re.search(r"^cuda\s*(?::[^=\n]*)?=\s*(.+)$", source, flags=re.MULTILINE)
    if found:
        literal = found.group(1).strip()
        quoted = re.fullmatch(r"['\"]([^'\"]*)['\"]", literal)
        return quoted.group(1) if quoted else None
    try:  # Last resort, and the only place this module imports torch.
        import torch

        cuda: str | None = torch.version.cuda
        return cuda
    except Exception:  # A broken torch install must not stop the fingerprint.
        return None


def _optlab_version() -> str:
    # A source checkout on PYTHONPATH has no distribution metadata; the package itself knows.
    return _version("optlab") or __version__


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                # "model name" on x86; ARM kernels often only have "Model" or "Hardware".
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _max_freq_mhz() -> float | None:
    try:
        freq = psutil.cpu_freq()
    except Exception:  # psutil raises assorted errors on VMs without cpufreq.
        return None
    # VMs report 0.0 for an unknown maximum; 0 MHz is not a fact worth comparing.
    return float(freq.max) if freq is not None and freq.max else None


def _filesystem_type(path: Path) -> str | None:
    try:
        partitions = psutil.disk_partitions(all=True)
    except Exception:
        return None
    # The deepest mount point holding the path is the filesystem the data lives on.
    inside = [p for p in partitions if path.resolve().is_relative_to(p.mountpoint)]
    deepest = max(inside, key=lambda p: len(p.mountpoint), default=None)
    return (deepest.fstype or None) if deepest is not None else None


def _disk(path: Path) -> dict[str, Any]:
    disk: dict[str, Any] = {"path": str(path), "total_bytes": None, "free_bytes": None}
    with contextlib.suppress(OSError):  # A data dir not created yet has no disk to describe.
        usage = psutil.disk_usage(str(path))
        disk.update(total_bytes=int(usage.total), free_bytes=int(usage.free))
    disk["filesystem"] = _filesystem_type(path)
    return disk


def _text(value: str | bytes) -> str:
    # Older nvidia-ml-py releases return bytes, newer ones str.
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _nvml() -> tuple[list[dict[str, Any]], dict[str, str | None], str | None]:
    """GPUs, driver versions, and the error text when NVML is unusable (never raises)."""
    nvidia: dict[str, str | None] = {"driver_version": None, "cuda_driver_version": None}
    try:
        import pynvml
    except Exception as exc:
        return [], nvidia, f"nvidia-ml-py unavailable: {exc}"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return [], nvidia, f"NVML init failed: {exc}"
    gpus: list[dict[str, Any]] = []
    try:
        nvidia["driver_version"] = _text(pynvml.nvmlSystemGetDriverVersion())
        encoded = int(pynvml.nvmlSystemGetCudaDriverVersion())
        # NVML encodes CUDA 12.4 as 12040.
        nvidia["cuda_driver_version"] = f"{encoded // 1000}.{(encoded % 1000) // 10}"
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                {
                    "index": index,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "memory_total_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                }
            )
    except Exception as exc:
        return [], nvidia, f"NVML query failed: {exc}"
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return gpus, nvidia, None


def _distro() -> str | None:
    try:
        return platform.freedesktop_os_release().get("PRETTY_NAME")
    except OSError:
        return None


def _git(repo: Path, *args: str) -> str | None:
    # No optional locks: `git status` otherwise rewrites the index, which can race with a
    # user's concurrent git command in the same checkout.
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=_GIT_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_provenance(repo_dir: Path | None = None) -> dict[str, Any]:
    """commit, dirty and branch of the repository holding `repo_dir`; all None outside one."""
    repo = repo_dir if repo_dir is not None else Path.cwd()
    inside = _git(repo, "rev-parse", "--is-inside-work-tree")
    if inside != "true":
        return {"commit": None, "dirty": None, "branch": None}
    status = _git(repo, "status", "--porcelain", "--untracked-files=normal")
    return {
        "commit": _git(repo, "rev-parse", "--verify", "-q", "HEAD"),
        "dirty": None if status is None else bool(status),
        # symbolic-ref works on an unborn branch and fails (None) when HEAD is detached.
        "branch": _git(repo, "symbolic-ref", "--short", "-q", "HEAD"),
    }


def collect_fingerprint(
    data_dir: Path | None = None, repo_dir: Path | None = None
) -> dict[str, Any]:
    """Photograph this machine: JSON-serialisable; a missing GPU, git or package is no error."""
    gpus, nvidia, gpu_error = _nvml()
    fp: dict[str, Any] = {
        "schema": FINGERPRINT_SCHEMA,
        "hardware": _hardware(gpus, gpu_error, data_dir if data_dir is not None else Path.cwd()),
        "software": _software(nvidia),
        "runtime": _runtime(),
        "provenance": {"git": git_provenance(repo_dir)},
    }
    fp["warnings"] = hazard_warnings(fp)
    return fp


def host_fingerprint() -> dict[str, Any]:
    """What a load-generating host is, for `workload.load.hosts` (docs/hosts.md): its CPU,
    memory, OS, Python and packages; its name (the node set is part of the environment).
    No GPU, disk or repository: a host that only sends load is judged by what sends it."""
    hardware = _hardware([], None, Path.cwd())
    software = _software({})
    del software["nvidia"], software["python"]["executable"]
    return {
        "host": socket.gethostname(),
        "cpu": hardware["cpu"],
        "memory": hardware["memory"],
        "software": software,
    }


def _hardware(gpus: list[dict[str, Any]], gpu_error: str | None, disk: Path) -> dict[str, Any]:
    logical = os.cpu_count()
    return {
        "cpu": {
            "model": _cpu_model(),
            "arch": platform.uname().machine,
            "physical_cores": psutil.cpu_count(logical=False),
            "logical_cores": logical,
            "max_freq_mhz": _max_freq_mhz(),
            # taskset/cgroup pinning changes throughput as surely as a smaller CPU does.
            "affinity_cores": (
                len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            ),
        },
        "memory": {"total_bytes": int(psutil.virtual_memory().total)},
        "gpus": gpus,
        "gpu_count": len(gpus),
        "gpu_error": gpu_error,
        "disk": _disk(disk),
        "cpu_per_gpu": (logical / len(gpus)) if gpus and logical else None,
    }


def _software(nvidia: dict[str, str | None]) -> dict[str, Any]:
    uname = platform.uname()
    torch_version = _version("torch")
    return {
        "os": {
            "system": uname.system,
            "release": uname.release,
            "version": uname.version,
            "distro": _distro(),
        },
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "nvidia": nvidia,
        "env": {k: os.environ[k] for k in PERFORMANCE_ENV_VARS if k in os.environ},
        "packages": {
            "torch": torch_version,
            "torch_cuda": _torch_cuda(torch_version),
            "onnxruntime": _version("onnxruntime"),
            "onnxruntime_gpu": _version("onnxruntime-gpu"),
            # NVIDIA ships the Python module under several distribution names.
            "tensorrt": _version("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11"),
            "numpy": _version("numpy"),
            "optlab": _optlab_version(),
        },
    }


def _runtime() -> dict[str, Any]:
    boot = psutil.boot_time()
    now = datetime.now(UTC)
    return {
        "hostname": socket.gethostname(),
        "boot_time": datetime.fromtimestamp(boot, UTC).isoformat(),
        "uptime_s": round(now.timestamp() - boot, 3),
        "memory_available_bytes": int(psutil.virtual_memory().available),
        "load_avg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "collected_at": now.isoformat(),
    }
