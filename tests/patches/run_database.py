"""A run's SQLite event database as the daemon creates it (with the run's first event), and what it holds."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import sqlalchemy as db

Contents = tuple[list[tuple[str, ...]], list[tuple[str, str, str]], str, int]


def store_first_event(base_dir: Path, run_id: str) -> None:
    """Store a run's first event in a SQLite event log storage of ``base_dir``, which creates the run's database."""
    from dagster._core.events import AssetMaterializationPlannedData, DagsterEvent, DagsterEventType
    from dagster._core.events.log import EventLogEntry
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    storage = SqliteEventLogStorage(str(base_dir))
    planned = DagsterEvent(
        DagsterEventType.ASSET_MATERIALIZATION_PLANNED.value,
        "job",
        event_specific_data=AssetMaterializationPlannedData(dg.AssetKey("a")),
    )
    entry = EventLogEntry(
        error_info=None, level=20, user_message="", run_id=run_id, timestamp=1.0, dagster_event=planned, job_name="job"
    )
    storage.store_event(entry)
    assert len(storage.get_records_for_run(run_id).records) == 1, "the event is stored"
    storage.dispose()


def contents(path: Path) -> Contents:
    """A run database's version rows, schema (every table and index with its SQL), journal mode and events."""
    engine = db.create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            versions = [tuple(row) for row in conn.execute(db.text("SELECT version_num FROM alembic_version"))]
            schema = conn.execute(db.text("SELECT type, name, sql FROM sqlite_master ORDER BY type, name"))
            mode = conn.execute(db.text("PRAGMA journal_mode")).scalar_one()
            events = conn.execute(db.text("SELECT count(*) FROM event_logs")).scalar_one()
            return versions, [(str(t), str(n), str(q)) for t, n, q in schema], str(mode), int(events)
    finally:
        engine.dispose()
