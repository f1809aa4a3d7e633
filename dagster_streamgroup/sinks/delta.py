"""Delta Lake tables as sinks: each run replaces exactly the rows of its ranges in one atomic commit.

The table is written by delta-rs (the ``deltalake`` package), which commits a run's Arrow rows with a predicate
overwrite: one Delta commit that removes the rows matching the predicate (the run's ranges, by the rows' source
coordinates) and adds the run's rows. delta-rs checks the rows against the predicate (a row outside it fails the
write), and its conflict checker is Delta's optimistic concurrency: a commit that finds another writer's commit
ahead of it fails with ``CommitFailedError`` when the two touched the same files (concurrent delete/delete,
delete/read) or the other added rows its predicate covers; writers of disjoint ranges in separate files commit
side by side. A failed commit is written again on the new table version here, never dropped, so two members
writing one table never lose each other's commits.

Why delta-rs rather than Delta's own Spark writer: the project pins Spark 4.2.0 (the newest Spark whose Kafka
source Maven Central serves), and Maven Central serves no ``delta-spark`` jar for Spark 4.2 (``delta-spark_2.13``
stops at 4.0.0, for Spark 4.0; ``delta-spark_4.2_2.13`` is not there). docs/outputs.md has the measurements.

Each commit also records, per shard, the highest range end the table holds as a Delta application transaction
(``txn`` action, app id ``streamgroup:<shard>``): what Spark Structured Streaming records as ``txnAppId`` /
``txnVersion`` for its idempotent writes. Readers ask it with ``DeltaSink.table_offsets``; it is a record, not a
gate: a retried range is replaced, never skipped, so a run of a newer function version rewrites its rows.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from dagster_streamgroup.sinks.base import RangeSink, SinkResult, SinkRun, Stopwatch, backoff_s, to_arrow
from dagster_streamgroup.sinks.coordinates import (
    CoordinateColumns,
    ShardRange,
    check_columns,
    check_ranges,
    check_rows_in_ranges,
    range_predicate,
    source_kind,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

log = logging.getLogger(__name__)

OFFSETS_APP_PREFIX = "streamgroup:"
"""Application transactions ``streamgroup:<shard>`` hold the highest range end each shard's rows reach."""

_SECRET_OPTION = re.compile(r"(secret|password|token|credential|sas|key$|_key_|session)", re.IGNORECASE)
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


class DeltaSinkError(RuntimeError):
    """A Delta commit of a run's rows failed (the message names the table and the cause)."""


