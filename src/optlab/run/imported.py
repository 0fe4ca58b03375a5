"""An imported run's figures re-derived from its histograms, as if it were measured here.

`optlab import` (and the storing of a pending run) trusts no figure a bundle states: every
stage row must be what its encoded histogram gives; the run's requests are the count of its
measured "total" histogram, its QPS those requests over its measured seconds, its errors the sum
of its error rows; its summary must state the same; and its per-second windows can hold no more
than those totals, each full second's QPS being its count. A bundle edited after `optlab export`
wrote it (a QPS times ten, a percentile halved) is refused, naming the run and the field, and
nothing is stored. The rules on names, numbers and hashes are `store.bundle_rules`'.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
import zlib
from collections.abc import Sequence
from functools import lru_cache

from optlab.chain.plan import group_by_variable
from optlab.env.compare import material_hash
from optlab.errors import StoreError
from optlab.metrics.histogram import (
    HIGHEST_NS,
    LOWEST_NS,
    SIGNIFICANT_DIGITS,
    LatencyHistogram,
)
from optlab.store.bundle import RunBundle
from optlab.store.records import StageStatsRow, WindowStats

# The figures each stage row states, by the key `LatencyHistogram.summary_ms` gives them.
_ROW_FIGURES = (
    ("min_ms", "min"),
    ("mean_ms", "mean"),
    ("stddev_ms", "stddev"),
    ("p50_ms", "p50"),
    ("p90_ms", "p90"),
    ("p95_ms", "p95"),
    ("p99_ms", "p99"),
    ("p999_ms", "p999"),
    ("max_ms", "max"),
)
# A summary's latency series and the stage row fields they are taken from.
_SERIES_FIGURES = (
    ("p50", "p50_ms"),
    ("p95", "p95_ms"),
    ("p99", "p99_ms"),
    ("p999", "p999_ms"),
    ("max", "max_ms"),
    ("mean", "mean_ms"),
)
# HdrHistogram V2: the base64 blob's header, then the zlib payload's header, then the counts.
_BLOB_HEADER = struct.Struct(">II")  # cookie, length
_PAYLOAD_HEADER = struct.Struct(">IIIIQQd")  # cookie, length, offset, digits, lowest, highest
_COMPRESSION_COOKIE = 0x1C849304
_ENCODING_COOKIE = 0x1C849303
_COOKIE_BASE = ~0xF0
_MAX_VARINT_BYTES = 9
# Figures the runner computed from the same histogram agree exactly; JSON keeps a float's
# shortest repr, so only a stated value read back from another spelling differs, in the 15th
# digit.
_REL = 1e-9
_ABS = 1e-9


class Disagrees(ValueError):
    """A figure that its histogram, or another figure, contradicts; the message names it."""


def check_imported(bundle: RunBundle) -> None:
    """Refuse (StoreError) a bundle whose figures its histograms contradict."""
    try:
        _check(bundle)
    except Disagrees as exc:
        where = f"{bundle.origin}: " if bundle.origin else ""
        raise StoreError(
            f"{where}run {bundle.uid} ({bundle.experiment}): {exc}; nothing was imported",
            hint="the bundle was changed after `optlab export` wrote it (or written by "
            "another tool): export the run again from the database that measured it",
        ) from exc


def check_all(bundles: Sequence[RunBundle]) -> None:
    """`check_imported` for each bundle, before any is stored: one bad run refuses them all."""
    for bundle in bundles:
        check_imported(bundle)


def _check_environment(bundle: RunBundle) -> None:
    environment = bundle.environment
    if environment is None:
        return
    recomputed = material_hash(environment["fingerprint"])
    if environment["material_hash"] != recomputed:
        raise Disagrees(
            f"environment.material_hash {str(environment['material_hash'])[:16]!r} is not what "
            f"this optlab makes of its fingerprint ({recomputed[:16]}): edited, or written by an "
            "optlab that judged machines alike by other fields"
        )


def _check_steps(bundle: RunBundle) -> None:
    """Each step changes one variable against its parent, the one its `change` and
    `variable` name (what `optlab diff` stored; the table shows both)."""
    for index in range(1, len(bundle.experiments)):
        parent, step = bundle.experiments[index - 1], bundle.experiments[index]
        where = f"experiments[{index}] ({step['name']!r})"
        names = [
            v.name for v in group_by_variable(parent["config"]["knobs"], step["config"]["knobs"])
        ]
        if len(names) > 1:
            raise Disagrees(
                f"{where}.config changes {len(names)} knobs against its parent "
                f"({', '.join(names)}); a step changes one"
            )
        stated = step.get("variable")
        if names and (names[0] not in step["change"] or stated not in (None, names[0])):
            raise Disagrees(
                f"{where} changes knob {names[0]!r}, but its change names "
                f"{sorted(step['change'])} and its variable is {stated!r}"
            )
        if not names and stated is not None:
            raise Disagrees(f"{where}.variable is {stated!r}, but its config changes no knob")


def _check(bundle: RunBundle) -> None:
    _check_environment(bundle)
    _check_steps(bundle)
    decoded = {(row.phase, row.stage): _check_row(row) for row in bundle.stage_stats}
    run = bundle.run
    total = decoded.get(("measure", "total"))
    requests = run.get("requests")
    if total is not None and requests != total.count:
        raise Disagrees(
            f"run.requests is {requests}, but its measured 'total' histogram holds "
            f"{total.count:,} requests"
        )
    if total is None and requests:
        raise Disagrees(
            f"run.requests is {requests:,}, but it has no measured 'total' histogram to hold them"
        )
    _check_qps(run.get("qps"), requests, run.get("duration_s"))
    _check_errors(bundle)
    _check_summary(bundle)
    for phase in ("warmup", "measure"):
        _check_windows(
            bundle, phase, decoded.get((phase, "total")), decoded.get((phase, "send_lag"))
        )


def _close(first: float | None, second: float | None) -> bool:
    if first is None or second is None:
        return first is second
    return math.isclose(first, second, rel_tol=_REL, abs_tol=_ABS)


@lru_cache(maxsize=1)
def _counts_len() -> int:
    return len(LatencyHistogram().counts)


def decode_histogram(encoded: str, where: str) -> LatencyHistogram:
    """The histogram of a stage row, after checking what decoding it would allocate: the
    settings optlab records with, and a payload no larger than their counts (a small blob
    can inflate to gigabytes)."""
    try:
        blob = base64.b64decode(encoded.encode("ascii"), validate=True)
    except (UnicodeEncodeError, binascii.Error, ValueError) as exc:
        raise Disagrees(f"{where} is not a base64 HdrHistogram") from exc
    if len(blob) < _BLOB_HEADER.size:
        raise Disagrees(f"{where} is too short to be an HdrHistogram")
    cookie, length = _BLOB_HEADER.unpack_from(blob)
    if cookie & _COOKIE_BASE != _COMPRESSION_COOKIE or length != len(blob) - _BLOB_HEADER.size:
        raise Disagrees(f"{where} is not an HdrHistogram (V2, compressed)")
    limit = _PAYLOAD_HEADER.size + _counts_len() * _MAX_VARINT_BYTES
    inflate = zlib.decompressobj()
    try:
        payload = inflate.decompress(blob[_BLOB_HEADER.size :], limit + 1)
    except zlib.error as exc:
        raise Disagrees(f"{where} is a damaged HdrHistogram ({exc})") from exc
    if len(payload) > limit or inflate.unconsumed_tail:
        raise Disagrees(f"{where} inflates beyond any histogram optlab records")
    if len(payload) < _PAYLOAD_HEADER.size:
        raise Disagrees(f"{where} is a truncated HdrHistogram")
    cookie, _, _, digits, lowest, highest, _ = _PAYLOAD_HEADER.unpack_from(payload)
    settings = (digits, lowest, highest)
    if cookie & _COOKIE_BASE != _ENCODING_COOKIE or settings != (
        SIGNIFICANT_DIGITS,
        LOWEST_NS,
        HIGHEST_NS,
    ):
        raise Disagrees(
            f"{where} has settings {settings} (digits, lowest, highest), not optlab's "
            f"{(SIGNIFICANT_DIGITS, LOWEST_NS, HIGHEST_NS)}"
        )
    try:
        return LatencyHistogram.decode(encoded)
    except Exception as exc:  # hdrh raises its own exception types, zlib's and ctypes'
        raise Disagrees(f"{where} is a damaged HdrHistogram ({type(exc).__name__})") from exc


def _check_row(row: StageStatsRow) -> LatencyHistogram:
    where = f"stage_stats {row.stage!r} ({row.phase})"
    histogram = decode_histogram(row.histogram, f"{where}.histogram")
    if histogram.count != row.count:
        raise Disagrees(
            f"{where}.count is {row.count:,}, but its histogram holds {histogram.count:,}"
        )
    derived = histogram.summary_ms()
    for field, key in _ROW_FIGURES:
        stated, expected = getattr(row, field), derived[key]
        if not _close(stated, None if expected is None else float(expected)):
            raise Disagrees(f"{where}.{field} is {stated}, but its histogram gives {expected}")
    return histogram


def _check_qps(qps: float | None, requests: int | None, duration_s: float | None) -> None:
    if requests is None:
        if qps is not None:
            raise Disagrees(f"run.qps is {qps}, but the run states no requests")
        return
    if duration_s is None or duration_s <= 0:
        if qps is not None:
            raise Disagrees(f"run.qps is {qps}, but the run states no measured seconds")
        return
    expected = requests / max(duration_s, 1e-9)
    if qps is None or not math.isclose(qps, expected, rel_tol=1e-6, abs_tol=1e-6):
        raise Disagrees(
            f"run.qps is {qps}, but its {requests:,} requests over run.duration_s "
            f"{duration_s:g} s are {expected:.6g}/s"
        )


def _check_errors(bundle: RunBundle) -> None:
    errors = bundle.run.get("errors")
    counted = sum(row.count for row in bundle.errors)
    if (bundle.errors or errors) and errors != counted:
        raise Disagrees(
            f"run.errors is {errors}, but its error rows (by type) add up to {counted:,}"
        )


def _check_summary(bundle: RunBundle) -> None:
    summary = bundle.summary
    if summary is None:
        return
    run = bundle.run
    for field in ("requests", "errors", "status", "valid"):
        if getattr(summary, field) != run.get(field):
            raise Disagrees(
                f"run.summary.{field} is {getattr(summary, field)!r}, but run.{field} is "
                f"{run.get(field)!r}"
            )
    if not _close(summary.qps, run.get("qps")):
        raise Disagrees(f"run.summary.qps is {summary.qps}, but run.qps is {run.get('qps')}")
    rows = {row.stage: row for row in bundle.stage_stats if row.phase == "measure"}
    for section, series in (("latency_ms", summary.latency_ms), ("harness_ms", summary.harness_ms)):
        for name, stats in series.items():
            where = f"run.summary.{section}.{name}"
            row = rows.get(name)
            if row is None:
                raise Disagrees(f"{where} has no measured histogram (stage_stats row) to hold it")
            if stats.count != row.count:
                raise Disagrees(
                    f"{where}.count is {stats.count}, but its histogram holds {row.count}"
                )
            for key, field in _SERIES_FIGURES:
                if not _close(getattr(stats, key), getattr(row, field)):
                    raise Disagrees(
                        f"{where}.{key} is {getattr(stats, key)}, but its histogram gives "
                        f"{getattr(row, field)}"
                    )
    if bundle.errors:
        counted = {row.error_type: row.count for row in bundle.errors}
        if summary.errors_by_type != counted:
            raise Disagrees(
                f"run.summary.errors_by_type is {summary.errors_by_type}, but its error rows "
                f"say {counted}"
            )


def _check_windows(
    bundle: RunBundle,
    phase: str,
    total: LatencyHistogram | None,
    send_lag: LatencyHistogram | None,
) -> None:
    windows = sorted((w for w in bundle.windows if w.phase == phase), key=lambda w: w.t_s)
    if not windows:
        return
    completed = sum(w.completed for w in windows)
    # Requests finishing after their second was closed are counted in the totals only.
    held = total.count if total is not None else 0
    if completed > held:
        raise Disagrees(
            f"the {phase} windows count {completed:,} completed requests, but the phase's "
            f"'total' histogram holds {held:,}"
        )
    if phase == "measure":
        errors = bundle.run.get("errors") or 0
        if sum(w.errors for w in windows) > errors:
            raise Disagrees(
                f"the measure windows count {sum(w.errors for w in windows):,} errors, but "
                f"run.errors is {errors:,}"
            )
    highest = _highest_ms(total)
    lag_highest = _highest_ms(send_lag)
    for index, window in enumerate(windows):
        _check_window(window, last=index == len(windows) - 1, highest=highest, lag=lag_highest)


def _highest_ms(histogram: LatencyHistogram | None) -> float | None:
    """The most a second's percentile can be: its phase's largest value (None: unbounded, a
    value beyond the histogram's range having been clamped)."""
    if histogram is None or histogram.count == 0:
        return None
    top = histogram.max_ns()
    return None if top is None or top >= HIGHEST_NS else top / 1e6


def _check_window(
    window: WindowStats, *, last: bool, highest: float | None, lag: float | None
) -> None:
    where = f"windows ({window.phase}, second {window.t_s})"
    # Every second but a phase's last is whole, so its QPS is its count; the last may be
    # shorter, so its QPS may only be higher.
    if last:
        wrong = window.qps < window.completed * (1 - 1e-9)
    else:
        wrong = not math.isclose(window.qps, window.completed, rel_tol=1e-9, abs_tol=1e-9)
    if wrong:
        raise Disagrees(
            f"{where}.qps is {window.qps}, but it completed {window.completed:,} requests in "
            f"{'at most ' if last else ''}one second"
        )
    if window.p50_ms is not None and window.p99_ms is not None and window.p50_ms > window.p99_ms:
        raise Disagrees(f"{where}.p50_ms {window.p50_ms} is above its p99_ms {window.p99_ms}")
    for field, top in (("p50_ms", highest), ("p99_ms", highest), ("send_lag_p99_ms", lag)):
        value = getattr(window, field)
        # The histogram's largest value is the top of its bucket: 0.1% above the true one.
        if value is not None and top is not None and value > top * 1.001 + 0.001:
            raise Disagrees(
                f"{where}.{field} is {value}, above the largest value its phase's histogram "
                f"holds ({top:g} ms)"
            )
