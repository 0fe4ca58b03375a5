"""The labelled fault scenarios `benchmarks/diagnosis_accuracy.py` scores `optlab diagnose` on:
each a target of `optlab.reference.faults`, the load that shows its fault, and the label
{stage, resource} a diagnosis should give (docs/diagnose.md "How often it is right")."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optlab.reference import faults

__all__ = ["SCENARIOS", "Scenario", "by_name"]

# -- the scenarios: factory, knobs, load, label --------------------------------------------------

Draw = Callable[[random.Random], dict[str, Any]]


@dataclass(frozen=True)
class Scenario:
    """One labelled fault: the target, how to load it, and what a diagnosis should say.

    `label` is (stage, resource), stage None when no one stage holds the fault; None for the
    healthy control. `draw(rng)` gives the knobs and load that vary with the seed."""

    name: str
    factory: str
    label: tuple[str | None, str] | None
    load: dict[str, Any]
    knobs: dict[str, Any] = field(default_factory=dict)
    draw: Draw | None = None
    neighbour: bool = False  # the caller runs a process burning every core meanwhile

    @property
    def reference(self) -> str:
        return f"{faults.__name__}:{self.factory}"

    def config(self, seed: int, *, protocol: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The experiment file's content (a baseline) for this seed."""
        rng = random.Random(f"{self.name}/{seed}")
        drawn = self.draw(rng) if self.draw is not None else {}
        load = {**self.load, **drawn.pop("load", {})}
        return {
            "name": f"{self.name}-s{seed}",
            "description": f"fault scenario {self.name}, seed {seed}",
            "target": {"kind": "python", "factory": self.reference},
            "knobs": {**self.knobs, **drawn, "seed": seed},
            "workload": {"load": load, "seed": seed},
            "protocol": dict(protocol or {"name": "quick"}),
        }


def _closed(concurrency: int) -> dict[str, Any]:
    return {"mode": "closed", "concurrency": concurrency}


def _open(rate: float) -> dict[str, Any]:
    return {"mode": "open", "rate": rate, "arrival": "poisson"}


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "cpu-preprocess",
        "cpu_preprocess",
        ("preprocess", "cpu"),
        _closed(4),
        draw=lambda r: {"elements": r.choice([400_000, 500_000, 600_000]), "rounds": 4},
    ),
    Scenario(
        "compute-infer",
        "compute_infer",
        ("infer", "cpu"),
        _closed(4),
        draw=lambda r: {"side": 64, "batch": r.choice([256, 384, 512])},
    ),
    Scenario(
        "lock",
        "lock_contention",
        ("infer", "lock"),
        _closed(8),
        draw=lambda r: {"hold_ms": round(r.uniform(2.0, 5.0), 2)},
    ),
    Scenario(
        "under-batching",
        "under_batching",
        ("queue", "queue"),
        _closed(2),
        draw=lambda r: {
            "batching": {"max_batch_size": 32, "max_wait_ms": round(r.uniform(5.0, 9.0), 1)}
        },
    ),
    Scenario(
        "gil",
        "gil_contention",
        ("preprocess", "gil"),
        _closed(8),
        draw=lambda r: {"iterations": r.choice([15_000, 20_000, 25_000])},
    ),
    Scenario(
        "memory-leak",
        "memory_leak",
        (None, "memory"),
        _open(200),
        draw=lambda r: {"load": {"rate": r.choice([150, 200, 250])}},
    ),
    Scenario(
        "io-wait",
        "io_wait",
        ("load", "io"),
        _closed(2),
        draw=lambda r: {"write_kib": r.choice([32, 64, 128])},
    ),
    Scenario(
        "periodic-stall",
        "periodic_stall",
        (None, "stall"),
        _open(200),
        draw=lambda r: {
            "stall_every_s": round(r.uniform(1.0, 2.0), 2),
            "stall_ms": round(r.uniform(100.0, 300.0)),
        },
    ),
    Scenario(
        "generator-limit",
        "cheap",
        (None, "generator"),
        _open(100_000),
    ),
    Scenario(
        "noisy-neighbour",
        "moderate",
        (None, "neighbour"),
        _closed(2),
        neighbour=True,
        draw=lambda r: {"sleep_ms": round(r.uniform(1.5, 3.0), 1)},
    ),
    Scenario(
        "gc-churn",
        "gc_churn",
        (None, "memory"),
        _open(100),
        draw=lambda r: {
            "heap": r.choice([100_000, 150_000, 200_000]),
            "load": {"rate": r.choice([80, 100, 120])},
        },
    ),
    Scenario(
        "pool-of-one",
        "pool_of_one",
        ("infer", "lock"),
        _closed(8),
        draw=lambda r: {"batch": r.choice([192, 256, 320])},
    ),
    Scenario(
        "sleep-stage",
        "sleep_stage",
        None,
        _closed(8),
        draw=lambda r: {"sleep_ms": r.choice([0.5, 1.0, 2.0])},
    ),
    Scenario(
        "healthy",
        "healthy",
        None,
        _open(200),
        draw=lambda r: {
            "sleep_ms": round(r.uniform(2.0, 4.0), 1),
            "load": {"rate": r.choice([150, 200, 250])},
        },
    ),
)


def by_name(names: str | None = None) -> list[Scenario]:
    """The scenarios named in a comma-separated list (all of them for None), in table order."""
    if not names:
        return list(SCENARIOS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = {s.name: s for s in SCENARIOS}
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ValueError(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return [known[n] for n in wanted]
