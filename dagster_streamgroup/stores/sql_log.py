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

Each log row carries a random ``write_id`` and the ``previous_id`` of the row it follows, and an append is valid
only while row ``v`` is still the one its writer built on. Without them, a row deleted by hand would let two
writers each write a version of that number, one on the state before it and one on the deleted row, and a
reader would apply the second's change to the first's state: one state made of two histories. With them, the
writer that built on the deleted row is refused and reads the state again, and a reader that finds rows which
do not follow one another (one missing, one from another history, one that cannot be read) refuses the state
with ``StateDamagedError`` instead of reading an older one. What cannot be seen is the newest row deleted: the
state reads as one write earlier, a lost write (docs/stores.md).

The store remembers the last state it loaded or wrote per key, so a member reads only the rows appended since
(Pravega's state synchronizer keeps a revisioned copy the same way).

A base row written by an earlier version of this store (schema below 3, no log) is first rewritten whole at
the current schema, as that version would: a member of the earlier version then refuses the state instead of
updating a base row that the log has moved past. Nothing is appended to such a row.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    CompoundSelect,
    MetaData,
    Row,
    Table,
    Text,
    and_,
    case,
    delete,
    exists,
    inspect,
    literal,
    null,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import CreateTable

from dagster_streamgroup.protocol import delta
from dagster_streamgroup.protocol.codec import (
    ForeignStateError,
    NewerSchemaError,
    StateFormatError,
    decode_state,
    encode_state,
)
from dagster_streamgroup.protocol.state import SCHEMA_VERSION, STATE_KIND, GroupState
from dagster_streamgroup.stores.base import StateDamagedError, StateToken, StoreUnavailableError, reason
from dagster_streamgroup.stores.sql import _UNREACHABLE, DEFAULT_TABLE, SqlStateStore, _parse_token

FOLD_FRACTION = 2.0
"""Fold the log into the base row once the rows appended since weigh this much of the state: the fold rewrites
the whole state, so this bounds what folding adds to each write (half its size here), while a reader that
knows nothing of the key reads at most three states' worth."""
MIN_FOLD_BYTES = 64_000
"""... and at least this much: a small state is cheap to read with its log."""
MAX_GAP_RETRIES = 3


def log_table(name: str) -> Table:
    """``write_id``/``previous_id`` chain the rows (NULL in rows written before they existed: not checked)."""
    return Table(
        name,
        MetaData(),
        Column("key", Text, primary_key=True),
        Column("version", BigInteger, primary_key=True),
        Column("body", Text, nullable=False),
        Column("write_id", Text, nullable=True),
        Column("previous_id", Text, nullable=True),
    )


CHAIN_COLUMNS = ("write_id", "previous_id")


def new_write_id() -> str:
    return secrets.token_hex(8)


@dataclass
class _Known:
    """What this store last saw of a key: the state at ``version``, and the base row it was built on."""

    version: int
    state: GroupState
    base_version: int
    appended_bytes: int
    """Bytes of the log rows after the base row."""
    state_bytes: int
    write_id: str | None = None
    """The id of the log row holding ``version`` (None: no row holds it, or one written without an id)."""


class _GapError(Exception):
    """The log rows this reader got do not continue the state it holds (folded meanwhile, or not ours).

    ``damage`` says what is wrong when the rows came from one snapshot and no copy of this store's was involved:
    then it is not a race but rows deleted, replaced or damaged."""

    def __init__(self, damage: str = "") -> None:
        super().__init__(damage)
        self.damage = damage


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
        self._add_chain_columns()

    def _add_chain_columns(self) -> None:
        """Add the chain's columns to a log table made before they existed (members may race to: a failure is
        fine when the columns exist afterwards)."""
        try:
            present = {c["name"] for c in inspect(self._engine).get_columns(self._log.name)}
        except DBAPIError:
            return  # unreachable: the first load says so
        for column in CHAIN_COLUMNS:
            if column in present:
                continue
            try:
                with self._engine.connect() as conn:
                    conn.execute(text(f'ALTER TABLE "{self._log.name}" ADD COLUMN {column} TEXT'))
            except DBAPIError:
                present = {c["name"] for c in inspect(self._engine).get_columns(self._log.name)}
                if column not in present:
                    raise

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
            except _GapError as gap:
                with self._lock:
                    self._known.pop(key, None)
                if gap.damage:
                    raise self._damaged(key, gap.damage) from None
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
        """The state as of now: the base row (or this store's copy, while the base row is not past it), and the
        log rows after it, each following the one before (ids) and continuing the state so far (revisions).
        Rows that do not are a race while this store's copy was involved (read again without it), else damage."""
        with self._lock:
            cached = self._known.get(key)
        with self._engine.connect() as conn:
            rows = conn.execute(self._snapshot(key, cached)).all()
        if not rows:
            return None
        base, logged = rows[0], rows[1:]
        if base.body is None:  # the base row is one this store's copy already holds
            assert cached is not None
            state, version, write_id = cached.state, cached.version, cached.write_id
            appended = cached.appended_bytes if cached.base_version == base.version else 0
            state_bytes = cached.state_bytes
            at_start = logged[0] if logged and logged[0].version == version else None
            if (at_start.write_id if at_start is not None else None) != write_id:
                raise _GapError()  # the row this copy holds was replaced or deleted: read from the base row
            from_base = False
        else:
            state = self._decoded_base(key, base.body)
            version, appended, state_bytes = int(base.version), 0, len(base.body)
            write_id = next((row.write_id for row in logged if row.version == version), None)
            from_base = True
        for row in logged:
            if row.version <= version:
                continue  # the row the state read so far ends at (its id is taken above)
            if row.version != version + 1:
                missing = f"log row version {version + 1} is missing (the next row is {row.version})"
                raise _GapError(missing if from_base else "")
            if row.previous_id is not None and write_id is not None and row.previous_id != write_id:
                raise _GapError(f"log row version {row.version} does not follow the row before it" if from_base else "")
            state = self._applied(key, state, row, from_base)
            version, write_id = int(row.version), row.write_id
            appended += len(row.body)
        known = _Known(version, state, int(base.version), appended, state_bytes, write_id)
        with self._lock:
            self._known[key] = known
        return known

    def _decoded_base(self, key: str, body: str) -> GroupState:
        """The base row's state. The row is marked as ours (the snapshot checks ``kind``), so a body that
        cannot be read is damage, not a foreign object."""
        try:
            return decode_state(body, where=self._where(key))
        except NewerSchemaError:
            raise
        except StateFormatError as exc:
            raise self._damaged(key, f"the base row cannot be read ({reason(exc)})") from exc

    def _damaged(self, key: str, what: str) -> StateDamagedError:
        t = self._table.name
        return StateDamagedError(
            f"{self._where(key)}: {what}; reading on would roll the group back to an older state, so the store is "
            f"refusing to read or write it. Restore the row, or delete the key's rows from {t} and {t}_log: the "
            "group then starts again from the offsets mirrored in the stream, and ranges committed since the last "
            "mirror run again"
        )

    def _snapshot(self, key: str, cached: _Known | None) -> CompoundSelect[Any]:
        """The base row and the log rows from the state to start from, in one statement (one snapshot).

        The base row's body is left out (NULL) when ``cached`` holds a state at or after it, built on it or an
        earlier base: then only the row holding ``cached`` (to check it is still the one) and those after it
        are read."""
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
        no_id = null()
        base = select(
            literal(0).label("part"), t.c.version, body.label("body"), no_id.label("write_id"),
            no_id.label("previous_id"),
        ).where(t.c.key == key)  # fmt: skip
        after = (
            select(literal(1), log.c.version, log.c.body, log.c.write_id, log.c.previous_id)
            .join_from(log, t, t.c.key == log.c.key)
            .where(log.c.key == key, log.c.version >= start)  # from the row holding the start, for its id
        )
        both = union_all(base, after)
        return both.order_by(both.selected_columns.part, both.selected_columns.version)

    def _applied(self, key: str, state: GroupState, row: Row[Any], from_base: bool) -> GroupState:
        """``state`` with the change of log ``row`` applied. On a read from the base row (``from_base``) a row
        that does not continue the state is damage; on one from this store's copy, a race."""
        try:
            raw = json.loads(row.body)
            if "state" in raw:
                return decode_state(json.dumps(raw["state"]), where=self._where(key))
            change = delta.StateDelta.model_validate(raw["delta"])
        except NewerSchemaError:
            raise
        except Exception as exc:  # a row written by a newer version, or damaged
            raise self._damaged(key, f"log row version {row.version} cannot be read ({exc})") from exc
        if state.revision != change.base_revision:
            raise _GapError(f"log row version {row.version} does not continue the state before it" if from_base else "")
        return delta.apply(state, change)

    # -- writing --------------------------------------------------------------------------------

    def save_if(self, key: str, state: GroupState, token: StateToken | None) -> bool:
        try:
            if token is None:
                body = encode_state(state)
                self._drop_orphaned_rows(key)
                created = self._create(key, state, body)
                if created:
                    self.bytes_written += len(body)
                    with self._lock:
                        self._known[key] = _Known(1, state, 1, 0, len(body))
                return created
            return self._append(key, state, _parse_token(token))
        except _UNREACHABLE as exc:
            raise self._unavailable(f"save {key!r}", exc) from None

    def _drop_orphaned_rows(self, key: str) -> None:
        """Delete log rows left by a base row that is gone (a lost state: deleted by hand, or its database
        restored without it), which would otherwise stand in the way of the new state's rows. Only while there
        is no base row, in one statement: a writer of a new state cannot have inserted rows yet."""
        t, log = self._table, self._log
        with self._engine.connect() as conn:
            conn.execute(delete(log).where(log.c.key == key, ~exists(select(t.c.key).where(t.c.key == key))))

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
        write_id = new_write_id()
        if not self._insert_after(key, version, body, write_id, known.write_id):
            self._refuse_if_not_ours(key)
            return False
        self.bytes_written += len(body)
        appended = known.appended_bytes + len(body)
        with self._lock:
            self._known[key] = _Known(version + 1, state, known.base_version, appended, known.state_bytes, write_id)
        if self.should_fold(appended, known.state_bytes):
            self._fold(key, state, version + 1, known.base_version, write_id)
        return True

    def _insert_after(self, key: str, version: int, body: str, write_id: str, previous_id: str | None) -> bool:
        """Insert log row ``version + 1`` if no one has, the base row is ours, of this schema, and not yet past
        ``version`` (see the module docstring: a fold may have deleted a row ``version + 1`` already), and row
        ``version`` is still the one this writer built on (``previous_id``; None: no row holds it with an id)."""
        t, log = self._table, self._log
        base = select(t.c.key).where(
            t.c.key == key,
            t.c.version <= version,
            t.c.kind == STATE_KIND,
            t.c.schema_version == SCHEMA_VERSION,
        )
        holding = (log.c.key == key) & (log.c.version == version)
        if previous_id is None:
            built_on = ~exists(select(log.c.key).where(holding, log.c.write_id.is_not(None)))
        else:
            built_on = exists(select(log.c.key).where(holding, log.c.write_id == previous_id))
        insert = pg_dialect.insert if self._is_postgres else sqlite_dialect.insert
        row = select(
            literal(key), literal(version + 1, BigInteger), literal(body), literal(write_id), literal(previous_id, Text)
        )
        stmt = (
            insert(log)
            .from_select(
                ["key", "version", "body", "write_id", "previous_id"],
                row.where(base.with_for_update(read=True).exists(), built_on),
            )
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

    def _fold(self, key: str, state: GroupState, version: int, previous_base: int, write_id: str) -> None:
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
            self._known[key] = _Known(version, state, version, 0, len(body), write_id)

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
