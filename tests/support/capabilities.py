"""What this machine can do: the only place a test may skip itself (tests/unit/
test_suite_layout.py checks it). A test skips for a capability the machine lacks (a GPU, root,
a tmpfs mount, an optional package), never because the machine is busy: a busy machine is a
condition the test's design must survive (README, "Tests").
"""

from __future__ import annotations

import os
import shutil
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
