"""optlab's database: schema check on open, one session scope, and records out.

`Store.open()` opens OPTLAB_DB (or ./.optlab/optlab.db) and refuses a schema it cannot use;
`upgrade()` and `current()` back `optlab db upgrade` and `optlab db current`. A run's summary
is a `RunSummary` (`store.summary`), written and parsed by the store alone.
"""

from optlab.store.database import default_url
from optlab.store.reasons import Reason, ReasonCode
from optlab.store.records import (
    EnvironmentRecord,
    ExperimentRecord,
    GpuSample,
    KnobCellRecord,
    KnobSweepRecord,
    ResourceSample,
    RunErrorCount,
    RunFinal,
    RunRecord,
    RunStatus,
    SchemaStatus,
    StageStatsRow,
    StoredConfig,
    SweepLevelRecord,
    SweepLevelTag,
    SweepRecord,
    WindowStats,
)
from optlab.store.repository import Store
from optlab.store.schema import current, migrations_dir, upgrade
from optlab.store.summary import (
    SUMMARY_SCHEMA_VERSION,
    HostSummary,
    LatencyStats,
    LlmSummary,
    MeanMax,
    PairedTag,
    ParentStep,
    ResourceSummary,
    RunEvidence,
    RunSummary,
)
from optlab.store.sweep_result import SWEEP_RESULT_VERSION, Limit, SweepResult

__all__ = [
    "SUMMARY_SCHEMA_VERSION",
    "SWEEP_RESULT_VERSION",
    "EnvironmentRecord",
    "ExperimentRecord",
    "GpuSample",
    "KnobCellRecord",
    "KnobSweepRecord",
    "LatencyStats",
    "HostSummary",
    "LlmSummary",
    "Limit",
    "MeanMax",
    "PairedTag",
    "ParentStep",
    "Reason",
    "ReasonCode",
    "ResourceSample",
    "ResourceSummary",
    "RunErrorCount",
    "RunEvidence",
    "RunFinal",
    "RunRecord",
    "RunStatus",
    "RunSummary",
    "SchemaStatus",
    "StageStatsRow",
    "Store",
    "StoredConfig",
    "SweepLevelRecord",
    "SweepLevelTag",
    "SweepRecord",
    "SweepResult",
    "WindowStats",
    "current",
    "default_url",
    "migrations_dir",
    "upgrade",
]
