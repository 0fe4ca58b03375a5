"""Hostile and odd inputs through the real CLI: each is refused quickly, naming the file, the
line where known, the field and the fix; nothing is half-written and nothing runs away."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import Result

from tests.support.files import write
from tests.support.proc import run_optlab

Invoke = Callable[..., Result]

PYTHON_BASELINE = """\
name: base
target: {kind: python, factory: "mytarget:build"}
knobs:
  lr.decay: 0.5
  lr.warmup: 10
  threads: 1
workload:
  load: {mode: closed, concurrency: 2}
"""


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a python-target baseline (free-form knobs), the working dir."""
    here = tmp_path / "exp"
    here.mkdir()
    write(here, "mytarget.py", "def build(knobs):\n    return lambda request: request\n")
    write(here, "baseline.yaml", PYTHON_BASELINE)
    monkeypatch.chdir(here)
    return here


@contextmanager
def bounded(seconds: float, megabytes: float) -> Iterator[None]:
    """Fails unless the block uses under `seconds` of this process's CPU and its peak memory
    grows by under `megabytes` (ru_maxrss: a bomb that expands grows it by gigabytes). CPU
    time, not wall time: on a busy machine the wall clock says how busy it is, not how much
    work the block did."""
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    start = time.process_time()
    yield
    used = time.process_time() - start
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - peak_before
    assert used < seconds, f"used {used:.2f} s of CPU"
    assert growth < megabytes, f"peak memory grew {growth:.0f} MiB"


def billion_laughs(levels: int, width: int, name: str | None = None) -> str:
    lines = [f"name: {name}"] if name else []
    lines.append(f"a0: &a0 [{','.join(['lol'] * width)}]")
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------- knob paths are tuples


def test_dotted_knob_names_are_separate_variables(folder: Path, invoke: Invoke) -> None:
    write(
        folder, "both.yaml", "name: both\nparent: base\nchange: {lr.decay: 0.9, lr.warmup: 100}\n"
    )
    both = invoke("diff", "both.yaml")
    assert both.exit_code == 2, both.output
    assert "changes 2 variables" in both.stderr
    assert '"lr.decay": 0.5 -> 0.9' in both.stderr and '"lr.warmup": 10 -> 100' in both.stderr
    assert "(absent) -> (absent)" not in both.stderr

    write(folder, "one.yaml", "name: one\nparent: base\nchange: {lr.decay: 0.9}\n")
    one = invoke("diff", "--json", "one.yaml")
    assert one.exit_code == 0, one.output
    variable = json.loads(one.stdout)["variable"]
    assert variable["name"] == "lr.decay" and (variable["old"], variable["new"]) == (0.5, 0.9)
    assert variable["fields"][0]["keys"] == ["lr.decay"]


def test_split_derives_safe_unique_file_names_from_any_knob_name(
    folder: Path, invoke: Invoke
) -> None:
    long = "k" * 300
    write(
        folder,
        "odd.yaml",
        "name: odd\nparent: base\nnew_knob: true\n"  # every key but lr.decay is a new knob
        f'change:\n  "..": 1\n  "a/b": 2\n  "a.b": 3\n  {long}: 4\n'
        "  lr.decay: 0.7\n",
    )
    (folder / "odd.yaml").chmod(0o640)
    result = invoke("split", "odd.yaml")
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in folder.glob("odd*"))
    assert written == [
        "odd-a-b-2.yaml",
        "odd-a-b.yaml",
        f"odd-{'k' * 40}.yaml",
        "odd-knob.yaml",
        "odd.yaml",
        "odd.yaml.orig",
    ]
    assert {(folder / name).stat().st_mode & 0o777 for name in written} == {0o640}
    assert not list(folder.glob(".optlab-split-*"))
    # Every file of the chain loads and changes its one variable; the last keeps the name.
    head = invoke("diff", "odd.yaml")
    assert head.exit_code == 0, head.output
    assert head.stdout.count(" -> ") >= 6  # base and five steps in the chain line
    assert '"lr.decay": 0.5 -> 0.7' in head.stdout
    for path in folder.glob("odd-*.yaml"):
        step = invoke("diff", path.name)
        assert step.exit_code == 0, step.output
        assert "changes 1 variable" in step.stdout


def test_split_refusal_writes_nothing_and_a_retry_works(folder: Path, invoke: Invoke) -> None:
    two = 'name: two\nparent: base\nnew_knob: true\nchange: {"a/b": 1, threads: 2}\n'
    write(folder, "two.yaml", two)
    # A neighbour already holds the name the split would give the first step.
    write(folder, "taken.yaml", "name: two-a-b\nparent: base\nchange: {threads: 4}\n")
    before = sorted(p.name for p in folder.iterdir())
    refused = invoke("split", "two.yaml")
    assert refused.exit_code == 2
    assert "'two-a-b' already used" in refused.stderr and "nothing was written" in refused.stderr
    assert sorted(p.name for p in folder.iterdir()) == before
    (folder / "taken.yaml").unlink()
    retry = invoke("split", "two.yaml")
    assert retry.exit_code == 0, retry.output
    assert (folder / "two-a-b.yaml").exists() and (folder / "two.yaml.orig").exists()
    assert not list(folder.glob(".optlab-split-*"))


