"""The SQL state store: one row per group state, compare-and-set on an integer version column.

SQLite (a file; WAL and a busy timeout so the processes of one host can share it) is the default;
PostgreSQL serves members on many hosts and supplies the clock they agree on (``clock_timestamp()``).

Why a version column and not a timestamp: v3io-go lost updates while its CAS compared only part of an
mtime (v3io-go #108); a counter that every write bumps cannot repeat. Why ``INSERT ... ON CONFLICT DO
NOTHING`` for the first write: an unconditional create let two members both "create" the state and one
registration vanished (v3io-go #107).

Each row also carries the ``kind`` and ``schema_version`` of the state it holds, copied from the state
when it is written. The CAS ``UPDATE`` requires them to be ours and not newer, so a row this version
cannot read is never overwritten, even by a caller that presents its current version.

Every operation is one statement on an autocommit connection: the conditional ``UPDATE`` is atomic on
its own, and a CAS costs one round trip instead of BEGIN/UPDATE/COMMIT.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    event,
    func,
    inspect,
    select,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.schema import CreateTable

from dagster_streamgroup.protocol.codec import ForeignStateError, decode_state, encode_state
from dagster_streamgroup.protocol.state import SCHEMA_VERSION, STATE_KIND, GroupState
from dagster_streamgroup.redact import read, redact, scrub, secrets_in
from dagster_streamgroup.stores.base import StateToken, StoreConfigError, StoreUnavailableError
from dagster_streamgroup.stores.ranges import CommittedRange
from dagster_streamgroup.stores.sql_ranges import SqlRangeIndex

DEFAULT_TABLE = "streamgroup_state"
SQLITE_BUSY_TIMEOUT_S = 30.0
"""How long a SQLite writer waits for another process's write lock before failing (CAS writes take ms)."""

_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_POSTGRES_DRIVERS = {"postgresql", "postgres", "postgresql+psycopg"}


_UNREACHABLE = (OperationalError, InterfaceError)
"""The database could not be reached or the connection broke (psycopg reports a closed connection as an
InterfaceError): the store is unavailable, and the member retries on its next tick."""


def normalize_url(url: str) -> URL:
    """Map ``postgresql://``/``postgres://`` to the psycopg 3 driver; check SQLite has a file path.

    A URL its drivers would not read alike (SQLAlchemy's parser, libpq's: ``redact.read``) is refused before
    it is parsed: an unencoded ``@``, ``/``, ``?`` or ``#`` in a password, a port that is no number or a query
    parameter libpq does not know would otherwise reach the server as another host, database or port, and
    its errors would quote what is in fact a piece of the password."""
    reading = read(url)
    if not reading.well_formed:
        raise StoreConfigError(
            f"store URL {reading.shown} is not a URL its drivers read alike (SQLAlchemy's parser and libpq's): "
            "percent-encode the user name and password (urllib.parse.quote(password, safe='')), give the port as "
            "a number, and only libpq's connection parameters in the query"
        )
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # their texts could quote a password the parser took for another part
        raise StoreConfigError(f"store URL {reading.shown} cannot be parsed") from None
    if parsed.drivername in _POSTGRES_DRIVERS:
        return parsed.set(drivername="postgresql+psycopg")
    if parsed.drivername in {"sqlite", "sqlite+pysqlite"}:
        if not parsed.database or parsed.database == ":memory:" or parsed.database.startswith("file:"):
            raise StoreConfigError(
                f"store URL {reading.shown!r}: a SQLite store needs a file path "
                "(sqlite:///path/to/state.db); an in-memory SQLite database is private to one connection"
            )
        return parsed
    raise StoreConfigError(
        f"store URL {reading.shown!r}: SqlStateStore supports sqlite:///PATH and postgresql://..., "
        f"not {parsed.drivername!r}"
    )


