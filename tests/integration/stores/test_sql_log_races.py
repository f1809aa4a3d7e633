"""The logged SQL store racing its folds, each race forced to happen at one place (SQLite and PostgreSQL).

A fold deletes the log rows the previous base row covered: a write from a version two folds behind must be
refused, not inserted where no reader looks, and a read must never pair a base row with log rows it already
holds. The stores fold on every write here (thresholds set per store)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Column, Engine, MetaData, Table, Text, create_engine, event, func, select, update

from dagster_streamgroup import protocol
from dagster_streamgroup.protocol import GroupState
from dagster_streamgroup.protocol.codec import encode_state
from dagster_streamgroup.protocol.state import EventKind, GroupEvent
from dagster_streamgroup.stores.sql import DEFAULT_TABLE, state_table
from dagster_streamgroup.stores.sql_log import LoggedSqlStateStore, log_table

FOLD_EVERY_WRITE: dict[str, Any] = {"min_fold_bytes": 0, "fold_fraction": 0.0}
PG_STAT_ACTIVITY = Table(
    "pg_stat_activity", MetaData(), Column("application_name", Text), Column("wait_event_type", Text)
)


@pytest.fixture
def stores() -> Iterator[list[LoggedSqlStateStore]]:
    """Stores opened by the test; closed at its end."""
    opened: list[LoggedSqlStateStore] = []
    yield opened
    for store in opened:
        store.close()


def _open(url: str, stores: list[LoggedSqlStateStore], **settings: Any) -> LoggedSqlStateStore:
    store = LoggedSqlStateStore(url, **settings)
    stores.append(store)
    return store


def _next(state: GroupState, member: str, at: float) -> GroupState:
    """The state after one write of ``member``: its heartbeat and one event (so a change applied twice shows)."""
    beat = protocol.heartbeat(state, member, at)
    event_ = GroupEvent(kind=EventKind.LEFT, at=at, member_id=member, detail=f"{member}@{at}")
    return beat.model_copy(update={"events": (*beat.events, event_), "revision": state.revision + 1})


def _write(store: LoggedSqlStateStore, key: str, member: str, at: float) -> GroupState:
    state, token = store.load(key)
    assert state is not None
    written = _next(state, member, at)
    assert store.save_if(key, written, token)
    return written


def _engine_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1)


def _log_versions(url: str, key: str) -> list[int]:
    engine = create_engine(_engine_url(url))
    log = log_table(f"{DEFAULT_TABLE}_log")
    try:
        with engine.connect() as conn:
            return [int(v) for v in conn.execute(select(log.c.version).where(log.c.key == key)).scalars()]
    finally:
        engine.dispose()


def test_a_write_from_a_version_two_folds_behind_is_refused(
    url: str, key: str, stores: list[LoggedSqlStateStore]
) -> None:
    writer, late = _open(url, stores, **FOLD_EVERY_WRITE), _open(url, stores)
    assert writer.save_if(key, protocol.new_group("stream", "g", 1.0), None)
    loaded, token = late.load(key)  # then a pause: a slow broker call, a GC pause, SIGSTOP
    assert loaded is not None and token == "1"
    for i in range(3):
        last = _write(writer, key, "a", 2.0 + i)
    assert writer.folds >= 2, "the rows the late writer's version would follow are folded away"
    assert 2 not in _log_versions(url, key)

    assert late.save_if(key, _next(loaded, "late", 9.0), token) is False
    assert 2 not in _log_versions(url, key), "nothing was inserted below the base row"
    fresh = _open(url, stores)
    assert fresh.load(key)[0] == last
    state, token = late.load(key)
    assert state == last
    assert late.save_if(key, _next(state, "late", 9.0), token), "a write from the newest version goes in"


def test_a_write_from_before_the_schema_rewrite_of_the_base_row_is_refused(
    url: str, key: str, stores: list[LoggedSqlStateStore]
) -> None:
    """The base row of an earlier schema is rewritten whole at the next version, with no log row: a second
    writer of the same version must not append that version to the log (readers skip it: the base is past)."""
    first, second = _open(url, stores), _open(url, stores)
    assert first.save_if(key, protocol.new_group("stream", "g", 1.0), None)
    engine = create_engine(_engine_url(url))
    table = state_table(DEFAULT_TABLE)
    with engine.begin() as conn:  # as an earlier member left it
        conn.execute(update(table).where(table.c.key == key).values(schema_version=2))
    engine.dispose()
    state_a, token_a = first.load(key)
    state_b, token_b = second.load(key)
    assert state_a is not None and state_b is not None and token_a == token_b
    written = _next(state_a, "a", 2.0)
    assert first.save_if(key, written, token_a)  # rewrites the base row whole at version 2

    assert second.save_if(key, _next(state_b, "b", 2.0), token_b) is False
    assert _log_versions(url, key) == []
    assert _open(url, stores).load(key)[0] == written


def test_a_read_with_a_fold_in_the_middle_returns_a_state_that_was_written(
    url: str, key: str, stores: list[LoggedSqlStateStore]
) -> None:
    """A reader that knows nothing of the key reads the base row and the rows after it; a fold that lands
    between its statements must not give it the base row's new body with the rows that body already holds."""
    writer, reader = _open(url, stores, **FOLD_EVERY_WRITE), _open(url, stores)
    first = protocol.new_group("stream", "g", 1.0)
    assert writer.save_if(key, first, None)
    written = {1: first}
    fired = threading.Event()

    def fold_now(*_args: Any) -> None:
        if not fired.is_set():
            fired.set()
            written[2] = _write(writer, key, "a", 2.0)  # appends row 2 and folds it into the base row

    event.listen(reader._engine, "after_cursor_execute", fold_now)
    try:
        state, token = reader.load(key)
    finally:
        event.remove(reader._engine, "after_cursor_execute", fold_now)
    assert fired.is_set() and writer.folds == 1
    assert token is not None and state == written[int(token)]
    assert reader.load(key) == (written[2], "2")


