"""Dagster's SQLite storages with one engine per database file that keeps its connections open: the same engine
for the same file and options, a SQLite instance that works as before (also wiped, from threads, and across a
fork), and a kept connection never used on a file deleted or replaced since it was opened."""

from __future__ import annotations

import importlib
import os
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    sqlite_engines.ENGINES.clear()
    try:
        assert sqlite_engines.install() and sqlite_engines.install(), "installing twice is harmless"
        yield
    finally:
        for module, original in zip(modules, before, strict=True):
            setattr(module, "create_engine", original)  # noqa: B010
        sqlite_engines.ENGINES.clear()


def dagster_connection(url: str) -> Any:
    """What Dagster's SQLite event log does for each connection: an engine, a transaction, then ``dispose()``.
    Returns the DBAPI connection it used."""
    engine = sqlite_engines.create_engine(url, poolclass=NullPool, connect_args={"timeout": 30})
    with engine.connect() as conn, conn.begin():
        conn.execute(db.text("create table if not exists t (x integer)"))
        conn.execute(db.text("insert into t values (1)"))
        used = conn.connection.dbapi_connection
    engine.dispose()
    return used


def rows_on_disk(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("select count(*) from t").fetchone()[0])


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
    memory = sqlite_engines.create_engine("sqlite://", poolclass=NullPool)
    assert isinstance(memory.pool, NullPool), "an in-memory database keeps no connection (it would keep its data)"


def test_a_connection_is_kept_open_across_dagsters_dispose(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    first = dagster_connection(url)
    assert dagster_connection(url) is first, "the second use takes the connection the first one opened"
    assert rows_on_disk(tmp_path / "kept.db") == 2


def test_a_kept_connection_is_not_used_on_a_file_deleted_or_replaced_since(tmp_path: Path) -> None:
    path = tmp_path / "replaced.db"
    url = f"sqlite:///{path}"
    first = dagster_connection(url)
    path.unlink()  # as Dagster's wipe() deletes the event log's files
    second = dagster_connection(url)
    assert second is not first, "the connection to the deleted file was dropped"
    assert rows_on_disk(path) == 1, "the row went to the file now at the path, not to the deleted one"
    replacement = tmp_path / "other.db"
    with sqlite3.connect(replacement) as conn:
        conn.execute("create table t (x integer)")
    conn.close()
    os.replace(replacement, path)
    assert dagster_connection(url) is not second
    assert rows_on_disk(path) == 1


def test_a_sqlite_instance_stores_and_reads_runs_and_events_with_kept_connections(
    installed: None, tmp_path: Path
) -> None:
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        runs = [create_run_for_test(instance, job_name=f"job_{i}") for i in range(3)]
        for run in runs:
            instance.report_engine_event("hello", run)
            instance.report_engine_event("again", run)
        assert instance.get_runs_count() == 3
        for run in runs:
            messages = [entry.message for entry in instance.all_logs(run.run_id)]
            assert messages[-2:] == ["hello", "again"]
        instance.wipe()  # deletes and recreates the database files under the kept connections
        assert instance.get_runs_count() == 0
        run = create_run_for_test(instance, job_name="after_wipe")
        instance.report_engine_event("after the wipe", run)
        assert [entry.message for entry in instance.all_logs(run.run_id)][-1] == "after the wipe"
    engines = sqlite_engines.ENGINES
    assert engines.hits > engines.misses, "connections reuse the engines (and their compiled statements)"
    assert len(engines) <= sqlite_engines.ENGINES_KEPT


def test_threads_store_events_of_one_run_side_by_side(installed: None, tmp_path: Path) -> None:
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        run = create_run_for_test(instance, job_name="threads")
        errors: list[BaseException] = []

        def report(thread: int) -> None:
            try:
                for i in range(25):
                    instance.report_engine_event(f"{thread}-{i}", run)
            except BaseException as exc:  # reported below: a thread's exception would otherwise vanish
                errors.append(exc)

        threads = [threading.Thread(target=report, args=(t,)) for t in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not errors
        messages = {entry.message for entry in instance.all_logs(run.run_id)}
        assert {f"{t}-{i}" for t in range(6) for i in range(25)} <= messages


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_opens_connections_of_its_own(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'forked.db'}"
    parents = dagster_connection(url)
    pid = os.fork()
    if pid == 0:  # the child: a new engine and connection, the parent's left alone
        code = 1
        try:
            code = 0 if len(sqlite_engines.ENGINES) == 0 and dagster_connection(url) is not parents else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert dagster_connection(url) is parents, "the parent still uses its own connection"
    assert rows_on_disk(tmp_path / "forked.db") == 3
