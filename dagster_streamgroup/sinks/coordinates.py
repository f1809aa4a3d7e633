"""Which columns of a sink's rows hold each row's source record, and the rows of a run's ranges in those terms.

A sink replaces exactly a range's rows because every row names the record it came from: Kafka's ``topic``,
``partition`` and ``offset`` (Spark's Kafka schema), or v3io's ``shard`` and ``sequence_number``. A retry, a
handover or a backfill of a range then deletes the rows whose coordinates fall in that range, whatever the
bounds of the earlier run that wrote them, so a record's rows are never kept twice and a neighbouring range's
never touched. Rows are 1:n per record (a filter drops some, an explode makes several); aggregates across
records belong downstream, computed from these rows (the example's ``page_views_per_minute``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    import pyarrow as pa

SourceKind = Literal["kafka", "v3io"]

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class ShardRange(Protocol):
    """A range as runs hold them (``StreamRange``, ``RangeSpec``): the records ``start <= offset < end``."""

    @property
    def shard(self) -> str: ...

    @property
    def start(self) -> int: ...

    @property
    def end(self) -> int: ...


class CoordinateColumns(BaseModel):
    """The columns of the rows a sink writes that name each row's source record, by their names in the
    DataFrame handed to the sink (and so in the table). Kafka: ``topic``, ``partition``, ``offset`` by default,
    as Spark's Kafka schema names them; v3io: ``shard`` and ``sequence_number``. Rename them in the DataFrame
    (``withColumnRenamed``) and name them here to keep other names in the table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str = Field(default="topic", description="Kafka: the source topic's column (string).")
    partition: str = Field(default="partition", description="Kafka: the source partition's column (integer).")
    offset: str = Field(default="offset", description="Kafka: the source offset's column (integer).")
    shard: str = Field(default="shard", description="v3io: the source shard's column (integer).")
    sequence: str = Field(default="sequence_number", description="v3io: the source sequence number's column.")

    @model_validator(mode="after")
    def _check_names(self) -> CoordinateColumns:
        for name, value in self.model_dump().items():
            if not _IDENTIFIER.match(value):
                raise ValueError(f"{name}: {value!r} is not a column name (letters, digits, underscores)")
        kafka = (self.topic, self.partition, self.offset)
        if len(set(kafka)) != len(kafka) or self.shard == self.sequence:
            raise ValueError("coordinate columns: each must have a name of its own")
        return self

    def names(self, kind: SourceKind) -> tuple[str, ...]:
        """The coordinate columns of a source kind: the shard's, then the offset's."""
        return (self.topic, self.partition, self.offset) if kind == "kafka" else (self.shard, self.sequence)

    def offset_column(self, kind: SourceKind) -> str:
        return self.offset if kind == "kafka" else self.sequence


def source_kind(ranges: Sequence[ShardRange]) -> SourceKind:
    """Kafka shards are ``topic:partition``, v3io shards their number: one kind per run."""
    kinds: set[SourceKind] = {"v3io" if r.shard.isdigit() else "kafka" for r in ranges}
    if len(kinds) != 1:
        raise ValueError(f"ranges: expected the shards of one stream, got {sorted(r.shard for r in ranges)}")
    kind = kinds.pop()
    if kind == "kafka":
        for r in ranges:
            topic, sep, partition = r.shard.rpartition(":")
            if not sep or not topic or not partition.isdigit():
                raise ValueError(f"ranges: shard {r.shard!r} is neither '<topic>:<partition>' nor a v3io shard number")
    return kind


def check_ranges(ranges: Sequence[ShardRange]) -> None:
    """One range per shard, each ``start <= end``: what a run holds."""
    seen: set[str] = set()
    for r in ranges:
        if r.start < 0 or r.end < r.start:
            raise ValueError(f"ranges: {r.shard} [{r.start}, {r.end}) is not an offset range")
        if r.shard in seen:
            raise ValueError(f"ranges: shard {r.shard} appears twice (a run holds one range per shard)")
        seen.add(r.shard)


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _quoted(column: str) -> str:
    return f'"{column}"'


