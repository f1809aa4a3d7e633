"""The SQL state store as a log: each write appends what it changed; the whole state is written now and then.

At 200 members x 10,000 shards the state is megabytes while a tick changes a heartbeat and a few shards:
rewriting the whole object on every tick of every member is most of a store's load. So a write appends one
row to ``<table>_log`` at version ``v + 1``: the ``StateDelta`` from the version the writer loaded
(``protocol/delta.py``), or the whole state when no delta joins them. Once the appended rows outweigh twice the
state, the writer folds them into the base row (``version``, ``body``), and deletes the rows the previous fold
had already covered.

The compare-and-set of a write is its insert of row ``v + 1``, valid only while the base row is still at or
below ``v`` (and is ours, of this schema): one statement that checks the base row and inserts the log row. The
``(key, version)`` primary key alone is not enough: a fold deletes the rows the previous base covered, so a
writer that loaded ``v`` and paused while others folded twice would find row ``v + 1`` gone and insert it, a
write no reader ever sees (the base is already past it). On PostgreSQL the check locks the base row
(``FOR SHARE``): a fold waits for the insert, and an insert that waited for a fold reads the base row that fold
wrote. On SQLite the statement holds the database's write lock.

A read takes the base row and the log rows after it in one statement, so from one snapshot: read in two, a fold
between them would pair a base body with rows it already holds. A delta applies only to the revision it was
computed from, so rows that do not continue the state a reader holds send it back to the base row.

The store remembers the last state it loaded or wrote per key, so a member reads only the rows appended since
(Pravega's state synchronizer keeps a revisioned copy the same way).

A base row written by an earlier version of this store (schema below 3, no log) is first rewritten whole at
the current schema, as that version would: a member of the earlier version then refuses the state instead of
updating a base row that the log has moved past. Nothing is appended to such a row.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    CompoundSelect,
    MetaData,
    Table,
    Text,
    and_,
    case,
    delete,
    literal,
    null,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateTable

from dagster_streamgroup.protocol import delta
from dagster_streamgroup.protocol.codec import ForeignStateError, decode_state, encode_state
from dagster_streamgroup.protocol.state import SCHEMA_VERSION, STATE_KIND, GroupState
from dagster_streamgroup.stores.base import StateToken, StoreUnavailableError
from dagster_streamgroup.stores.sql import _UNREACHABLE, DEFAULT_TABLE, SqlStateStore, _parse_token

FOLD_FRACTION = 2.0
"""Fold the log into the base row once the rows appended since weigh this much of the state: the fold rewrites
the whole state, so this bounds what folding adds to each write (half its size here), while a reader that
knows nothing of the key reads at most three states' worth."""
MIN_FOLD_BYTES = 64_000
"""... and at least this much: a small state is cheap to read with its log."""
MAX_GAP_RETRIES = 3


def log_table(name: str) -> Table:
    return Table(
        name,
        MetaData(),
        Column("key", Text, primary_key=True),
        Column("version", BigInteger, primary_key=True),
        Column("body", Text, nullable=False),
    )


@dataclass
class _Known:
    """What this store last saw of a key: the state at ``version``, and the base row it was built on."""

    version: int
    state: GroupState
    base_version: int
    appended_bytes: int
    """Bytes of the log rows after the base row."""
    state_bytes: int


class _GapError(Exception):
    """The log rows this reader got do not continue the state it holds (folded meanwhile, or not ours)."""


