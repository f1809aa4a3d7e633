"""Dagster's schema check answers the same with alembic's migration scripts parsed once per process."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import sqlalchemy as db
from dagster._core.storage import sql
from dagster._core.storage.runs.sqlite import sqlite_run_storage

from dagster_streamgroup.patches import migrations


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
