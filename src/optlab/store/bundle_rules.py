"""What a run bundle may hold, field by field: a bundle is checked as if its run were measured
here, under the rules the experiment files and the runner keep.

Names follow the experiment-file rules (`config.models.NAME_PATTERN`); every config is
re-validated by this optlab's schema and its hash recomputed, and each step's config must be
its parent's with only the knobs changed, resolved against the config before it in the
bundle; numbers are finite and within bounds a real run stays far inside (a SQLite or
PostgreSQL integer is 64 bits); phases, statuses and kinds are the known ones; texts are
bounded. What must agree with the histograms is checked above the store, where histograms are
read (`run.imported`). Each rule raises ValueError naming the field; `store.bundle` adds the
run and the bundle file its line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from optlab.config.canonical import canonical_json
from optlab.config.loading import config_hash, parse_stored
from optlab.config.models import NAME_PATTERN
from optlab.errors import ConfigError
from optlab.store.reasons import REASON_CODES
from optlab.store.records import LLM_WINDOW_FIELDS

PHASES = ("warmup", "measure")
MAX_INT = (1 << 63) - 1  # what a 64-bit integer column holds
MAX_COUNT = 10**12  # requests in one run: a day at ten million per second
MAX_SECONDS = 10**7  # a phase length or an offset: 115 days
MAX_RATE = 1e9  # requests/s
MAX_MS = 3.6e6 * 24  # a latency: a day (histograms stop at one hour)
MAX_PCT = 1e6  # a CPU share: of one core, on 10,000 cores
MAX_TEXT = 1 << 20  # the experiment file's own limit
MAX_LINE_TEXT = 64 * 1024  # one message, reason, or example
MAX_SHORT = 1024  # a host, a stage, an error type, a hash
MAX_DEPTH = 100  # objects and lists inside each other
MAX_ITEMS = 100_000  # list lengths inside one run (windows of a day are 86,400)
_NAME = re.compile(NAME_PATTERN)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class Malformed(ValueError):
    """A field that breaks a rule; the message names it."""


class NonFinite:
    """What the bundle reader makes of NaN, Infinity and -Infinity (`json.loads`'s
    `parse_constant`): kept apart until `check_json_values` names the field that held it."""

    def __init__(self, spelling: str) -> None:
        self.spelling = spelling


def check_json_values(value: Any, where: str = "", depth: int = 0) -> None:
    """Every number in a parsed line is finite (NaN reached `log --json` as non-JSON), every
    integer fits a 64-bit column (a larger one crashed the store), and nothing is nested more
    than MAX_DEPTH deep (real bundles nest under ten; deeper ones exhaust the stack of every
    reader after this one)."""
    if depth > MAX_DEPTH:
        raise Malformed(f"{where[:60]}...: nested more than {MAX_DEPTH} levels deep")
    if isinstance(value, NonFinite):
        raise Malformed(
            f"{where or 'the line'}: {value.spelling} is not a finite number (JSON has no NaN "
            "or infinities)"
        )
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -MAX_INT <= value <= MAX_INT:
            raise Malformed(f"{where}: {value:.3g} is beyond a 64-bit integer")
    elif isinstance(value, dict):
        for key, item in value.items():
            check_json_values(item, f"{where}.{key}" if where else str(key), depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_json_values(item, f"{where}[{index}]", depth + 1)


def name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        shown = value if not isinstance(value, str) or len(value) <= 60 else value[:60] + "..."
        raise Malformed(
            f"{where} {shown!r} is not an experiment name (1 to 100 letters, digits, '.', '_' "
            "or '-', starting with a letter or digit: the rule experiment files keep)"
        )
    return value


def text(value: Any, where: str, limit: int, *, optional: bool = True, line: bool = True) -> None:
    if value is None and optional:
        return
    if not isinstance(value, str):
        raise Malformed(f"{where} is {type(value).__name__}, not text")
    if len(value) > limit:
        raise Malformed(f"{where} is {len(value):,} characters, over the limit of {limit:,}")
    if "\x00" in value or (line and _CONTROL.search(value)):
        raise Malformed(f"{where} holds control characters")


def integer(value: Any, where: str, high: int, *, optional: bool = True, low: int = 0) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise Malformed(f"{where} is {type(value).__name__}, not an integer")
    if not low <= value <= high:
        raise Malformed(f"{where} is {value:.6g}, outside {low}..{high:.6g}")


def number(value: Any, where: str, high: float, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Malformed(f"{where} is {type(value).__name__}, not a number")
    if not math.isfinite(value) or not 0 <= value <= high:
        raise Malformed(f"{where} is {value!r}, outside 0..{high:g}")


def one_of(value: Any, where: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        shown = value if not isinstance(value, str) or len(value) <= 60 else value[:60] + "..."
        raise Malformed(f"{where} {shown!r} is not one of {', '.join(allowed)}")


def items(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Malformed(f"{where} is {type(value).__name__}, not a list")
    if len(value) > MAX_ITEMS:
        raise Malformed(f"{where} has {len(value):,} items, over the limit of {MAX_ITEMS:,}")
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise Malformed(f"{where}[{index}] is {type(item).__name__}, not an object")
    return value


# -- the chain ------------------------------------------------------------------------------


def _without_knobs(config: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in config.items() if key != "knobs"}


def check_experiments(experiments: Sequence[dict[str, Any]]) -> None:
    """Names, texts and configs of a bundle's chain (its shape is `store.bundle`'s check)."""
    before: dict[str, Any] | None = None
    for index, item in enumerate(experiments):
        where = f"experiments[{index}]"
        label = f"{where} ({item.get('name')!r})" if isinstance(item.get("name"), str) else where
        name(item.get("name"), f"{where}.name")
        for key in ("description", "hypothesis"):
            text(item.get(key), f"{label}.{key}", MAX_TEXT, line=False)
        for key in ("variable", "source_path", "source_hash"):
            text(item.get(key), f"{label}.{key}", MAX_SHORT * 4)
        config = item["config"]
        try:
            parse_stored(config, str(item["name"]))
        except ConfigError as exc:
            raise Malformed(f"{label}.config does not fit this optlab: {exc.message}") from exc
        recomputed = _hash(config, label)
        if item["config_hash"] != recomputed:
            raise Malformed(
                f"{label}.config_hash {str(item['config_hash'])[:16]!r}... is not the hash of "
                f"its config ({recomputed[:16]}...): the config was changed after it was "
                "measured"
            )
        parent_hash = item.get("parent_config_hash")
        if before is None:
            if parent_hash is not None or item.get("change") is not None:
                raise Malformed(f"{label}: a baseline has no parent_config_hash and no change")
        else:
            if parent_hash != before["config_hash"]:
                raise Malformed(
                    f"{label}.parent_config_hash {str(parent_hash)[:16]!r} is not the config "
                    f"hash of its parent in the bundle ({before['config_hash'][:16]})"
                )
            if not isinstance(item.get("change"), dict):
                raise Malformed(f"{label}.change is not an object (a step's knob changes)")
            if _without_knobs(config) != _without_knobs(before["config"]):
                raise Malformed(
                    f"{label}.config differs from its parent's beyond the knobs (a step "
                    "changes only knobs)"
                )
        before = item


def _hash(config: dict[str, Any], label: str) -> str:
    try:
        return config_hash(config)
    except (TypeError, ValueError) as exc:
        raise Malformed(f"{label}.config cannot be hashed: {exc}") from exc


def check_environment(environment: Mapping[str, Any] | None, fingerprint_hash: str) -> None:
    if environment is None:
        return
    text(environment.get("material_hash"), "environment.material_hash", MAX_SHORT)
    given = environment.get("fingerprint_hash")
    if given is not None and given != fingerprint_hash:
        raise Malformed(
            f"environment.fingerprint_hash {str(given)[:16]!r} is not the hash of its "
            f"fingerprint ({fingerprint_hash[:16]}): the fingerprint was changed"
        )


def fingerprint_hash(fingerprint: Mapping[str, Any]) -> str:
    """The hash `Store.record_environment` keys an environment by."""
    import hashlib

    return hashlib.sha256(canonical_json(fingerprint).encode()).hexdigest()


# -- the run and its measurements -----------------------------------------------------------


def check_run(run: Mapping[str, Any]) -> None:
    """The run's own fields (types and presence are `store.bundle`'s check)."""
    name(run["experiment"], "run.experiment")
    if not _HEX64.match(run["config_hash"]):
        raise Malformed(f"run.config_hash {run['config_hash'][:70]!r} is not 64 hex digits")
    text(run["protocol_name"], "run.protocol_name", MAX_SHORT, optional=False)
    text(run["hostname"], "run.hostname", MAX_SHORT, optional=False)
    text(run.get("git_commit"), "run.git_commit", MAX_SHORT)
    text(run.get("error_message"), "run.error_message", MAX_LINE_TEXT, line=False)
    integer(run["pid"], "run.pid", (1 << 31) - 1, optional=False)
    for key in ("requests", "errors"):
        integer(run.get(key), f"run.{key}", MAX_COUNT)
    number(run.get("qps"), "run.qps", MAX_RATE)
    for key in ("warmup_s", "duration_s"):
        number(run.get(key), f"run.{key}", MAX_SECONDS)
    for key in ("valid", "git_dirty"):
        if run.get(key) is not None and not isinstance(run[key], bool):
            raise Malformed(f"run.{key} is {type(run[key]).__name__}, not true, false or null")
    reasons = run["reasons"]
    if len(reasons) > 1000:
        raise Malformed(f"run.reasons has {len(reasons):,} items, over the limit of 1,000")
    for index, reason in enumerate(reasons):
        text(reason, f"run.reasons[{index}]", MAX_LINE_TEXT, optional=False, line=False)
    codes = run.get("reason_codes")  # optional: bundles written before the codes lack it
    if codes is not None:
        if not isinstance(codes, list) or len(codes) != len(reasons):
            raise Malformed("run.reason_codes is not a list with one code per reason")
        for index, code in enumerate(codes):
            one_of(code, f"run.reason_codes[{index}]", REASON_CODES)


_STAGE_FLOATS = (
    "min_ms",
    "mean_ms",
    "stddev_ms",
    "p50_ms",
    "p90_ms",
    "p95_ms",
    "p99_ms",
    "p999_ms",
    "max_ms",
)


def check_stage_stats(rows: list[Any]) -> None:
    seen = set()
    for index, row in enumerate(items(rows, "stage_stats")):
        where = f"stage_stats[{index}]"
        text(row.get("stage"), f"{where}.stage", MAX_SHORT, optional=False)
        one_of(row.get("phase"), f"{where}.phase", PHASES)
        key = (row.get("stage"), row.get("phase"))
        if key in seen:
            raise Malformed(f"{where}: stage {key[0]!r} of the {key[1]} phase appears twice")
        seen.add(key)
        integer(row.get("count"), f"{where}.count", MAX_COUNT, optional=False)
        text(row.get("histogram"), f"{where}.histogram", 8 << 20, optional=False)
        for field in _STAGE_FLOATS:
            number(row.get(field), f"{where}.{field}", MAX_MS)


def check_windows(rows: list[Any]) -> None:
    seen = set()
    for index, row in enumerate(items(rows, "windows")):
        where = f"windows[{index}]"
        one_of(row.get("phase"), f"{where}.phase", PHASES)
        integer(row.get("t_s"), f"{where}.t_s", MAX_SECONDS, optional=False)
        if (row["phase"], row["t_s"]) in seen:
            raise Malformed(f"{where}: second {row['t_s']} of the {row['phase']} phase twice")
        seen.add((row["phase"], row["t_s"]))
        for field in ("completed", "errors"):
            integer(row.get(field), f"{where}.{field}", MAX_COUNT, optional=False)
        for field in ("offered", "in_flight"):
            integer(row.get(field), f"{where}.{field}", MAX_COUNT)
        number(row.get("qps"), f"{where}.qps", MAX_RATE, optional=False)
        for field in ("p50_ms", "p99_ms", "send_lag_p99_ms", *LLM_WINDOW_FIELDS):
            number(
                row.get(field), f"{where}.{field}", MAX_RATE if field == "output_tps" else MAX_MS
            )


_SAMPLE_PCTS = (
    "cpu_process_pct",
    "cpu_system_pct",
    "iowait_pct",
    "service_cpu_pct",
    "steal_pct",
    "other_cpu_pct",
)
_SAMPLE_BYTES = ("rss_bytes", "mem_used_bytes", "mem_total_bytes", "service_rss_bytes")
_GPU_FLOATS = ("util_pct", "temperature_c", "power_w", "sm_clock_mhz")


def check_samples(rows: list[Any]) -> None:
    for index, row in enumerate(items(rows, "samples")):
        where = f"samples[{index}]"
        one_of(row.get("phase"), f"{where}.phase", PHASES)
        number(row.get("t_s"), f"{where}.t_s", MAX_SECONDS, optional=False)
        for field in _SAMPLE_PCTS:
            number(row.get(field), f"{where}.{field}", MAX_PCT)
        for field in _SAMPLE_BYTES:
            integer(row.get(field), f"{where}.{field}", MAX_INT)
        cores = row.get("cpu_per_core")
        if cores is not None:
            if not isinstance(cores, list) or len(cores) > 65536:
                raise Malformed(f"{where}.cpu_per_core is not a list of at most 65,536 numbers")
            for core, value in enumerate(cores):
                number(value, f"{where}.cpu_per_core[{core}]", MAX_PCT, optional=False)
        for gpu_index, gpu in enumerate(items(row.get("gpus"), f"{where}.gpus")):
            at = f"{where}.gpus[{gpu_index}]"
            integer(gpu.get("index"), f"{at}.index", 4096, optional=False)
            for field in _GPU_FLOATS:
                number(gpu.get(field), f"{at}.{field}", MAX_PCT)
            for field in ("mem_used_bytes", "mem_total_bytes"):
                integer(gpu.get(field), f"{at}.{field}", MAX_INT)
            reasons = gpu.get("throttle_reasons")
            if reasons is not None:
                if not isinstance(reasons, list) or len(reasons) > 64:
                    raise Malformed(f"{at}.throttle_reasons is not a list of at most 64 names")
                for reason in reasons:
                    text(reason, f"{at}.throttle_reasons[]", MAX_SHORT, optional=False)


def check_errors(rows: list[Any]) -> None:
    seen = set()
    for index, row in enumerate(items(rows, "errors")):
        where = f"errors[{index}]"
        text(row.get("error_type"), f"{where}.error_type", MAX_SHORT, optional=False)
        if row["error_type"] in seen:
            raise Malformed(f"{where}: error type {row['error_type']!r} appears twice")
        seen.add(row["error_type"])
        integer(row.get("count"), f"{where}.count", MAX_COUNT, optional=False)
        text(row.get("example"), f"{where}.example", MAX_LINE_TEXT, line=False)
