"""Rows as an old optlab wrote them, in raw SQL, for tests of databases at an old revision."""

from __future__ import annotations

from sqlalchemy import Connection, text


def old_experiment(connection: Connection, at: str) -> None:
    """Experiment 1, "old", with config 1, in raw SQL (for a database at an old revision)."""
    connection.execute(
        text(
            "INSERT INTO experiments (name, kind, created_at, updated_at) "
            "VALUES ('old', 'baseline', :at, :at)"
        ),
        {"at": at},
    )
    connection.execute(
        text(
            "INSERT INTO experiment_configs (experiment_id, config_json, config_hash, "
            "source_path, source_hash, created_at) VALUES (1, '{}', 'h', 'b.yaml', 's', :at)"
        ),
        {"at": at},
    )
    connection.execute(text("UPDATE experiments SET current_config_id = 1"))
