"""The schedule storage's schema checks answered once they say yes: a SQLite instance keeps its sensor states
and ticks as before, a yes is no longer asked of the database, and a no still is (a migration is seen)."""

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

from dagster_streamgroup.patches import schema_checks


@pytest.fixture
def installed() -> Iterator[None]:
    before = {name: SqlScheduleStorage.__dict__[name] for name in schema_checks.CHECKS}
    try:
        assert schema_checks.install() and schema_checks.install(), "installing twice is harmless"
        for name in schema_checks.CHECKS:
            wrapped = SqlScheduleStorage.__dict__[name]
            assert getattr(wrapped, "__streamgroup_original__", None) is not None, f"{name} not installed"
            assert getattr(wrapped.__streamgroup_original__, "__streamgroup_original__", None) is None, "wrapped once"
        yield
    finally:
        for name, method in before.items():
            setattr(SqlScheduleStorage, name, method)


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