def shard_condition(shard: str, kind: SourceKind, columns: CoordinateColumns) -> str:
    """SQL for the rows of one shard (delta-rs predicates are DataFusion SQL; names quoted: ``offset`` is a
    keyword)."""
    if kind == "kafka":
        topic, _, partition = shard.rpartition(":")
        return f"{_quoted(columns.topic)} = {_sql_string(topic)} AND {_quoted(columns.partition)} = {int(partition)}"
    return f"{_quoted(columns.shard)} = {int(shard)}"


def range_predicate(ranges: Sequence[ShardRange], kind: SourceKind, columns: CoordinateColumns) -> str:
    """SQL that holds for exactly the rows of ``ranges``: what a run's commit deletes before it adds its rows.
    A range with no offsets (``start == end``) holds no row and is left out."""
    offset = _quoted(columns.offset_column(kind))
    parts = [
        f"({shard_condition(r.shard, kind, columns)} AND {offset} >= {int(r.start)} AND {offset} < {int(r.end)})"
        for r in sorted(ranges, key=lambda r: r.shard)
        if r.end > r.start
    ]
    return " OR ".join(parts) if parts else "false"


def shard_keys(table: pa.Table, kind: SourceKind, columns: CoordinateColumns) -> pa.Array:
    """Each row's shard id as the protocol writes it (``topic:partition``, or the v3io shard number)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if kind == "kafka":
        partitions = pc.cast(table.column(columns.partition), pa.string())
        return pc.binary_join_element_wise(pc.cast(table.column(columns.topic), pa.string()), partitions, ":")
    return pc.cast(table.column(columns.shard), pa.string())


def rows_in_ranges(
    table: pa.Table, ranges: Iterable[ShardRange], kind: SourceKind, columns: CoordinateColumns
) -> pa.Array:
    """A boolean mask: which rows fall in one of ``ranges``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    shards = shard_keys(table, kind, columns)
    offsets = table.column(columns.offset_column(kind))
    mask = pa.array([False] * table.num_rows, pa.bool_())
    for r in ranges:
        inside = pc.and_(
            pc.equal(shards, r.shard),
            pc.and_(pc.greater_equal(offsets, r.start), pc.less(offsets, r.end)),
        )
        mask = pc.or_(mask, pc.fill_null(inside, False))
    return mask


def check_columns(table: pa.Table, kind: SourceKind, columns: CoordinateColumns, what: str) -> None:
    """The coordinate columns are there, with no null: a row that names no record could never be replaced."""
    missing = [c for c in columns.names(kind) if c not in table.column_names]
    if missing:
        raise SinkColumnsError(
            f"{what}: the rows lack the coordinate column(s) {', '.join(missing)} of their source records "
            f"(have: {', '.join(table.column_names)}); keep them from the run's DataFrame, or name yours in "
            "coordinates"
        )
    for name in columns.names(kind):
        nulls = table.column(name).null_count
        if nulls:
            raise SinkColumnsError(f"{what}: {nulls} row(s) have no {name}: each row must name its source record")


def check_rows_in_ranges(
    table: pa.Table, ranges: Sequence[ShardRange], kind: SourceKind, columns: CoordinateColumns, what: str
) -> None:
    """Every row belongs to one of the run's ranges: a row of another range would be written where no commit
    of its own range could find and replace it."""
    import pyarrow.compute as pc

    inside = rows_in_ranges(table, ranges, kind, columns)
    outside = table.num_rows - int(pc.sum(pc.cast(inside, "int64")).as_py() or 0)
    if outside:
        first = table.filter(pc.invert(inside)).slice(0, 1).select(list(columns.names(kind))).to_pylist()[0]
        raise SinkColumnsError(
            f"{what}: {outside} row(s) lie outside the run's ranges (first: {first}; ranges: "
            f"{', '.join(f'{r.shard} [{r.start}, {r.end})' for r in ranges)}): a sink writes only rows of its run's "
            "records"
        )


class SinkColumnsError(ValueError):
    """The rows handed to a sink cannot be tied to their source records (the message says which column)."""