@pytest.mark.postgres
def test_an_insert_that_waited_for_a_fold_reads_the_base_row_that_fold_wrote(
    postgres_url: str, key: str, stores: list[LoggedSqlStateStore]
) -> None:
    """PostgreSQL: the statement that inserts row ``v + 1`` reads the base row under a lock. A fold committing
    while it runs (here: one transaction folding twice, left open until the insert waits on it) must make the
    insert see the base row the fold wrote, not the one of the insert's snapshot."""
    writer, late = _open(postgres_url, stores), _open(postgres_url, stores)
    assert writer.save_if(key, protocol.new_group("stream", "g", 1.0), None)
    loaded, token = late.load(key)
    assert loaded is not None and token == "1"
    last = [_write(writer, key, "a", 2.0 + i) for i in range(2)][-1]
    engine = create_engine(_engine_url(postgres_url))
    table, log = state_table(DEFAULT_TABLE), log_table(f"{DEFAULT_TABLE}_log")
    outcome: list[bool] = []
    try:
        with engine.connect() as folding:
            transaction = folding.begin()
            folding.execute(update(table).where(table.c.key == key).values(version=3, body=encode_state(last)))
            folding.execute(log.delete().where(log.c.key == key, log.c.version <= 2))
            late_write = _next(loaded, "late", 9.0)
            saving = threading.Thread(target=lambda: outcome.append(late.save_if(key, late_write, token)))
            saving.start()
            _wait_for_a_lock_wait(engine)
            assert saving.is_alive() and not outcome, "the insert waits for the fold"
            transaction.commit()
        saving.join(timeout=30)
        assert outcome == [False]
        assert _log_versions(postgres_url, key) == [3]
    finally:
        engine.dispose()


def _wait_for_a_lock_wait(engine: Engine, timeout_s: float = 10.0) -> None:
    """Until a session of the store waits for a lock (the fold's), so the race is forced, not hoped for."""
    deadline = time.monotonic() + timeout_s
    waiting = (
        select(func.count())
        .select_from(PG_STAT_ACTIVITY)
        .where(
            PG_STAT_ACTIVITY.c.application_name == "dagster-streamgroup", PG_STAT_ACTIVITY.c.wait_event_type == "Lock"
        )
    )
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(waiting).scalar_one():
                return
        time.sleep(0.05)
    raise AssertionError("the store's insert never waited for the open fold")
