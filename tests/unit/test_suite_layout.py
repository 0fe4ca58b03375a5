"""The suite's own rules (README, "Tests"), read from the test files' source: the lane is the
folder, tests share helpers only through tests/support/, a test skips itself only for a
capability the machine lacks, a timing bound says what it measured, and every test the README
cites exists."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.paths import REPO, TESTS

LANES = ("unit", "integration", "e2e", "ray", "timing")
CAPABILITIES = TESTS / "support" / "capabilities.py"

# Modules that still break a rule because their split was not finished when the rule came in
# (issue 22, point 5), by rule: each one is listed, and a module not listed fails at once.
# Empty each list as the modules are fixed; an empty PENDING is the goal.
PENDING: dict[str, set[str]] = {
    "imports": set(),
    "skips": set(),
    "slow": set(),
    "timing-messages": set(),
}


def _failing(rule: str, offences: list[str]) -> list[str]:
    """The offences ("path:line detail") outside the rule's pending modules."""
    pending = PENDING.get(rule, set())
    return sorted({o for o in offences if o.split(":", 1)[0] not in pending})


def _modules(*folders: str) -> list[Path]:
    found: list[Path] = []
    for folder in folders or ("",):
        found += sorted((TESTS / folder).rglob("*.py"))
    return found


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def _dotted(node: ast.expr) -> str:
    """`pytest.mark.skipif` for that attribute chain; '' for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def _imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def test_every_test_module_is_in_a_lane() -> None:
    top = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not top, f"test modules at the top of tests/, outside every lane: {top}"
    lanes = {p.name for p in TESTS.iterdir() if p.is_dir() and any(p.rglob("test_*.py"))}
    assert lanes <= set(LANES), f"test modules outside the lanes {LANES}: {lanes - set(LANES)}"


def test_no_test_imports_another_test_module() -> None:
    """Helpers live in tests/support/ (and fixtures in a conftest); a test module imported
    by another runs its tests' imports twice and ties two lanes together."""
    offences = []
    for path in _modules():
        for line, module in _imports(_tree(path)):
            if not module.startswith("tests."):
                continue
            allowed = module.startswith(("tests.support", "tests.services"))
            if not allowed:
                offences.append(f"{_name(path)}:{line} imports {module}")
    offences = _failing("imports", offences)
    assert not offences, "\n".join(offences)


SKIPS = {
    "pytest.skip",
    "pytest.importorskip",
    "pytest.mark.skip",
    "pytest.mark.skipif",
    "pytest.xfail",
    "pytest.mark.xfail",
}


def test_only_the_capabilities_helper_skips() -> None:
    """A test skips for a capability the machine lacks (tests/support/capabilities.py), never
    because it is busy; and nothing is expected to fail."""
    offences = []
    for path in _modules():
        if path == CAPABILITIES:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and _dotted(node) in SKIPS:
                offences.append(f"{_name(path)}:{node.lineno} {_dotted(node)}")
    offences = _failing("skips", offences)
    assert not offences, "use tests/support/capabilities.py:\n" + "\n".join(offences)


def test_no_slow_marker() -> None:
    """The lane is the folder: a marker that selects tests is one someone forgets."""
    offences = [
        f"{_name(path)}:{node.lineno}"
        for path in _modules()
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Attribute) and _dotted(node) == "pytest.mark.slow"
    ]
    offences = _failing("slow", offences)
    assert not offences, "pytest.mark.slow in:\n" + "\n".join(offences)


def test_every_timing_assert_prints_what_it_measured() -> None:
    offences = [
        f"{_name(path)}:{node.lineno}"
        for path in _modules("timing")
        for node in ast.walk(_tree(path))
        if isinstance(node, ast.Assert) and node.msg is None
    ]
    offences = _failing("timing-messages", offences)
    assert not offences, "timing asserts without a message (the measured figure):\n" + (
        "\n".join(offences)
    )


# What a unit test may not touch: the real clock, sleeping, processes, a database.
UNIT_FORBIDDEN_CALLS = {
    "time.sleep",
    "time.perf_counter",
    "time.perf_counter_ns",
    "time.monotonic",
    "time.monotonic_ns",
    "time.time",
    "time.thread_time",
    "Store.open",
}
# The store's records and summaries are plain data a unit test builds; the Store is a database.
UNIT_FORBIDDEN_IMPORTS = {"subprocess", "optlab.store.Store"}


def test_unit_tests_are_pure() -> None:
    offences = []
    for path in _modules("unit"):
        tree = _tree(path)
        for line, module in _imports(tree):
            if module in UNIT_FORBIDDEN_IMPORTS:
                offences.append(f"{_name(path)}:{line} imports {module}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _dotted(node.func) in UNIT_FORBIDDEN_CALLS:
                offences.append(f"{_name(path)}:{node.lineno} calls {_dotted(node.func)}")
    offences = _failing("unit-pure", offences)
    assert not offences, "unit tests use no clock, sleep, process or Store:\n" + "\n".join(offences)


CITED = re.compile(r"tests/(?:unit|integration|e2e|timing)/[\w/]*test_\w+\.py(?:::\w+)?")


def _cited() -> list[str]:
    found: set[str] = set()
    for document in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        found |= set(CITED.findall(document.read_text(encoding="utf-8")))
    return sorted(found)


def _defines(tree: ast.Module, name: str) -> bool:
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in ast.walk(tree)
    )


def test_the_readme_cites_tests_that_exist() -> None:
    assert _cited(), "the README cites no test: the pattern is out of date"
    missing = []
    for cited in _cited():
        path, _, name = cited.partition("::")
        module = REPO / path
        if not module.is_file():
            missing.append(f"{cited}: no such file")
        elif name and not _defines(_tree(module), name):
            missing.append(f"{cited}: no such test")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("lane", LANES)
def test_each_lane_is_a_package(lane: str) -> None:
    """Same-named modules in two lanes (test_x_logic.py beside test_x.py) import apart."""
    assert (TESTS / lane / "__init__.py").is_file()
