"""The committed-range index of the SQL store (``stores/ranges.py``): table ``<state table>_ranges``.

One row per committed range, primary key ``(key, shard, range_end)``: the ranges over a span are one range scan of
that key and the first row past it, however long the shard's history. A record of new ranges is one transaction:
delete what they overlap (and what fell below retention), insert them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from sqlalchemy import BigInteger, Column, Connection, Engine, MetaData, Table, Text, and_, delete, or_, select
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.schema import CreateTable

from dagster_streamgroup.stores.base import StoreUnavailableError
from dagster_streamgroup.stores.ranges import CommittedRange, overlapping, spans

INSERT_ROWS = 1000
"""Rows per INSERT statement (SQLite allows 32,766 bound parameters a statement)."""


def ranges_table(name: str) -> Table:
    return Table(
        name,
        MetaData(),
        Column("key", Text, primary_key=True),
        Column("shard", Text, primary_key=True),
        Column("range_end", BigInteger, primary_key=True),
        Column("range_start", BigInteger, nullable=False),
    )


class SqlRangeIndex:
    """The index in ``table`` of ``engine``'s database (created on first use)."""

    def __init__(
        self,
        engine: Engine,
        table: str,
        *,
        postgres: bool,
        unavailable: Callable[[str, DBAPIError], StoreUnavailableError],
    ) -> None:
        self._engine = engine
        self._table = ranges_table(table)
        self._postgres = postgres
        self._unavailable = unavailable
        self._created = False

    def _ensure_table(self) -> None:
        if not self._created:
            try:
                with self._engine.connect() as conn:
                    conn.execute(CreateTable(self._table, if_not_exists=True))
            except DBAPIError:
                pass  # created by a concurrent writer (PostgreSQL can race on IF NOT EXISTS); the next statement says
            self._created = True

    @contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """One transaction: the store's engine autocommits each statement, a record is several."""
        self._ensure_table()
        level = "READ COMMITTED" if self._postgres else "SERIALIZABLE"
        with self._engine.connect() as plain:
            conn = plain.execution_options(isolation_level=level)
            with conn.begin():
                yield conn

    def record_ranges(
        self, key: str, ranges: Sequence[CommittedRange], floors: Mapping[str, int] | None = None
    ) -> None:
        t = self._table
        gone = [and_(t.c.shard == shard, t.c.range_end > lo, t.c.range_start < hi) for shard, lo, hi in spans(ranges)]
        gone += [and_(t.c.shard == shard, t.c.range_end <= floor) for shard, floor in (floors or {}).items()]
        rows = [{"key": key, "shard": s, "range_end": e, "range_start": b} for s, b, e in ranges]
        insert = pg_dialect.insert if self._postgres else sqlite_dialect.insert
        try:
            with self._transaction() as conn:
                if gone:
                    conn.execute(delete(t).where(t.c.key == key, or_(*gone)))
                for at in range(0, len(rows), INSERT_ROWS):
                    stmt = insert(t).values(rows[at : at + INSERT_ROWS])
                    conn.execute(
                        stmt.on_conflict_do_update(
                            index_elements=["key", "shard", "range_end"],
                            set_={"range_start": stmt.excluded.range_start},
                        )
                    )
        except (OperationalError, InterfaceError) as exc:
            raise self._unavailable(f"record committed ranges of {key!r}", exc) from exc

    def ranges_between(self, key: str, shard: str, start: int, end: int) -> list[tuple[int, int]]:
        t = self._table
        of_shard = (t.c.key == key, t.c.shard == shard)
        within = select(t.c.range_start, t.c.range_end).where(*of_shard, t.c.range_end > start, t.c.range_end <= end)
        after = (
            select(t.c.range_start, t.c.range_end)
            .where(*of_shard, t.c.range_end > end)
            .order_by(t.c.range_end)
            .limit(1)
        )
        try:
            self._ensure_table()
            with self._engine.connect() as conn:
                rows = [*conn.execute(within).all(), *conn.execute(after).all()]
        except (OperationalError, InterfaceError) as exc:
            raise self._unavailable(f"read committed ranges of {key!r}", exc) from exc
        return sorted(overlapping([(int(r.range_start), int(r.range_end)) for r in rows], start, end))
