"""What this machine can do: the only place a test may skip itself (tests/unit/
test_suite_layout.py checks it). A test skips for a capability the machine lacks (a GPU, root,
a tmpfs mount, an optional package), never because the machine is busy: a busy machine is a
condition the test's design must survive (README, "Tests").
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from functools import cache
from types import ModuleType
from typing import NoReturn

import pytest


@cache
def has_cuda() -> bool:
    """torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def is_root() -> bool:
    return os.geteuid() == 0


def has_git() -> bool:
    return shutil.which("git") is not None


def lacks(capability: str) -> NoReturn:
    """Skip the running test: this machine cannot do `capability`, found out by trying (a
    tmpfs mount refused, a signal the platform does not deliver to a thread). Say what was
    tried and what the machine answered."""
    pytest.skip(f"this machine lacks a capability: {capability}")


def module(name: str) -> ModuleType:
    """The optional package `name`, or skip the running test where it is not installed."""
    found: ModuleType = pytest.importorskip(name)
    return found


def needs_cuda() -> pytest.MarkDecorator:
    """Skip where torch sees no CUDA device (torch is imported when the mark is made)."""
    return pytest.mark.skipif(not has_cuda(), reason="torch sees no CUDA device here")


def without_cuda() -> pytest.MarkDecorator:
    """Skip where torch sees a CUDA device: the test is about the path without one."""
    return pytest.mark.skipif(has_cuda(), reason="this machine has CUDA: the no-CUDA path")


needs_root = pytest.mark.skipif(not is_root(), reason="needs root")
not_root = pytest.mark.skipif(is_root(), reason="root is exempt from file permissions")
needs_git = pytest.mark.skipif(not has_git(), reason="git is not installed")


def has_tensorrt() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorrt") is not None


@cache
def has_ort_cuda() -> bool:
    """onnxruntime-gpu's CUDA provider is listed (it is listed without a GPU too)."""
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


@cache
def has_nvml() -> bool:
    """NVIDIA's management library answers (a driver is loaded)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def needs_tensorrt() -> pytest.MarkDecorator:
    return pytest.mark.skipif(not has_tensorrt(), reason="tensorrt is not installed")


def without_tensorrt() -> pytest.MarkDecorator:
    """Skip where tensorrt is installed: the test is about the path without it."""
    return pytest.mark.skipif(has_tensorrt(), reason="tensorrt is installed here")


def needs_ort_cuda() -> pytest.MarkDecorator:
    return pytest.mark.skipif(not has_ort_cuda(), reason="onnxruntime-gpu is not installed")


def without_nvml() -> pytest.MarkDecorator:
    """Skip where NVML works: the test is about a machine without NVIDIA's driver."""
    return pytest.mark.skipif(has_nvml(), reason="NVML is usable on this machine")


needs_linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")
not_windows = pytest.mark.skipif(sys.platform == "win32", reason="not on Windows")
needs_posix_signals = pytest.mark.skipif(
    not hasattr(signal, "pthread_kill"), reason="needs POSIX signals"
)