# -------------------------------------------------------------------- YAML that explodes


def test_alias_bombs_are_refused_before_any_expansion(folder: Path, invoke: Invoke) -> None:
    assert invoke("diff", "baseline.yaml").exit_code == 0  # imports and database made here
    # 9 levels of 9: 387 million "lol"s from ~440 bytes; the wider one segfaulted before.
    for name, text in (
        ("bomb.yaml", billion_laughs(9, 9)),
        ("bomb2.yaml", billion_laughs(10, 10, name="bomb2")),
    ):
        write(folder, name, text)
        assert len(text) < 600
        with bounded(seconds=3.0, megabytes=100):
            result = invoke("diff", name)
        assert result.exit_code == 2, result.output
        assert f"{name}:" in result.stderr and "anchor &a0 is not allowed" in result.stderr
        assert result.stderr.count("hint:") == 1
    write(folder, "alias.yaml", "name: x\nknobs: *a\n")
    alias = invoke("diff", "alias.yaml")
    assert alias.exit_code == 2 and "alias.yaml:2: YAML alias *a is not allowed" in alias.stderr


def test_bad_neighbours_cannot_slow_or_break_a_command(folder: Path, invoke: Invoke) -> None:
    write(folder, "bomb.yaml", billion_laughs(9, 9))
    write(folder, "bomb2.yaml", billion_laughs(10, 10, name="bomb2"))
    (folder / "ctl.yaml").write_bytes(b"name: x\0\n")
    # Just under the size limit, its name at the end: a full parse would take seconds.
    rows = "".join(f"k{i}: [1, 2, {{a: b}}]\n" for i in range(45_000))
    write(folder, "big.yaml", rows + "name: big\n")
    assert (folder / "big.yaml").stat().st_size < 1 << 20
    os.mkfifo(folder / "pipe.yaml")
    write(folder, "step.yaml", "name: step\nparent: base\nchange: {threads: 2}\n")
    assert invoke("diff", "baseline.yaml").exit_code == 0  # imports and database made here
    with bounded(seconds=3.0, megabytes=100):
        result = invoke("diff", "step.yaml")
    assert result.exit_code == 0, result.output
    missing = invoke("diff", write(folder, "orphan.yaml", "name: o\nparent: nope\n").name)
    assert missing.exit_code == 2
    assert "unreadable files there: big.yaml, ctl.yaml" in missing.stderr
    chained = invoke("diff", write(folder, "on-bomb.yaml", "name: ob\nparent: bomb2\n").name)
    assert chained.exit_code == 2 and "bomb2.yaml:2: YAML anchor &a0" in chained.stderr


def test_parser_errors_name_the_file_and_line(folder: Path, invoke: Invoke) -> None:
    assert invoke("diff", "baseline.yaml").exit_code == 0  # imports and database made here
    cases = {
        "nul.yaml": (b"name: x\n\0\1\n", "nul.yaml:2: character U+0000 is not allowed"),
        "deep.yaml": (
            b"name: deep\nknobs: " + b"[" * 5000 + b"]" * 5000 + b"\n",
            "deep.yaml:2: nested more than 64 levels deep",
        ),
        "latin1.yaml": (b"name: x\ndescription: caf\xe9\n", "latin1.yaml:2: not UTF-8 text"),
        "digits.yaml": (b"name: x\nknobs: {n: " + b"9" * 5000 + b"}\n", "digits.yaml:2: knobs.n"),
    }
    for name, (data, expected) in cases.items():
        (folder / name).write_bytes(data)
        with bounded(seconds=3.0, megabytes=100):
            result = invoke("diff", name)
        assert result.exit_code == 2, (name, result.output)
        assert expected in result.stderr, result.stderr
        assert "unexpected error" not in result.stderr


def test_non_finite_numbers_are_refused_anywhere(folder: Path, invoke: Invoke) -> None:
    text = PYTHON_BASELINE.replace("concurrency: 2}", "concurrency: 2}\nslo: {p99_ms: .inf}")
    write(folder, "inf.yaml", text)
    inf = invoke("diff", "inf.yaml")
    assert inf.exit_code == 2 and "inf.yaml:9: slo.p99_ms: '.inf' is not a finite number" in (
        inf.stderr
    )
    write(folder, "nan.yaml", "name: n\nparent: base\nchange: {threads: .NaN}\n")
    nan = invoke("diff", "nan.yaml")
    assert nan.exit_code == 2 and "nan.yaml:3: change.threads: '.NaN' is not a finite" in (
        nan.stderr
    )


# -------------------------------------------------------------------- what the file is


