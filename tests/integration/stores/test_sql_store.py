"""What the SQL store adds to the store contract: its URL handling, secrets kept out of messages, the
guard that refuses rows it cannot read even with a matching version, and SQLite's sharing settings."""

from __future__ import annotations

import json
import sqlite3
import threading
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert, text
from sqlalchemy.engine import make_url

from dagster_streamgroup.protocol.codec import ForeignStateError, NewerSchemaError, encode_state
from dagster_streamgroup.protocol.state import SCHEMA_VERSION, GroupState
from dagster_streamgroup.stores.sql import (
    DEFAULT_TABLE,
    SqlStateStore,
    StoreConfigError,
    StoreUnavailableError,
    state_table,
)


def _state() -> GroupState:
    return GroupState(stream="s", group="g", created_at=1.0)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'nested' / 'dir' / 'state.db'}"


def test_sqlite_creates_the_parent_directory_and_shares_the_file_in_wal_mode(sqlite_url: str) -> None:
    store = SqlStateStore(sqlite_url)
    try:
        assert store.save_if("k", _state(), None)
    finally:
        store.close()
    path = make_url(sqlite_url).database
    assert path is not None and Path(path).is_file()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_in_memory_sqlite_is_refused() -> None:
    for url in ("sqlite://", "sqlite:///:memory:"):
        with pytest.raises(StoreConfigError, match="file path"):
            SqlStateStore(url)


def test_a_token_that_is_not_a_version_is_a_clear_error(sqlite_url: str) -> None:
    store = SqlStateStore(sqlite_url)
    try:
        store.save_if("k", _state(), None)
        with pytest.raises(StoreConfigError, match="token 'abc'"):
            store.save_if("k", _state(), "abc")
    finally:
        store.close()


def _plant(url: str, key: str, body: str, kind: str, schema_version: int) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(state_table(DEFAULT_TABLE)).values(
                    key=key, version=1, kind=kind, schema_version=schema_version, body=body
                )
            )
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_a_matching_token_on_an_unreadable_row_raises_instead_of_writing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A caller that presents the row's real version (it cannot have loaded it, but versions are guessable)
    gets the format error; the row keeps its body and version."""
    url = request.getfixturevalue("postgres_url") if backend == "postgresql" else f"sqlite:///{tmp_path / 's.db'}"
    store = SqlStateStore(url)
    try:
        newer = json.loads(encode_state(_state()))
        newer["schema_version"] = SCHEMA_VERSION + 1
        foreign = json.dumps({"session_states": []})
        cases = [
            (json.dumps(newer), "dagster-streamgroup/group-state", SCHEMA_VERSION + 1, NewerSchemaError),
            (foreign, "v3io-go", 0, ForeignStateError),
        ]
        for body, kind, schema, error in cases:
            key = f"k-{uuid.uuid4().hex[:8]}"
            _plant(url, key, body, kind, schema)
            with pytest.raises(error):
                store.save_if(key, _state(), "1")
            engine = create_engine(url)
            with engine.connect() as conn:
                row = conn.execute(text(f"SELECT version, body FROM {DEFAULT_TABLE} WHERE key = :k"), {"k": key}).one()
            engine.dispose()
            assert (row.version, row.body) == (1, body)
    finally:
        store.close()


@pytest.mark.postgres
def test_postgresql_scheme_is_mapped_to_psycopg(postgres_url: str) -> None:
    plain = make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    store = SqlStateStore(plain)
    try:
        assert store.url.startswith("postgresql+psycopg://")
        assert store.save_if(f"k-{uuid.uuid4().hex}", _state(), None)
    finally:
        store.close()


@pytest.mark.postgres
def test_the_password_never_appears_in_repr_or_errors(postgres_url: str) -> None:
    url = make_url(postgres_url)
    password = url.password
    assert password
    store = SqlStateStore(postgres_url)
    try:
        assert password not in repr(store)
        assert password not in store.url
    finally:
        store.close()
    wrong = url.set(password=f"{password}-wrong").render_as_string(hide_password=False)
    with pytest.raises(StoreUnavailableError) as refused:
        SqlStateStore(wrong)
    assert "password authentication failed" in str(refused.value)
    assert password not in str(refused.value)
    assert "***" in str(refused.value)
    closed = url.set(port=1).render_as_string(hide_password=False)
    with pytest.raises(StoreUnavailableError) as unreachable:
        SqlStateStore(closed)
    assert password not in str(unreachable.value)


@pytest.mark.postgres
def test_postgresql_now_is_the_server_clock(postgres_url: str) -> None:
    store = SqlStateStore(postgres_url)
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            before = float(conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
            middle = store.now()
            after = float(conn.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
        assert before <= middle <= after
    finally:
        store.close()
        engine.dispose()


@pytest.mark.postgres
def test_many_members_creating_the_table_at_once_all_succeed(postgres_url: str) -> None:
    """Even CREATE TABLE IF NOT EXISTS races on PostgreSQL (a duplicate pg_type row)."""
    table = f"race_{uuid.uuid4().hex[:10]}"
    errors: list[BaseException] = []
    stores: list[SqlStateStore] = []
    start = threading.Barrier(8)

    def open_one() -> None:
        try:
            start.wait(timeout=30)
            stores.append(SqlStateStore(postgres_url, table=table))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    try:
        assert errors == []
        assert len(stores) == 8
        assert stores[0].save_if("k", _state(), None)
        assert stores[7].load("k")[1] == "1"
    finally:
        for s in stores:
            s.close()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:p%40ss@db:5432/x", "postgresql+psycopg://u:***@db:5432/x"),
        ("postgresql://u@db/x?password=pa&sslmode=require", "postgresql+psycopg://u@db/x?password=***&sslmode=require"),
        ("postgresql://u:pa@db/x?sslpassword=pb", "postgresql+psycopg://u:***@db/x?sslpassword=***"),
    ],
)
def test_a_store_shows_its_url_with_every_secret_hidden(url: str, shown: str) -> None:
    """Nothing listens on port 1: the store's table cannot be created, and the error shows its URL."""
    pytest.importorskip("psycopg")
    local = url.replace("@db", "@127.0.0.1").replace("127.0.0.1:5432", "127.0.0.1:1")
    with pytest.raises(StoreUnavailableError) as caught:
        SqlStateStore(local)
    expected = shown.replace("@db", "@127.0.0.1").replace("127.0.0.1:5432", "127.0.0.1:1")
    assert str(caught.value).startswith(f"state store {expected}: cannot create its table"), caught.value


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@ss@db:5432/x",  # an unencoded @: the host would be "ss@db"
        "postgresql://u:pa/ss@db/x?sslmode=require",  # libpq reads host u, port pa
        "postgresql://u@db/x?pasword=pa",  # a parameter libpq does not know
    ],
)
def test_a_url_its_drivers_read_differently_is_refused_showing_only_its_scheme(url: str) -> None:
    with pytest.raises(StoreConfigError, match=r"^store URL postgresql://\*\*\* is not a URL its drivers read alike"):
        SqlStateStore(url)
