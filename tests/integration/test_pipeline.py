"""The reference image-classifier pipeline: every knob a real code path, measured end to end."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from optlab.config.knobs import BuiltinKnobs
from optlab.errors import OptlabError
from optlab.metrics.stages import CURRENT, RequestTiming
from optlab.reference import pipeline
from optlab.reference.classifier.accuracy import reference_predict
from optlab.reference.classifier.data import requests
from optlab.store import Store
from tests.support.files import write
from tests.support.inprocess import BATCHED
from tests.support.protocol import QUICK

Invoke = Callable[..., Result]


@pytest.fixture(autouse=True)
def _engine_cache(engine_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPTLAB_CACHE_DIR", str(engine_cache))


def _build(**knobs: Any) -> pipeline.ImageClassifier:
    base: dict[str, Any] = {"preprocess": "numpy", "threads": 1}
    return pipeline.build(BuiltinKnobs.model_validate(base | knobs).model_dump(mode="json"))


def _timed(target: pipeline.ImageClassifier, request: Any) -> tuple[dict[str, Any], RequestTiming]:
    timing = RequestTiming()
    token = CURRENT.set(timing)
    try:
        response = target(request)
    finally:
        CURRENT.reset(token)
    return json.loads(response), timing


SAMPLES = requests(count=24, size=256)


def test_unbatched_answers_match_the_reference_and_time_every_stage() -> None:
    target = _build()
    try:
        answers = [_timed(target, sample) for sample in SAMPLES]
    finally:
        target.close()
    labels = [body["label"] for body, _ in answers]
    expected = reference_predict([s.jpeg for s in SAMPLES])
    assert sum(a == b for a, b in zip(labels, expected, strict=True)) >= len(SAMPLES) - 1
    body, timing = answers[0]
    assert len(body["top"]) == pipeline.TOP_K
    assert body["top"][0]["p"] >= body["top"][1]["p"] >= body["top"][2]["p"]
    assert set(timing.stages or {}) == {"preprocess", "queue", "infer", "postprocess"}
    assert all(ns > 0 for key, ns in (timing.stages or {}).items() if key != "queue")


def test_dynamic_batching_forms_batches_and_answers_each_caller() -> None:
    target = _build(batching={"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 20})
    results: dict[int, tuple[dict[str, Any], RequestTiming]] = {}
    barrier = threading.Barrier(8)

    def client(i: int) -> None:
        barrier.wait()
        results[i] = _timed(target, SAMPLES[i])

    try:
        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        metrics = target.metrics()
    finally:
        target.close()
    expected = reference_predict([s.jpeg for s in SAMPLES[:8]])
    assert [results[i][0]["label"] for i in range(8)] == expected
    batching = metrics["batching"]
    assert batching["requests"] == 8 and batching["batches"] < 8  # several shared a batch
    assert max(int(size) for size in batching["batch_sizes"]) > 1
    # Each request carries the whole batch's forward pass, measured on the batch thread.
    for _, timing in results.values():
        assert {"queue", "infer", "preprocess", "postprocess"} <= set(timing.stages or {})


def test_instances_serve_requests_in_parallel_on_separate_engines() -> None:
    target = _build(instances=2)
    barrier = threading.Barrier(6)
    labels: list[int] = []

    def client(i: int) -> None:
        barrier.wait()
        for sample in SAMPLES[i::6]:
            labels.append(_timed(target, sample)[0]["label"])

    try:
        assert len({id(engine) for engine in target.engines}) == 2
        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        pool = target.metrics()["instances_pool"]
    finally:
        target.close()
    assert len(labels) == len(SAMPLES)
    assert pool["instances"] == 2 and pool["requests"] == len(SAMPLES)
    assert all(n > 0 for n in pool["requests_per_instance"])  # both engines served


def test_cache_hits_repeated_payloads_and_counts_them() -> None:
    target = _build(cache={"mode": "lru", "max_entries": 4})
    try:
        first, cold = _timed(target, SAMPLES[0])
        second, warm = _timed(target, SAMPLES[0])
        metrics = target.metrics()["cache"]
        target.reset_metrics()
        assert target.metrics()["cache"]["hits"] == 0
    finally:
        target.close()
    assert first == second
    assert "infer" in (cold.stages or {}) and warm.stages is None  # served from the cache
    assert metrics["hits"] == 1 and metrics["misses"] == 1 and metrics["hit_rate"] == 0.5


@pytest.mark.parametrize("preprocess", ["numpy", "numpy-pooled"])
def test_accuracy_is_measured_through_the_configured_pipeline(preprocess: str) -> None:
    # numpy-pooled returns one reused buffer per thread: the accuracy check must copy each
    # image before preprocessing the next (it once stacked 32 copies of the last: 13% top-1).
    target = _build(preprocess=preprocess)
    try:
        report = target.accuracy()
    finally:
        target.close()
    assert report["n"] >= 350 and report["top1"] >= 0.95
    assert report["agreement"] >= 0.99  # numpy preprocess + torch fp32: the reference itself
    assert abs(report["drop_pts"]) <= 1.0


def test_tensorrt_and_bad_requests_are_clear_errors() -> None:
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        with pytest.raises(OptlabError, match="tensorrt"):
            _build(engine="tensorrt")
    target = _build()
    try:
        with pytest.raises(TypeError, match="JPEG bytes"):
            target("not an image")
        with pytest.raises(OptlabError):
            target(b"not a jpeg")
    finally:
        target.close()


def test_inputs_follow_the_workload() -> None:
    class Workload:
        seed = 3
        inputs = {"count": 40, "size": [64, 128], "repeat_skew": 1.5, "split": "holdout"}

    pool = pipeline.inputs(Workload())
    assert len(pool) == 40
    assert len({id(s) for s in pool}) < 40  # Zipf: popular samples recur, as the same object
    from PIL import Image

    sides = set()
    for sample in pool:
        with Image.open(__import__("io").BytesIO(sample.jpeg)) as image:
            sides.add(image.size[0])
    assert min(sides) >= 64 and max(sides) <= 128 and len(sides) > 1


def test_run_stores_accuracy_batch_sizes_and_the_stage_breakdown(
    tmp_path: Path, invoke: Invoke, sqlite_url: str
) -> None:
    folder = tmp_path / "ic"
    folder.mkdir()
    write(folder, "base.yaml", BATCHED)
    # Validity is not asserted: a 1 s run on a busy shared machine may be too short for it.
    result = invoke("run", str(folder / "base.yaml"), *QUICK, "--json")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "FINISHED", result.output
    assert {"preprocess", "queue", "infer", "postprocess"} <= set(summary["latency_ms"])
    assert summary["accuracy"]["top1"] >= 0.95
    batching = summary["target"]["batching"]
    assert batching["batches"] > 0 and batching["mean_batch_size"] > 1
    assert sum(int(n) for n in batching["batch_sizes"].values()) == batching["batches"]
    assert summary["target"]["engine"]["providers"]  # what the engine really used
    assert "accuracy: held-out top-1" in result.stderr and "batching:" in result.stderr
    stored = Store.open(sqlite_url).list_runs("ic-batched")[-1]
    assert stored.summary is not None and stored.summary.accuracy is not None
    assert stored.summary.accuracy["n"] >= 350


ACCURATE_TARGET = """\
class Service:
    def __call__(self, request):
        return request

    def accuracy(self):
        return {"top1": 0.60, "drop_pts": 38.0, "n": 100}


def build(knobs):
    return Service()
"""


def test_an_accuracy_drop_beyond_the_slo_invalidates_the_run(
    tmp_path: Path, invoke: Invoke
) -> None:
    folder = tmp_path / "lossy"
    folder.mkdir()
    write(folder, "lossy_target.py", ACCURATE_TARGET)
    write(
        folder,
        "base.yaml",
        "name: lossy\ntarget: {kind: python, factory: 'lossy_target:build'}\n"
        "workload: {load: {mode: closed, concurrency: 1}}\nslo: {max_accuracy_drop_pts: 1}\n",
    )
    result = invoke("run", str(folder / "base.yaml"), *QUICK, "--json")
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "FINISHED" and summary["valid"] is False
    assert any("38.00 points below the fp32 reference" in r for r in summary["reasons"])
    assert summary["accuracy"]["top1"] == 0.60
