"""The SQL storages' schema checks answered once they say yes: a SQLite instance keeps its sensor states, ticks,
runs and asset events as before, a yes is no longer asked of the database, and a no still is (a migration is
seen)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as db
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
from dagster._core.scheduler.instigation import (
    InstigatorState,
    InstigatorStatus,
    InstigatorTick,
    InstigatorType,
    SensorInstigatorData,
    TickData,
    TickStatus,
)
from dagster._core.storage.schedules.sql_schedule_storage import SqlScheduleStorage
from sqlalchemy.engine import Engine

from dagster_streamgroup import patches
from dagster_streamgroup.patches import schema_checks


@pytest.fixture
def installed() -> Iterator[None]:
    classes = [(target.storage_class(), target.methods) for target in schema_checks.TARGETS]
    before = [(cls, name, cls.__dict__[name]) for cls, names in classes for name in names]
    try:
        assert schema_checks.install() and schema_checks.install(), "installing twice is harmless"
        for cls, name, _method in before:
            wrapped = cls.__dict__[name]
            assert getattr(wrapped, patches.ORIGINAL, None) is not None, f"{cls.__name__}.{name} missing"
            assert getattr(getattr(wrapped, patches.ORIGINAL), patches.ORIGINAL, None) is None, "wrapped once"
        yield
    finally:
        for cls, name, method in before:
            setattr(cls, name, method)


@pytest.fixture
def statements() -> Iterator[list[str]]:
    """Every SQL statement any engine of this process executes meanwhile (SQLAlchemy's own event)."""
    seen: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    db.event.listen(Engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        db.event.remove(Engine, "before_cursor_execute", record)


def _sensor_state(name: str) -> InstigatorState:
    origin = RemoteInstigatorOrigin(RemoteRepositoryOrigin(RegisteredCodeLocationOrigin("test"), "repo"), name)
    return InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.RUNNING, SensorInstigatorData(cursor="c0"))


def test_a_yes_is_kept_and_a_no_is_asked_again(installed: None, statements: list[str], tmp_path: Path) -> None:
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        storage = instance.schedule_storage
        assert isinstance(storage, SqlScheduleStorage)
        assert storage.has_instigators_table() and storage.has_secondary_index_table()
        statements.clear()
        assert storage.has_instigators_table() and storage.has_secondary_index_table()
        assert statements == [], "a yes is answered without asking the database"

        assert not storage.has_built_index("streamgroup_test_index")
        asked = len(statements)
        assert asked > 0
        assert not storage.has_built_index("streamgroup_test_index")
        assert len(statements) > asked, "a no is asked again"
        storage.mark_index_built("streamgroup_test_index")
        assert storage.has_built_index("streamgroup_test_index"), "an index built meanwhile is seen"
        statements.clear()
        assert storage.has_built_index("streamgroup_test_index")
        assert statements == []


def test_a_sqlite_instance_keeps_sensor_states_and_ticks(installed: None, tmp_path: Path) -> None:
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        state = _sensor_state("member_0")
        instance.add_instigator_state(state)
        instance.update_instigator_state(state.with_data(SensorInstigatorData(cursor="c1")))
        stored = instance.get_instigator_state(state.instigator_origin_id, state.selector_id)
        assert stored is not None and stored.instigator_data.cursor == "c1"  # type: ignore[union-attr]
        tick = instance.create_tick(
            TickData(
                instigator_origin_id=state.instigator_origin_id,
                instigator_name="member_0",
                instigator_type=InstigatorType.SENSOR,
                status=TickStatus.STARTED,
                timestamp=1.0,
                selector_id=state.selector_id,
            )
        )
        instance.update_tick(tick.with_status(TickStatus.SKIPPED))
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id)
        assert [t.status for t in ticks] == [TickStatus.SKIPPED]
        assert isinstance(ticks[0], InstigatorTick)


def test_run_records_and_materializations_ask_the_schema_once(installed: None, tmp_path: Path) -> None:
    """The run storage's column check (at every ``get_run_records``) and the event log's table and column checks
    (as it stores a materialization) are asked of the database once, and runs and asset events read back as
    before. A run's own event-log file is created with the whole schema (Dagster asks about each table then);
    only the statements on the runs' and the index's databases count."""
    seen: list[tuple[str, str]] = []

    def record(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append((str(conn.engine.url), statement))

    def schema_reads(database: str) -> list[str]:
        return [s for url, s in seen if url.endswith(database) and ("PRAGMA" in s.upper() or "sqlite_master" in s)]

    @dg.asset
    def counted() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata={"records": 3})

    db.event.listen(Engine, "before_cursor_execute", record)
    try:
        with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
            assert dg.materialize([counted], instance=instance, tags={"kind": "first"}).success
            seen.clear()
            for _ in range(3):
                assert len(instance.get_run_records(dg.RunsFilter(tags={"kind": "first"}))) == 1
            assert schema_reads("runs.db") == [], "a yes was asked again"
            assert any(url.endswith("runs.db") for url, _ in seen), "the runs were read from runs.db"

            seen.clear()
            result = dg.materialize([counted], instance=instance, tags={"kind": "second"})
            assert result.success
            assert schema_reads("index.db") == [], "the event log's tables and columns were inspected again"
            assert schema_reads("runs.db") == []
            event = instance.get_latest_materialization_event(dg.AssetKey("counted"))
            assert event is not None and event.run_id == result.run_id
            assert event.asset_materialization is not None
            assert event.asset_materialization.metadata["records"] == dg.MetadataValue.int(3)
            records = instance.get_run_records(dg.RunsFilter(tags={"kind": "second"}))
            assert [r.dagster_run.run_id for r in records] == [result.run_id]
            assert records[0].start_time is not None and records[0].end_time is not None, "run stats columns read"
    finally:
        db.event.remove(Engine, "before_cursor_execute", record)


def test_the_event_log_asks_again_about_a_table_it_lacks(
    installed: None, statements: list[str], tmp_path: Path
) -> None:
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        storage = instance.event_log_storage
        assert storage.has_table("event_logs")
        statements.clear()
        assert storage.has_table("event_logs")
        assert statements == [], "a yes is answered without asking the database"
        assert not storage.has_table("streamgroup_no_such_table")
        assert not storage.has_table("streamgroup_no_such_table"), "a no is asked again (and still no)"
        asked = [s for s in statements if "streamgroup_no_such_table" in str(s) or "sqlite_master" in s]
        assert len(asked) >= 2, statements