def sqlite_file(url: str) -> Path | None:
    """The database file of a SQLite store URL (None for any other store): what a reader checks exists before
    opening it, since opening a SQLite URL creates an empty file."""
    parsed = normalize_url(url) if url.lower().startswith("sqlite") else None
    if parsed is None or parsed.drivername not in {"sqlite", "sqlite+pysqlite"} or not parsed.database:
        return None
    return Path(parsed.database).resolve()


def state_table(name: str) -> Table:
    """The table layout; ``kind``/``schema_version`` mirror the body so the CAS can refuse rows not ours."""
    return Table(
        name,
        MetaData(),
        Column("key", Text, primary_key=True),
        Column("version", BigInteger, nullable=False),
        Column("kind", Text, nullable=False),
        Column("schema_version", Integer, nullable=False),
        Column("body", Text, nullable=False),
        Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    )


def _enable_sqlite_wal(dbapi_connection: Any, _record: Any) -> None:
    """WAL lets readers proceed while one process writes; the busy timeout makes writers queue instead of
    failing at once. ``journal_mode`` is persistent in the file, so it is only switched when needed."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        mode = cursor.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


class SqlStateStore:
    """A ``StateStore`` over SQLAlchemy Core: ``sqlite:///path`` or ``postgresql://user:pw@host/db``."""

    def __init__(self, url: str, *, table: str = DEFAULT_TABLE) -> None:
        if not _TABLE_NAME.match(table):
            raise StoreConfigError(f"table {table!r}: use letters, digits and underscores (at most 63)")
        parsed = normalize_url(url)
        self._url = parsed
        self._safe_url = redact(parsed.render_as_string(hide_password=False))
        self._secrets = secrets_in(url)
        self._is_postgres = parsed.get_backend_name() == "postgresql"
        self._table = state_table(table)
        self._engine = self._create_engine(parsed)
        self._ensure_table()

    def __repr__(self) -> str:
        return f"SqlStateStore({self._safe_url!r}, table={self._table.name!r})"

    @property
    def url(self) -> str:
        """The store URL with the password hidden."""
        return self._safe_url

    def _create_engine(self, parsed: URL) -> Engine:
        if self._is_postgres:
            # Sensor ticks are short and frequent: keep a couple of warm connections, check them before use
            # (a server restart or an idle timeout between ticks must not fail the next tick).
            return create_engine(
                parsed,
                isolation_level="AUTOCOMMIT",
                pool_size=2,
                max_overflow=4,
                pool_pre_ping=True,
                pool_recycle=600,
                connect_args={"connect_timeout": 10, "application_name": "dagster-streamgroup"},
                hide_parameters=True,
            )
        assert parsed.database is not None
        directory = Path(parsed.database).expanduser().parent
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreConfigError(
                f"store URL {self._safe_url!r}: cannot create the SQLite file's directory {directory}: {exc.strerror}"
            ) from None
        engine = create_engine(
            parsed,
            isolation_level="AUTOCOMMIT",
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
            hide_parameters=True,
        )
        event.listen(engine, "connect", _enable_sqlite_wal)
        return engine

    def _unavailable(self, action: str, exc: DBAPIError) -> StoreUnavailableError:
        """The error to raise ``from None``: it carries the driver's message scrubbed of the URL's secrets, and
        the driver's exception chained to it would be shown unscrubbed (Dagster shows an error's causes)."""
        detail = scrub(str(exc.orig) if exc.orig is not None else type(exc).__name__, self._secrets)
        return StoreUnavailableError(f"state store {self._safe_url}: cannot {action}: {detail.strip()}")

    def _ensure_table(self) -> None:
        """Create the table if absent. Many members may start at once, and even ``IF NOT EXISTS`` can race
        (PostgreSQL reports a duplicate type): a failure is fine when the table exists afterwards."""
        try:
            with self._engine.connect() as conn:
                conn.execute(CreateTable(self._table, if_not_exists=True))
        except DBAPIError as exc:
            try:
                exists = inspect(self._engine).has_table(self._table.name)
            except DBAPIError:
                exists = False
            if not exists:
                self._engine.dispose()
                raise self._unavailable("create its table", exc) from None

    def _where(self, key: str) -> str:
        return f"{self._safe_url} key {key!r}"

    def load(self, key: str) -> tuple[GroupState | None, StateToken | None]:
        t = self._table
        try:
            with self._engine.connect() as conn:
                row = conn.execute(select(t.c.version, t.c.body).where(t.c.key == key)).one_or_none()
        except _UNREACHABLE as exc:
            raise self._unavailable(f"load {key!r}", exc) from None
        if row is None:
            return None, None
        return decode_state(row.body, where=self._where(key)), str(row.version)

    def save_if(self, key: str, state: GroupState, token: StateToken | None) -> bool:
        body = encode_state(state)
        try:
            if token is None:
                return self._create(key, state, body)
            return self._update(key, state, body, _parse_token(token))
        except _UNREACHABLE as exc:
            raise self._unavailable(f"save {key!r}", exc) from None

    def _create(self, key: str, state: GroupState, body: str) -> bool:
        values = {
            "key": key,
            "version": 1,
            "kind": state.kind,
            "schema_version": state.schema_version,
            "body": body,
        }
        insert = pg_dialect.insert if self._is_postgres else sqlite_dialect.insert
        stmt = (
            insert(self._table)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["key"])
            .returning(self._table.c.version)
        )
        # RETURNING rather than rowcount: psycopg reports -1 for an INSERT ... ON CONFLICT under SQLAlchemy.
        with self._engine.connect() as conn:
            return conn.execute(stmt).scalar_one_or_none() is not None

    def _update(self, key: str, state: GroupState, body: str, version: int) -> bool:
        t = self._table
        stmt = (
            update(t)
            .where(
                t.c.key == key,
                t.c.version == version,
                t.c.kind == STATE_KIND,
                t.c.schema_version <= SCHEMA_VERSION,
            )
            .values(
                version=t.c.version + 1,
                kind=state.kind,
                schema_version=state.schema_version,
                body=body,
                updated_at=func.now(),
            )
            .returning(t.c.version)
        )
        with self._engine.connect() as conn:
            if conn.execute(stmt).scalar_one_or_none() is not None:
                return True
            current = conn.execute(select(t.c.version).where(t.c.key == key)).scalar_one_or_none()
            if current != version:
                return False
            # The version matched, so the row was refused for what it holds: say why, loudly, rather than
            # report a conflict that the caller would retry forever.
            stored = conn.execute(select(t.c.body).where(t.c.key == key)).scalar_one()
        decode_state(stored, where=self._where(key))
        raise ForeignStateError(
            f"{self._where(key)}: the row is marked as not a readable dagster-streamgroup state; "
            "refusing to overwrite it"
        )

    def now(self) -> float:
        if not self._is_postgres:
            return time.time()
        try:
            with self._engine.connect() as conn:
                value = conn.execute(select(func.extract("epoch", func.clock_timestamp()))).scalar_one()
        except _UNREACHABLE as exc:
            raise self._unavailable("read its clock", exc) from None
        return float(value)

    @functools.cached_property
    def _ranges(self) -> SqlRangeIndex:
        return SqlRangeIndex(
            self._engine, f"{self._table.name}_ranges", postgres=self._is_postgres, unavailable=self._unavailable
        )

    def record_ranges(
        self, key: str, ranges: Sequence[CommittedRange], floors: Mapping[str, int] | None = None
    ) -> None:
        """The committed-range index (``stores/ranges.py``), in table ``<table>_ranges``."""
        self._ranges.record_ranges(key, ranges, floors)

    def ranges_between(self, key: str, shard: str, start: int, end: int) -> list[tuple[int, int]]:
        return self._ranges.ranges_between(key, shard, start, end)

    def close(self) -> None:
        self._engine.dispose()


def _parse_token(token: StateToken) -> int:
    try:
        return int(token)
    except (TypeError, ValueError):
        raise StoreConfigError(
            f"token {token!r} is not a version issued by a SQL store (expected the string of an integer)"
        ) from None
