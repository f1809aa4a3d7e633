"""Dagster's SQLite storages with one engine per database file: the same engine for the same file and options,
a SQLite instance that works as before, and statements compiled once instead of at every connection."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as db
from dagster._core.test_utils import create_run_for_test
from sqlalchemy.pool import NullPool, StaticPool

from dagster_streamgroup.patches import sqlite_engines


@pytest.fixture
def installed() -> Iterator[None]:
    modules = [importlib.import_module(name) for name in sqlite_engines.STORAGE_MODULES]
    before = [getattr(m, "create_engine") for m in modules]  # noqa: B009
    try:
        assert sqlite_engines.install() and sqlite_engines.install(), "installing twice is harmless"
        yield
    finally:
        for module, original in zip(modules, before, strict=True):
            setattr(module, "create_engine", original)  # noqa: B010


def test_the_same_file_and_options_share_one_engine_and_anything_else_is_built_anew(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    timeout = {"timeout": 30}
    first = sqlite_engines.create_engine(url, poolclass=NullPool, connect_args=timeout)
    assert sqlite_engines.create_engine(url, poolclass=NullPool, connect_args={"timeout": 30}) is first
    assert sqlite_engines.create_engine(url, poolclass=NullPool) is not first, "other connect_args"
    assert sqlite_engines.create_engine(f"sqlite:///{tmp_path / 'b.db'}", poolclass=NullPool) is not first
    pooled = sqlite_engines.create_engine(url, poolclass=StaticPool)
    assert pooled is not sqlite_engines.create_engine(url, poolclass=StaticPool), "a pool holding a connection"
    assert sqlite_engines.create_engine(url, poolclass=NullPool, echo=True) is not first, "options it does not know"
    first.dispose()  # what Dagster's event log does after each connection: the engine still connects
    with first.connect() as conn:
        assert conn.execute(db.text("select 1")).scalar() == 1
    pooled.dispose()


def test_a_sqlite_instance_stores_and_reads_runs_and_events_with_shared_engines(
    installed: None, tmp_path: Path
) -> None:
    sqlite_engines._engine.cache_clear()
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        runs = [create_run_for_test(instance, job_name=f"job_{i}") for i in range(3)]
        for run in runs:
            instance.report_engine_event("hello", run)
            instance.report_engine_event("again", run)
        assert instance.get_runs_count() == 3
        for run in runs:
            messages = [entry.message for entry in instance.all_logs(run.run_id)]
            assert messages[-2:] == ["hello", "again"]
    info = sqlite_engines._engine.cache_info()
    assert info.hits > info.misses, "connections reuse the engines (and their compiled statements)"
    assert info.currsize <= sqlite_engines.ENGINES_KEPT
