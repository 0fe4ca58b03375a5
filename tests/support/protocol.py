"""The two run lengths the suite uses, defined once.

`QUICK` is for plumbing: a run whose figures no test compares (it must start, measure, store
and exit). `COMPARED` is for a run whose step is judged: 3 s give 3 per-second windows, the
fewest the statistics judge a step from (README, "Is a step real?"). `--allow-invalid` and
`--json` stay explicit at the call sites that need them; any other length is a named constant
beside the test that needs it, with its reason.
"""

from __future__ import annotations

from optlab.run.measurement import RunOptions

QUICK_DURATION_S, QUICK_WARMUP_S = 1.0, 0.2
COMPARED_DURATION_S, COMPARED_WARMUP_S = 3.0, 0.3

QUICK = ("--quick", "--duration", f"{QUICK_DURATION_S:g}", "--warmup", f"{QUICK_WARMUP_S:g}")
COMPARED = (
    "--quick",
    "--duration",
    f"{COMPARED_DURATION_S:g}",
    "--warmup",
    f"{COMPARED_WARMUP_S:g}",
)

QUICK_OPTIONS = RunOptions(quick=True, duration_s=QUICK_DURATION_S, warmup_s=QUICK_WARMUP_S)
COMPARED_OPTIONS = RunOptions(
    quick=True, duration_s=COMPARED_DURATION_S, warmup_s=COMPARED_WARMUP_S
)
