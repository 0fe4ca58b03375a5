"""GPU readings from NVML, and the names of the reasons NVML gives for lowered clocks.

pynvml is imported only when a sampler opens it. When NVML cannot be initialised (no driver, no
GPU) there is no reader, and every GPU field of a reading is None: a missing reading is never
replaced by a made-up one.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["THERMAL_REASONS", "GpuReading", "NvmlDevices", "decode_throttle_reasons"]

# Reasons that mean the clocks were lowered because of heat; any of them invalidates a run.
THERMAL_REASONS = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown"})

# NVML renamed "ClocksThrottleReason" to "ClocksEventReason" (driver 535 era); accept both.
_REASON_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")
_NOT_A_REASON = {"All", "None"}


@dataclass(frozen=True)
class GpuReading:
    index: int
    util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    throttle_reasons: list[str] | None  # active reasons, e.g. ["hw_thermal_slowdown"]


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _reason_table(nvml: ModuleType) -> list[tuple[int, str]]:
    table: dict[int, str] = {}
    for prefix in _REASON_PREFIXES:
        for attr in dir(nvml):
            if not attr.startswith(prefix):
                continue
            suffix = attr[len(prefix) :]
            value = getattr(nvml, attr)
            if suffix in _NOT_A_REASON or not isinstance(value, int) or value <= 0:
                continue
            # Only single-bit constants are reasons; composite masks would double-report.
            if value & (value - 1) == 0:
                table.setdefault(value, _snake(suffix))
    return sorted(table.items())


def decode_throttle_reasons(mask: int, nvml: ModuleType | None = None) -> list[str]:
    """Names of the reasons set in an NVML clocks-event bitmask, using pynvml's constants."""
    if nvml is None:
        import pynvml

        nvml = pynvml
    table = _reason_table(nvml)
    names = [name for bit, name in table if mask & bit]
    known = 0
    for bit, _ in table:
        known |= bit
    if mask & ~known:
        names.append(f"unknown_0x{mask & ~known:x}")
    return names


class NvmlDevices:
    """The NVML handles of one sampler; every query degrades to None on its own."""

    def __init__(self, nvml: ModuleType, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles

    @classmethod
    def open(cls) -> NvmlDevices | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception:  # NVMLError, or OSError when the library itself is missing
            return None
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:
            _shutdown(pynvml)
            return None
        if not handles:
            _shutdown(pynvml)
            return None
        return cls(pynvml, handles)

    def close(self) -> None:
        _shutdown(self.nvml)

    def read(self) -> list[GpuReading]:
        return [self._read_one(i, h) for i, h in enumerate(self.handles)]

    def _query(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception:  # not supported on this GPU / transient: report the field as missing
            return None

    def _read_one(self, index: int, handle: Any) -> GpuReading:
        nvml = self.nvml
        util = self._query("nvmlDeviceGetUtilizationRates", handle)
        memory = self._query("nvmlDeviceGetMemoryInfo", handle)
        temperature = self._query("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._query("nvmlDeviceGetPowerUsage", handle)
        clock = self._query("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)
        mask = None
        for fn in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if hasattr(nvml, fn):
                mask = self._query(fn, handle)
                if mask is not None:
                    break
        return GpuReading(
            index=index,
            util_pct=None if util is None else float(util.gpu),
            mem_used_bytes=None if memory is None else int(memory.used),
            mem_total_bytes=None if memory is None else int(memory.total),
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else float(power_mw) / 1000.0,
            sm_clock_mhz=None if clock is None else float(clock),
            throttle_reasons=None if mask is None else decode_throttle_reasons(int(mask), nvml),
        )


def _shutdown(nvml: ModuleType) -> None:
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()
