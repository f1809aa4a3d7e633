"""Dagster's schema check answers the same with alembic's migration scripts parsed once per process."""

from __future__ import annotations

import importlib
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as db
from alembic.script import ScriptDirectory
from dagster._core.storage import sql
from dagster._core.storage.runs.sqlite import sqlite_run_storage

from dagster_streamgroup.patches import migrations
from tests.patches import run_database


def test_the_schema_check_answers_the_same_with_the_scripts_parsed_once(tmp_path: Path) -> None:
    with dg.instance_for_test(temp_dir=str(tmp_path)):  # a SQLite instance: its run database at the head
        pass
    engine = db.create_engine(f"sqlite:///{tmp_path / 'history' / 'runs.db'}")
    config = sql.get_alembic_config(sqlite_run_storage.__file__)
    original = sql.ScriptDirectory
    try:
        with engine.connect() as conn:
            before = sql.check_alembic_revision(config, conn)
            assert migrations.install() and migrations.install(), "installing twice is harmless"
            after = sql.check_alembic_revision(config, conn)
            again = sql.check_alembic_revision(config, conn)
        assert before == after == again and before[0] == before[1], "the database is at the head either way"
        parsed = migrations.ParsedScripts.parsed
        assert len(parsed) == 1 and migrations.ParsedScripts.from_config(config) is next(iter(parsed.values()))
        assert migrations.parse_once() == before[1]
        with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:  # storages build as before
            assert instance.get_runs_count() == 0
    finally:
        setattr(sql, "ScriptDirectory", original)  # noqa: B010
        engine.dispose()


def _new_run_database(base_dir: Path) -> tuple[list[tuple[str, ...]], list[tuple[str, str, str]]]:
    """A SQLite event log storage creates a run's database at the run's first event: its version rows and its
    schema (every table and index with its SQL)."""
    run_database.store_first_event(base_dir, "run-1")
    versions, schema, _, _ = run_database.contents(base_dir / "run-1.db")
    return versions, schema


def test_a_new_run_database_is_stamped_the_same_with_the_scripts_parsed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon creates each run's event database on SQLite: stamped through the parsed scripts, it holds the
    same version row and the same schema as with alembic's ``stamp`` command."""
    from dagster._core.storage.event_log.sqlite import sqlite_event_log

    monkeypatch.setattr(sql, "ScriptDirectory", ScriptDirectory)
    for name in migrations.SQLITE_STORAGE_MODULES:
        monkeypatch.setattr(importlib.import_module(name), "stamp_alembic_rev", sql.stamp_alembic_rev)
    dagsters = _new_run_database(tmp_path / "dagster")
    assert migrations.install()
    assert getattr(sqlite_event_log, "stamp_alembic_rev") is migrations.stamp_with_parsed_scripts  # noqa: B009
    parsed = _new_run_database(tmp_path / "parsed")
    head = migrations.parse_once()
    assert dagsters == parsed
    assert dagsters[0] == [(head,)], "the head revision, one row"
    assert any(name == "event_logs" for _, name, _ in dagsters[1])
