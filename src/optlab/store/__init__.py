"""optlab's database: schema check on open, one session scope, and records out.

`Store.open()` opens OPTLAB_DB (or ./.optlab/optlab.db) and refuses a schema it cannot use;
`upgrade()` and `current()` back `optlab db upgrade` and `optlab db current`.
"""

from optlab.store.database import current, default_url, migrations_dir, upgrade
from optlab.store.records import (
    EnvironmentRecord,
    ExperimentRecord,
    GpuSample,
    ResourceSample,
    RunErrorCount,
    RunRecord,
    RunStatus,
    SchemaStatus,
    StageStatsRow,
    StoredConfig,
    WindowStats,
)
from optlab.store.repository import Store

__all__ = [
    "EnvironmentRecord",
    "ExperimentRecord",
    "GpuSample",
    "ResourceSample",
    "RunErrorCount",
    "RunRecord",
    "RunStatus",
    "SchemaStatus",
    "StageStatsRow",
    "Store",
    "StoredConfig",
    "WindowStats",
    "current",
    "default_url",
    "migrations_dir",
    "upgrade",
]