class LoggedSqlStateStore(SqlStateStore):
    """``SqlStateStore`` whose writes append deltas (see the module docstring).

    ``min_fold_bytes`` and ``fold_fraction`` set when this store folds (``None``: the module's ``MIN_FOLD_BYTES``
    and ``FOLD_FRACTION``); tests and ``bench.store_linearizability`` fold often to race writers against folds."""

    def __init__(
        self,
        url: str,
        *,
        table: str = DEFAULT_TABLE,
        min_fold_bytes: int | None = None,
        fold_fraction: float | None = None,
    ) -> None:
        self._log = log_table(f"{table}_log")
        self._known: dict[str, _Known] = {}
        self._lock = threading.Lock()
        self.min_fold_bytes = min_fold_bytes
        self.fold_fraction = fold_fraction
        self.bytes_written = 0
        """Bytes of state and delta bodies this store wrote (what its writes cost the database)."""
        self.folds = 0
        """Folds this store wrote."""
        super().__init__(url, table=table)

    def __repr__(self) -> str:
        return f"LoggedSqlStateStore({self.url!r}, table={self._table.name!r})"

    def _ensure_table(self) -> None:
        super()._ensure_table()
        try:
            with self._engine.connect() as conn:
                conn.execute(CreateTable(self._log, if_not_exists=True))
        except DBAPIError:
            pass  # created by a concurrent member, or unreachable: the first load says which

    def should_fold(self, appended_bytes: int, state_bytes: int) -> bool:
        """Whether the log rows after the base row (``appended_bytes``) are worth rewriting the state for."""
        least = MIN_FOLD_BYTES if self.min_fold_bytes is None else self.min_fold_bytes
        fraction = FOLD_FRACTION if self.fold_fraction is None else self.fold_fraction
        return appended_bytes >= max(least, fraction * state_bytes)

    # -- reading --------------------------------------------------------------------------------

    def load(self, key: str) -> tuple[GroupState | None, StateToken | None]:
        for _ in range(MAX_GAP_RETRIES):
            try:
                known = self._read(key)
            except _GapError:
                with self._lock:
                    self._known.pop(key, None)
                continue
            except _UNREACHABLE as exc:
                raise self._unavailable(f"load {key!r}", exc) from None
            if known is None:
                return None, None
            return known.state, str(known.version)
        raise StoreUnavailableError(
            f"state store {self.url}: cannot load {key!r}: its log did not continue its base row in any of "
            f"{MAX_GAP_RETRIES} reads"
        )

    def _read(self, key: str) -> _Known | None:
        with self._lock:
            cached = self._known.get(key)
        with self._engine.connect() as conn:
            rows = conn.execute(self._snapshot(key, cached)).all()
        if not rows:
            return None
        base, logged = rows[0], rows[1:]
        if base.body is None:  # the base row is one this store's copy already holds
            assert cached is not None
            state, version = cached.state, cached.version
            appended = cached.appended_bytes if cached.base_version == base.version else 0
            state_bytes = cached.state_bytes
        else:
            state = decode_state(base.body, where=self._where(key))
            version, appended, state_bytes = int(base.version), 0, len(base.body)
        for row in logged:
            if row.version != version + 1:
                raise _GapError()
            state = self._applied(key, state, row.body)
            version = int(row.version)
            appended += len(row.body)
        known = _Known(version, state, int(base.version), appended, state_bytes)
        with self._lock:
            self._known[key] = known
        return known

    def _snapshot(self, key: str, cached: _Known | None) -> CompoundSelect[int, int, str | None]:
        """The base row and the log rows after the state to start from, in one statement (one snapshot).

        The base row's body is left out (NULL) when ``cached`` holds a state at or after it, built on it or an
        earlier base: then only the rows after ``cached`` are read."""
        t, log = self._table, self._log
        body: ColumnElement[str | None] = t.c.body
        start: ColumnElement[int] = t.c.version
        if cached is not None:
            usable = and_(
                t.c.version >= cached.base_version,
                t.c.version <= cached.version,
                t.c.kind == STATE_KIND,
                t.c.schema_version <= SCHEMA_VERSION,
            )
            body = case((usable, null()), else_=t.c.body)
            start = case((usable, literal(cached.version, BigInteger)), else_=t.c.version)
        base = select(literal(0).label("part"), t.c.version, body.label("body")).where(t.c.key == key)
        after = (
            select(literal(1), log.c.version, log.c.body)
            .join_from(log, t, t.c.key == log.c.key)
            .where(log.c.key == key, log.c.version > start)
        )
        both = union_all(base, after)
        return both.order_by(both.selected_columns.part, both.selected_columns.version)

    def _applied(self, key: str, state: GroupState, body: str) -> GroupState:
        raw = json.loads(body)
        if "state" in raw:
            return decode_state(json.dumps(raw["state"]), where=self._where(key))
        try:
            change = delta.StateDelta.model_validate(raw["delta"])
        except Exception as exc:  # a row written by a newer version, or damaged
            raise ForeignStateError(
                f"{self._where(key)}: a logged change cannot be read ({exc}); refusing to write"
            ) from exc
        if state.revision != change.base_revision:
            raise _GapError()
        return delta.apply(state, change)

    # -- writing --------------------------------------------------------------------------------

    def save_if(self, key: str, state: GroupState, token: StateToken | None) -> bool:
        try:
            if token is None:
                body = encode_state(state)
                created = self._create(key, state, body)
                if created:
                    self.bytes_written += len(body)
                    with self._lock:
                        self._known[key] = _Known(1, state, 1, 0, len(body))
                return created
            return self._append(key, state, _parse_token(token))
        except _UNREACHABLE as exc:
            raise self._unavailable(f"save {key!r}", exc) from None

    def _append(self, key: str, state: GroupState, version: int) -> bool:
        with self._lock:
            known = self._known.get(key)
        if known is None or known.version != version:
            try:
                self._read(key)
            except _GapError:
                return False
            with self._lock:
                known = self._known.get(key)
            if known is None or known.version != version:
                return False  # the state moved on since the token was issued
        if self._base_is_old(key):
            return self._rewrite_base(key, state, version)
        body = self._log_body(known.state, state)
        if not self._insert_after(key, version, body):
            self._refuse_if_not_ours(key)
            return False
        self.bytes_written += len(body)
        appended = known.appended_bytes + len(body)
        with self._lock:
            self._known[key] = _Known(version + 1, state, known.base_version, appended, known.state_bytes)
        if self.should_fold(appended, known.state_bytes):
            self._fold(key, state, version + 1, known.base_version)
        return True

    def _insert_after(self, key: str, version: int, body: str) -> bool:
        """Insert log row ``version + 1`` if no one has, and the base row is ours, of this schema, and not yet
        past ``version`` (see the module docstring: a fold may have deleted a row ``version + 1`` already)."""
        t, log = self._table, self._log
        base = select(t.c.key).where(
            t.c.key == key,
            t.c.version <= version,
            t.c.kind == STATE_KIND,
            t.c.schema_version == SCHEMA_VERSION,
        )
        insert = pg_dialect.insert if self._is_postgres else sqlite_dialect.insert
        row = select(literal(key), literal(version + 1, BigInteger), literal(body))
        stmt = (
            insert(log)
            .from_select(["key", "version", "body"], row.where(base.with_for_update(read=True).exists()))
            .on_conflict_do_nothing(index_elements=["key", "version"])
            .returning(log.c.version)
        )
        with self._engine.connect() as conn:
            return conn.execute(stmt).scalar_one_or_none() is not None

    @staticmethod
    def _log_body(before: GroupState, after: GroupState) -> str:
        try:
            change = delta.diff(before, after)
        except ValueError:  # another group's state, or shards removed: no delta joins them
            return json.dumps({"state": json.loads(encode_state(after))}, separators=(",", ":"))
        return '{"delta":' + delta.encode_delta(change) + "}"

    def _base_is_old(self, key: str) -> bool:
        t = self._table
        with self._engine.connect() as conn:
            schema = conn.execute(select(t.c.schema_version).where(t.c.key == key)).scalar_one_or_none()
        return schema is not None and schema < SCHEMA_VERSION

    def _rewrite_base(self, key: str, state: GroupState, version: int) -> bool:
        body = encode_state(state)
        written = self._update(key, state, body, version)
        if written:
            self.bytes_written += len(body)
            with self._lock:
                self._known[key] = _Known(version + 1, state, version + 1, 0, len(body))
        return written

    def _fold(self, key: str, state: GroupState, version: int, previous_base: int) -> None:
        """Write the state at ``version`` as the base row, then drop the rows the previous base covered.

        Conditional on the base row still being the one this writer built on, so of two members folding at
        once only one writes; a fold that loses changes nothing but costs nothing either. The rows it drops
        are below the base row a writer must still find to insert (``_insert_after``), so none comes back."""
        t, log = self._table, self._log
        body = encode_state(state)
        stmt = (
            update(t)
            .where(t.c.key == key, t.c.version == previous_base, t.c.kind == STATE_KIND)
            .values(version=version, schema_version=state.schema_version, body=body)
            .returning(t.c.version)
        )
        with self._engine.connect() as conn:
            if conn.execute(stmt).scalar_one_or_none() is None:
                return
            conn.execute(delete(log).where(log.c.key == key, log.c.version <= previous_base))
        self.bytes_written += len(body)
        self.folds += 1
        with self._lock:
            self._known[key] = _Known(version, state, version, 0, len(body))

    def _refuse_if_not_ours(self, key: str) -> None:
        """A refused append is a conflict, unless the base row is not a state this version may build on."""
        t = self._table
        with self._engine.connect() as conn:
            row = conn.execute(select(t.c.kind, t.c.schema_version, t.c.body).where(t.c.key == key)).one_or_none()
        if row is None or (row.kind == STATE_KIND and row.schema_version <= SCHEMA_VERSION):
            return
        decode_state(row.body, where=self._where(key))
        raise ForeignStateError(
            f"{self._where(key)}: the row is marked as not a readable dagster-streamgroup state; "
            "refusing to overwrite it"
        )
