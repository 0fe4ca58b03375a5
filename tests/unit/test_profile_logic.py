"""py-spy's raw output parsed (optlab.metrics.profile): a recorded fixture of real output
(tests/fixtures/profile), threads without names and junk lines, an empty profile, and the
profile as the run summary's evidence (no py-spy is started)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from optlab.metrics.profile import Profile, parse_profile, parse_raw
from optlab.store.summary import ProfileEvidence

FIXTURES = Path(__file__).parents[1] / "fixtures" / "profile"


def test_parse_fixture_of_real_py_spy_output() -> None:
    """Three py-spy 0.4.3 samplers at 50 Hz for 2 s on the BURNER shape (tests/fixtures)."""
    texts = {mode: (FIXTURES / f"{mode}.txt").read_text() for mode in ("all", "active", "gil")}
    profile = parse_profile(texts["all"], texts["active"], texts["gil"], pid=24047)
    assert profile.pid == 24047 and profile.tool == "py-spy"
    assert profile.samples == 98  # the thread sampled most often: 63 + 35
    assert profile.gil_pct == round(100 * 94 / 98, 1)
    assert profile.idle_pct == round(100 * (1 - 74 / 196), 1)
    assert [(f.thread, f.frame, f.share_pct) for f in profile.frames] == [
        ("MainThread (24047)", "burn_the_cpu (burn.py:6)", 64.3),
        ("MainThread (24047)", "burn_the_cpu (burn.py:5)", 35.7),
        ("sleepy (24049)", "sleeper (burn.py:9)", 100.0),
    ]


def test_parse_raw_threads_without_names_and_junk() -> None:
    text = (
        "thread (7);<module> (a.py:3);f (a.py:1) 3\n"
        "thread (7);<module> (a.py:3);g (a.py:2) 1\n"
        "thread (8): worker 2\n"
        "not a sample line\n"
        "\n"
    )
    assert parse_raw(text) == {
        "7": {"f (a.py:1)": 3, "g (a.py:2)": 1},
        "worker (8)": {"(no Python frame)": 2},
    }
    profile = parse_profile(text, max_frames=1)
    assert profile.samples == 4 and profile.gil_pct is None and profile.idle_pct is None
    assert [(f.thread, f.frame, f.share_pct) for f in profile.frames] == [
        ("7", "f (a.py:1)", 75.0),
        ("worker (8)", "(no Python frame)", 100.0),
    ]


def test_nothing_sampled_is_an_empty_profile() -> None:
    assert parse_profile("", "", "", pid=5) == Profile(pid=5)


def test_profile_is_the_summary_evidence() -> None:
    """The run turns a Profile into ProfileEvidence field for field (module docstring)."""
    assert {f.name for f in dataclasses.fields(Profile)} == set(ProfileEvidence.model_fields)
    texts = [(FIXTURES / f"{mode}.txt").read_text() for mode in ("all", "active", "gil")]
    profile = parse_profile(*texts, pid=1)
    evidence = ProfileEvidence.model_validate(dataclasses.asdict(profile))
    assert evidence.samples == profile.samples and evidence.gil_pct == profile.gil_pct
    assert [(f.thread, f.frame, f.share_pct) for f in evidence.frames] == [
        (f.thread, f.frame, f.share_pct) for f in profile.frames
    ]