class DeltaSink(RangeSink):
    """A Delta Lake table that each run's rows go to, replacing exactly the rows of the run's ranges."""

    kind: Literal["delta"] = "delta"
    replaces_by_coordinates: ClassVar[bool] = True

    table: str = Field(
        description="The table: a local path (made absolute) or a URI delta-rs opens (s3://, abfss://, gs://...)."
    )
    partition_by: list[str] = Field(
        default_factory=list, description="Partition columns when the table is created (none: not partitioned)."
    )
    coordinates: CoordinateColumns = Field(
        default_factory=CoordinateColumns, description="The columns holding each row's source record."
    )
    configuration: dict[str, str] = Field(
        default_factory=dict,
        description="Table properties set when the table is created, e.g. delta.enableChangeDataFeed: 'true'.",
    )
    storage_options: dict[str, str] = Field(
        default_factory=dict,
        description="delta-rs object-store options (region, endpoint...). No credentials: delta-rs reads them "
        "from the environment (AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY, ...).",
    )
    schema_mode: Literal["merge"] | None = Field(
        default=None, description="merge: new columns of the rows are added to the table's schema."
    )
    target_file_size: int | None = Field(default=None, ge=1, description="Bytes per data file (delta-rs default).")
    max_attempts: int = Field(
        default=30, ge=1, description="Commits tried before the run fails when other writers keep committing first."
    )

    @field_validator("table")
    @classmethod
    def _absolute(cls, value: str) -> str:
        value = value.strip()
        if not value:
            raise ValueError("table: must name a table path or URI")
        # A {{ }} template (a Component's YAML, rendered later) is made absolute once rendered.
        if _URI.match(value) or "{{" in value:
            return value
        return str(Path(value).expanduser().resolve())

    @field_validator("partition_by")
    @classmethod
    def _partition_names(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"partition_by: a column is named twice in {value}")
        return value

    @field_validator("storage_options")
    @classmethod
    def _no_credentials(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if _SECRET_OPTION.search(key):
                raise ValueError(
                    f"storage_options: {key!r} holds a credential, and sink options are shown as given (the Dagster "
                    "UI, run metadata): set it in the environment of the code location and its runs, where delta-rs "
                    "reads it"
                )
        return value

    @model_validator(mode="after")
    def _coordinates_not_partitions(self) -> DeltaSink:
        offsets = {self.coordinates.offset, self.coordinates.sequence}
        clash = offsets & set(self.partition_by)
        if clash:
            raise ValueError(
                f"partition_by: {sorted(clash)} is a record's offset: one folder per record; partition by what "
                "readers filter on (a date, a key)"
            )
        return self

    def target(self) -> str:
        return self.table

    def _open(self) -> DeltaTable | None:
        from deltalake import DeltaTable

        if not DeltaTable.is_deltatable(self.table, storage_options=self.storage_options or None):
            return None
        return DeltaTable(self.table, storage_options=self.storage_options or None)

    def table_offsets(self, shards: Sequence[str]) -> dict[str, int]:
        """Per shard of ``shards``, the highest range end whose rows a commit of this sink put in the table
        (shards with none are left out; no table: empty)."""
        table = self._open()
        return {} if table is None else _offsets(table, shards)

    def write(self, df: Any, ranges: Sequence[ShardRange], run: SinkRun | None = None) -> SinkResult:
        clock = Stopwatch()
        check_ranges(ranges)
        if not ranges:
            return SinkResult(kind=self.kind, target=self.table, rows=0, ranges=0)
        kind = source_kind(ranges)
        what = f"delta sink {self.table}"
        data = to_arrow(df)
        check_columns(data, kind, self.coordinates, what)
        missing = [c for c in self.partition_by if c not in data.column_names]
        if missing:
            raise ValueError(f"{what}: partition_by names {missing}, which the rows lack")
        check_rows_in_ranges(data, ranges, kind, self.coordinates, what)
        data = _coordinates_first(data, self.coordinates.names(kind))
        predicate = range_predicate(ranges, kind, self.coordinates)
        if predicate == "false" and data.num_rows == 0:  # only empty ranges: nothing to replace, nothing to add
            return SinkResult(kind=self.kind, target=self.table, rows=0, ranges=len(ranges), seconds=clock.seconds)
        metadata = _commit_metadata(ranges, run)
        conflicts = 0
        for attempt in range(self.max_attempts):
            try:
                version = self._commit(data, predicate, ranges, metadata)
            except Exception as exc:
                if not _retryable(exc) or attempt + 1 == self.max_attempts:
                    raise DeltaSinkError(
                        f"{what}: the commit of {len(ranges)} range(s) failed after {attempt + 1} attempt(s): "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                conflicts += 1
                log.info("%s: a concurrent commit came first (%s); writing again on the new version", what, exc)
                time.sleep(backoff_s(attempt))
                continue
            return SinkResult(
                kind=self.kind,
                target=self.table,
                rows=data.num_rows,
                ranges=len(ranges),
                conflicts=conflicts,
                seconds=clock.seconds,
                version=version,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _commit(
        self, data: pa.Table, predicate: str, ranges: Sequence[ShardRange], metadata: dict[str, str]
    ) -> int | None:
        """One attempt: the replacement of the ranges' rows in one Delta commit, on the table's latest version.

        The per-shard offsets recorded are read from the same snapshot the commit is checked against: a
        concurrent commit that moved one of them (its app id in both) fails this one as a conflict, which is
        retried on the new version, so the recorded offsets never move backwards."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        table = self._open()
        written = [r for r in ranges if r.end > r.start]
        known = _offsets(table, [r.shard for r in written]) if table is not None else {}
        transactions = [
            Transaction(app_id=OFFSETS_APP_PREFIX + r.shard, version=max(r.end, known.get(r.shard, 0))) for r in written
        ]
        write_deltalake(
            table if table is not None else self.table,
            data,
            mode="overwrite",
            predicate=predicate,
            partition_by=self.partition_by or None,
            # Table properties at creation only: a metadata action in every commit would conflict with every
            # concurrent writer's commit.
            configuration=(self.configuration or None) if table is None else None,
            schema_mode=self.schema_mode,
            storage_options=self.storage_options or None,
            target_file_size=self.target_file_size,
            commit_properties=CommitProperties(custom_metadata=metadata, app_transactions=transactions or None),
        )
        if table is not None:
            return table.version()  # the snapshot the commit was made on, moved to the commit
        created = self._open()  # this write created the table, unless another writer did first
        return 0 if created is not None and created.version() == 0 else None


def _offsets(table: DeltaTable, shards: Sequence[str]) -> dict[str, int]:
    """The recorded range ends of ``shards`` (those with none are left out), from the table's snapshot."""
    out: dict[str, int] = {}
    for shard in shards:
        version = table.transaction_version(OFFSETS_APP_PREFIX + shard)
        if version is not None:
            out[shard] = int(version)
    return out


def _coordinates_first(data: pa.Table, names: Sequence[str]) -> pa.Table:
    """The coordinate columns first: delta-rs keeps min/max statistics of the first 32 columns, which let a
    range's replacement read only the files that may hold its rows."""
    rest = [c for c in data.column_names if c not in names]
    return data.select([*names, *rest])


def _commit_metadata(ranges: Sequence[ShardRange], run: SinkRun | None) -> dict[str, str]:
    """What each commit says about itself in the table's history (``DESCRIBE HISTORY``)."""
    metadata = {
        "streamgroup.ranges": json.dumps([[r.shard, r.start, r.end] for r in ranges]),
    }
    if run is not None:
        metadata["streamgroup.group"] = run.group
        if run.run_key is not None:
            metadata["streamgroup.run_key"] = run.run_key
        if run.member is not None:
            metadata["streamgroup.member"] = run.member
    return metadata


_RETRYABLE = (
    "version 0 already exists",  # two writers creating the table: the second writes again on the first's
    "a delta lake table already exists",
    "already exists at that location",
)


def _retryable(exc: BaseException) -> bool:
    """A commit another writer beat (delta-rs's ``CommitFailedError``: a conflict, or the version it wanted
    taken), or the table created by another writer between the look and the write."""
    from deltalake.exceptions import CommitFailedError

    if isinstance(exc, CommitFailedError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _RETRYABLE)
