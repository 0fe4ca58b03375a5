"""`optlab diagnose`: a run's evidence read the way the method's symptom table reads it, the
bottleneck named with the numbers that show it, and the next one-variable step
(docs/diagnose.md)."""

from optlab.diagnose.diagnosis import (
    DIAGNOSE_SCHEMA_VERSION,
    Diagnosis,
    Finding,
    diagnose,
    diagnose_run,
)
from optlab.diagnose.rules import RULES, Rule

__all__ = [
    "DIAGNOSE_SCHEMA_VERSION",
    "RULES",
    "Diagnosis",
    "Finding",
    "Rule",
    "diagnose",
    "diagnose_run",
]
