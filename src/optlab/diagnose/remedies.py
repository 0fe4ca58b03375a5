"""From a finding to the next step: the one knob to change, and the step file that changes it.

What a target's knobs mean is its kind's to say (`optlab.targets.kind.TargetKind.remedy`): the
reference classifier's kind knows its knobs (docs/experiment-files.md); a python, http or command
target answers with the remedies its experiment file declares (`target.remedies`). Where no knob
answers a finding, the remedy is advice in prose and no file is written.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from optlab.diagnose.evidence import Evidence
from optlab.diagnose.findings import Fired
from optlab.diagnose.rules import Rule
from optlab.errors import ConfigError
from optlab.targets.remedies import Remedy

__all__ = [
    "Suggestion",
    "advice_for",
    "stamp",
    "step_document",
    "step_name",
    "step_path",
    "suggest",
    "write_step",
]

Suggestion = Remedy  # the name a finding's `suggestion` has had


# What to do when no knob optlab knows is the remedy (and what to look at next).
ADVICE: dict[str, str] = {
    "load-generator": "measure the target as a service (kind command or http) so the generator "
    "has its own process, lower the rate, or use a closed loop",
    "saturated": "lower workload.load.rate to measure latency under a load the target sustains, "
    "or sweep it (`optlab sweep`) to find its capacity; the next findings say what limits it",
    "gc-churn": "allocate less per request (reuse buffers, fewer temporary objects), call "
    "gc.freeze() after start-up, or raise the collector's thresholds (gc.set_threshold)",
    "noisy-neighbour": "stop the other work (or pin the run with taskset), then measure again; "
    "`optlab run --paired` cancels a slow drift",
    "errors": "read the errors with `optlab log`; lower the load or give the target room "
    "(queue limits, timeouts) before tuning speed",
    "memory-leak": "find what each request leaves behind (tracemalloc snapshots before and "
    "after a burst of requests); a cache without a bound is the usual suspect",
    "io-wait": "keep the data in memory, prefetch or read it in bigger blocks; move writes "
    "off the request path",
    "gpu-compute-bound": "make the model cheaper: fp16 or int8 precision, TensorRT, a smaller "
    "model",
    "gpu-starved": "move preprocessing to the GPU or vectorise it, and overlap it with "
    "inference (more workers feeding the GPU)",
    "gpu-throttled": "check power and cooling (nvidia-smi -q -d PERFORMANCE) before trusting "
    "the timings",
    "cpu-bound": "make the busiest stage cheaper (vectorise it, a faster engine) or give it "
    "more cores",
    "gil-bound": "move the Python work out of the GIL (vectorised numpy, a compiled "
    "extension) or into processes instead of threads",
    "serialised": "find the lock or the single worker the stage waits for; a pool of "
    "workers or finer locking lets requests overlap",
    "queueing": "serve more requests per engine pass (dynamic batching) or add instances",
    "under-batching": "shorten the batch timeout, or send more concurrent requests",
    "tail-stalls": "find the pause: gc.freeze() after start-up or higher gc thresholds for "
    "Python, or a background task sharing the lock; `optlab run --profile` shows where",
    "network": "keep connections alive, send smaller or binary payloads, or serve nearer",
}


# A service already has a process of its own: the generator's remedies are elsewhere.
SERVICE_GENERATOR = (
    "lower the rate, spread the load over workload.load.processes, or give the load generator "
    "a core of its own (fewer busy processes, or another machine)"
)


def advice_for(rule: Rule, evidence: Evidence | None = None) -> str:
    if rule.id == "load-generator" and evidence is not None and not evidence.in_process:
        return SERVICE_GENERATOR
    return ADVICE.get(rule.id, "")


def suggest(rule: Rule, fired: Fired, evidence: Evidence) -> Suggestion | None:
    """The one knob that answers `fired`, as the target's kind says; None where it knows none
    (the finding's advice says what to try) or the run's config no longer parses."""
    if evidence.kind is None or evidence.config is None:
        return None
    return evidence.kind.remedy(rule.id, fired.stage, evidence.config, evidence.cores)


# -- the step file ---------------------------------------------------------------------------

_SAFE = re.compile(r"[^a-z0-9]+")


def _slug(text: str) -> str:
    return _SAFE.sub("-", text.lower())[:40].strip("-") or "step"


def step_document(
    parent: str, suggestion: Suggestion, hypothesis: str, name: str
) -> dict[str, Any]:
    return {
        "name": name,
        "parent": parent,
        "hypothesis": hypothesis,
        "change": {suggestion.knob: suggestion.value},
    }


def step_path(folder: Path, parent_file: Path | None, suggestion: Suggestion) -> Path:
    """Where the step goes: beside its parent, numbered one past the parent's own number
    ("02-dynamic-batch.yaml" -> "03-..."; a baseline's step is 01), named by the change, so
    asking twice for the same step finds the file already there."""
    number = 0
    if parent_file is not None and (match := re.match(r"(\d+)-", parent_file.name)):
        number = int(match.group(1))
    value = suggestion.value
    label = value.get("mode", "") if isinstance(value, dict) else str(value)
    return folder / f"{number + 1:02d}-{_slug(f'{suggestion.knob}-{label}')}.yaml"


def write_step(path: Path, document: dict[str, Any], header: str) -> Path:
    """Write the step file; refuses to overwrite anything."""
    text = "".join(f"# {line}\n" for line in header.splitlines())
    text += yaml.safe_dump(document, sort_keys=False, width=100, allow_unicode=True)
    try:
        with path.open("x", encoding="utf-8") as handle:  # "x": never overwrite
            handle.write(text)
    except FileExistsError:
        raise ConfigError(
            f"{path}: a file of that name exists; nothing was written",
            hint="the step may be written already: run `optlab diff` on it, or move the file "
            "away and ask again",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot write the step file: {exc.strerror or exc}",
            hint="write it into a folder you can write to (--output PATH)",
        ) from None
    return path


def step_name(parent: str, suggestion: Suggestion, taken: set[str]) -> str:
    """The chain's prefix (the parent's first word: "cpu" of "cpu-baseline") and the change,
    so names stay short down a chain: cpu-preprocess-numpy-pooled, cpu-batching-dynamic."""
    value = suggestion.value
    label = value.get("mode", "") if isinstance(value, dict) else str(value)
    prefix = parent.split("-", 1)[0] if "-" in parent else parent
    base = _slug(f"{prefix}-{suggestion.knob}-{label}")
    name, suffix = base, 2
    while name in taken:
        name, suffix = f"{base}-{suffix}", suffix + 1
    return name


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