def test_files_that_are_not_regular_or_too_large(folder: Path, invoke: Invoke) -> None:
    (folder / "zero.yaml").symlink_to("/dev/zero")
    zero = invoke("diff", "zero.yaml")
    assert zero.exit_code == 2 and "zero.yaml: is a character device" in zero.stderr
    (folder / "loop1.yaml").symlink_to("loop2.yaml")
    (folder / "loop2.yaml").symlink_to("loop1.yaml")
    loop = invoke("diff", "loop1.yaml")
    assert loop.exit_code == 2 and "loop1.yaml: symlink loop" in loop.stderr
    (folder / "dangling.yaml").symlink_to("gone.yaml")
    dangling = invoke("diff", "dangling.yaml")
    assert "dangling.yaml: a symlink to gone.yaml, which does not exist" in dangling.stderr
    (folder / "huge.yaml").write_bytes(b"name: x\n" + b"#" * (2 << 20))
    huge = invoke("diff", "huge.yaml")
    assert huge.exit_code == 2 and "over the 1,048,576-byte limit" in huge.stderr
    (folder / "link.yaml").symlink_to("baseline.yaml")
    assert invoke("diff", "link.yaml").exit_code == 0


def test_a_fifo_is_refused_not_waited_on(folder: Path, sqlite_url: str) -> None:
    # A subprocess, so that a regression blocks it (killed by the timeout), not the test run.
    os.mkfifo(folder / "fifo.yaml")
    done = run_optlab("diff", "fifo.yaml", db=sqlite_url, cwd=folder, timeout=30)
    assert done.returncode == 2
    assert "fifo.yaml: is a FIFO (named pipe), not an experiment file" in done.stderr


# -------------------------------------------------------------------- messages


def test_parent_null_is_refused_with_the_fix(folder: Path, invoke: Invoke) -> None:
    write(folder, "null.yaml", "name: x\nparent: null\nchange: {threads: 2}\n")
    result = invoke("diff", "null.yaml")
    assert result.exit_code == 2
    assert "null.yaml:2: parent: null names no parent experiment" in result.stderr
    assert "remove the `parent` key for a baseline" in result.stderr


def test_name_and_reference_rules_are_said_in_words(folder: Path, invoke: Invoke) -> None:
    text = PYTHON_BASELINE.replace("name: base", 'name: "my exp!"').replace(
        "mytarget:build", "my-target:build"
    )
    write(folder, "names.yaml", text)
    result = invoke("diff", "names.yaml")
    assert result.exit_code == 2
    assert "names.yaml:1: name: 'my exp!' is not a valid experiment name" in result.stderr
    assert "letters, digits, '-', '_' and '.', starting with a letter or digit" in result.stderr
    assert "e.g. fp16-batch8" in result.stderr and "e.g. my_model.serving:build" in result.stderr
    assert "pattern" not in result.stderr and "[A-Za-z" not in result.stderr


# -------------------------------------------------------------------- loads the machine can start


def _with_load(folder: Path, name: str, target: str, load: str) -> str:
    write(
        folder,
        f"{name}.yaml",
        f"name: {name}\ntarget: {target}\nworkload:\n  load: {load}\n",
    )
    return f"{name}.yaml"


PY = '{kind: python, factory: "mytarget:build"}'
HTTP = '{kind: http, url: "http://127.0.0.1:9/x"}'


def test_threads_and_rates_beyond_the_machine_are_refused_at_load(
    folder: Path, invoke: Invoke
) -> None:
    threads = invoke(
        "diff", _with_load(folder, "t", PY, "{mode: open, rate: 100, max_in_flight: 100000}")
    )
    assert threads.exit_code == 2
    assert "t.yaml:4: workload.load.max_in_flight: 100000 is more threads" in threads.stderr
    assert "allows 1.." in threads.stderr and "coroutines instead of threads" in threads.stderr

    rate = invoke("diff", _with_load(folder, "r", PY, "{mode: open, rate: 1000000}"))
    assert rate.exit_code == 2
    assert "r.yaml:4: workload.load.rate: 1,000,000 requests/s" in rate.stderr
    assert "up to 100,000" in rate.stderr and "wrk2" in rate.stderr

    http_rate = invoke("diff", _with_load(folder, "hr", HTTP, "{mode: open, rate: 1000000}"))
    assert http_rate.exit_code == 2
    assert "set workload.load.processes to 10 or more" in http_rate.stderr

    ok = invoke("diff", _with_load(folder, "ok", PY, "{mode: open, rate: 5000}"))
    assert ok.exit_code == 0, ok.output


def test_connections_beyond_the_open_file_limit_are_refused(folder: Path, invoke: Invoke) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    name = _with_load(folder, "c", HTTP, "{mode: open, rate: 100, max_in_flight: 5000}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (1000, hard))
    try:
        result = invoke("diff", name)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert result.exit_code == 2
    assert "c.yaml:4: workload.load.max_in_flight: 5000 requests in flight" in result.stderr
    assert "ulimit -n = 1000" in result.stderr and "allows 1..744" in result.stderr
