"""The resource sampler's pure parts: NVML throttle-reason bits decoded to names, and an
interval refused before any thread starts."""

from __future__ import annotations

import pynvml
import pytest

from optlab.metrics.gpu import THERMAL_REASONS, decode_throttle_reasons
from optlab.metrics.resources import ResourceSampler


def test_decode_throttle_reasons_uses_nvml_bits() -> None:
    thermal = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    idle = pynvml.nvmlClocksThrottleReasonGpuIdle
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(thermal) == ["hw_thermal_slowdown"]
    names = decode_throttle_reasons(thermal | idle | pynvml.nvmlClocksThrottleReasonSwPowerCap)
    assert set(names) == {"hw_thermal_slowdown", "gpu_idle", "sw_power_cap"}
    assert decode_throttle_reasons(1 << 62) == ["unknown_0x4000000000000000"]
    assert set(decode_throttle_reasons(pynvml.nvmlClocksThrottleReasonAll)) >= THERMAL_REASONS


def test_invalid_interval_is_rejected() -> None:
    with pytest.raises(ValueError):
        ResourceSampler(interval_s=0)
