"""Typed records in Spark: the options that carry a run's formats to the readers' tasks, the typed schema the
sources declare, the ``spark-kafka`` reader's decode step, and the run's accounting of what decoded.

Decoding runs where the records are read (``formats.decoder`` in the ``streamgroup-kafka`` and ``streamgroup-v3io``
sources' tasks, or over Spark's own Kafka source through ``mapInArrow``), and never drops a record: each row carries
``decodeError``. ``DecodedRecords`` applies the run's ``on_decode_error`` on top: the stream function gets the
decoded rows (and, under ``null``, the bad ones with a null value), while the function's first action also counts,
per shard, the records read, the bad ones and the first bad one (``DataFrame.observe``: no pass of its own).
``settle`` then says what the run commits: under ``fail`` a bad record parks its range, under ``dead_letter`` its
coordinates, raw bytes and error become a dead letter, and a record whose writer schema the reader cannot resolve
parks its range under any policy. Every record of a range is accounted for:
decoded + dead-lettered + nulled = the records the range holds.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from dagster_streamgroup.formats.config import DecodeErrorPolicy, FormatConfig
from dagster_streamgroup.formats.decoder import (
    ERROR_COLUMN,
    KEY_ID_COLUMN,
    UNRESOLVABLE,
    VALUE_ID_COLUMN,
    Readers,
    RecordDecoder,
    raw_bytes_text,
)
from dagster_streamgroup.formats.registry import REGISTRY_UNAVAILABLE_MARK, SchemaSource

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

RAW_KEY_COLUMN = "rawKey"
RAW_VALUE_COLUMN = "rawValue"
KEEP_RAW_OPTION = "keepRawOfErrors"
MAX_DEAD_RECORDS = 100
"""Bad records of one range whose raw bytes a dead letter keeps (all are counted; the rest stay in the log)."""


def decode_options(config: FormatConfig, readers: Readers, *, keep_raw: bool = False) -> dict[str, str]:
    """The source options of a typed read: the formats (secrets under redacted names), the run's reader schemas
    and the writer schemas this process holds (the tasks then ask the registry only for ids nobody has seen)."""
    options = config.to_options()
    options["readers"] = readers.to_json()
    if config.registry is not None:
        options["writerSchemas"] = json.dumps(SchemaSource(config.registry).export())
    if keep_raw:
        options[KEEP_RAW_OPTION] = "true"
    return options


def decoder_from_options(
    options: Mapping[str, str], *, value_column: str = "value", key_column: str | None = "key"
) -> RecordDecoder | None:
    """The decoder a task builds from its source's options (``None``: a read of raw bytes)."""
    lowered = {key.lower(): value for key, value in options.items()}
    if "formats" not in lowered or "readers" not in lowered:
        return None
    config = FormatConfig.from_options(options)
    readers = Readers.from_json(lowered["readers"])
    writers = json.loads(lowered.get("writerschemas", "{}"))
    return RecordDecoder(readers, config, value_column=value_column, key_column=key_column, writer_schemas=writers)


def keeps_raw(options: Mapping[str, str]) -> bool:
    return {k.lower(): v for k, v in options.items()}.get(KEEP_RAW_OPTION.lower()) == "true"


def typed_arrow_schema(decoder: RecordDecoder, base: pa.Schema, *, keep_raw: bool = False) -> pa.Schema:
    schema = decoder.output_schema(base)
    if keep_raw:
        schema = schema.append(pa.field(RAW_VALUE_COLUMN, pa.binary()))
        if decoder.key is not None:
            schema = schema.append(pa.field(RAW_KEY_COLUMN, pa.binary()))
    return schema


def spark_schema(arrow_schema: pa.Schema) -> StructType:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(arrow_schema)


def decode_batches(
    decoder: RecordDecoder, batches: Iterator[pa.RecordBatch], *, keep_raw: bool = False
) -> Iterator[pa.RecordBatch]:
    """Each raw batch decoded (with the raw key and value of its bad records, when asked)."""
    for batch in batches:
        decoded = decoder(batch)
        if keep_raw:
            decoded = _with_raw(decoder, batch, decoded)
        yield decoded


def _with_raw(decoder: RecordDecoder, raw: pa.RecordBatch, decoded: pa.RecordBatch) -> pa.RecordBatch:
    import pyarrow.compute as pc

    bad = pc.is_valid(decoded.column(ERROR_COLUMN))
    columns = [*decoded.columns, pc.if_else(bad, raw.column(decoder.value_column), pa.scalar(None, pa.binary()))]
    names = [*decoded.schema.names, RAW_VALUE_COLUMN]
    if decoder.key is not None and decoder.key_column is not None:
        columns.append(pc.if_else(bad, raw.column(decoder.key_column), pa.scalar(None, pa.binary())))
        names.append(RAW_KEY_COLUMN)
    return pa.RecordBatch.from_arrays(columns, names=names)


def decode_dataframe(df: DataFrame, options: Mapping[str, str]) -> DataFrame:
    """A DataFrame of Spark's Kafka schema decoded as the ``streamgroup-kafka`` source decodes it (``mapInArrow``:
    the same decoder, so both readers give the same typed rows)."""
    decoder = decoder_from_options(options)
    if decoder is None:
        return df
    keep_raw = keeps_raw(options)
    from dagster_streamgroup.streams.kafka import KAFKA_ARROW_SCHEMA

    schema = spark_schema(typed_arrow_schema(decoder, KAFKA_ARROW_SCHEMA, keep_raw=keep_raw))
    shipped = dict(options)

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        task_decoder = decoder_from_options(shipped)
        assert task_decoder is not None
        for batch in batches:
            columns = [batch.column(f.name).cast(f.type) for f in KAFKA_ARROW_SCHEMA]
            raw = pa.RecordBatch.from_arrays(columns, schema=KAFKA_ARROW_SCHEMA)
            yield from decode_batches(task_decoder, iter([raw]), keep_raw=keep_raw)

    return df.mapInArrow(decode, schema)


# -- the run's accounting ------------------------------------------------------------------------------------------


class DecodeParkError(Exception):
    """Ranges that must stop: parked at once, without retries (a retry would meet the same records)."""

    def __init__(self, parked: Mapping[str, str]) -> None:
        self.parked = dict(parked)
        super().__init__("; ".join(f"{shard}: {reason}" for shard, reason in sorted(self.parked.items())))


def registry_unavailable(exc: BaseException) -> bool:
    """Whether a run failed because the registry could not be asked (in the driver or in a task)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if REGISTRY_UNAVAILABLE_MARK in str(current):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


@dataclass(frozen=True)
class DeadRecordDraft:
    offset: int
    error: str
    key: str | None
    value: str | None


@dataclass(frozen=True)
class ShardDecode:
    """What became of one shard's records in a wave."""

    records: int
    decoded: int
    dead_lettered: int
    nulled: int
    dead_records: tuple[DeadRecordDraft, ...] = ()


@dataclass(frozen=True)
class DecodeOutcome:
    shards: dict[str, ShardDecode] = field(default_factory=dict)
    writer_ids: frozenset[int] = frozenset()


class DecodedRecords:
    """The decoded DataFrame a stream function gets, and what its first action saw of each shard's records."""

    def __init__(
        self,
        source: DataFrame,
        conditions: Mapping[str, Column],
        policy: DecodeErrorPolicy,
        offset_column: str,
        read_again: Callable[[Mapping[str, tuple[int, int]]], DataFrame],
        ranges: Mapping[str, tuple[int, int]],
        registry: SchemaSource | None = None,
    ) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        self._source = source
        self._policy = policy
        self._offset = offset_column
        self._read_again = read_again
        self._ranges = dict(ranges)
        self._registry = registry
        self._names = {shard: i for i, shard in enumerate(conditions)}
        bad = F.col(ERROR_COLUMN).isNotNull()
        unresolvable = bad & F.col(ERROR_COLUMN).contains(UNRESOLVABLE)
        exprs = []
        for shard, condition in conditions.items():
            i = self._names[shard]
            exprs += [
                F.count_if(condition).alias(f"records_{i}"),
                F.count_if(condition & bad).alias(f"bad_{i}"),
                F.min(F.when(condition & bad, F.struct(F.col(offset_column), F.col(ERROR_COLUMN)))).alias(f"first_{i}"),
                F.min(F.when(condition & unresolvable, F.struct(F.col(offset_column), F.col(ERROR_COLUMN)))).alias(
                    f"unresolvable_{i}"
                ),
            ]
        exprs.append(F.collect_set(F.col(VALUE_ID_COLUMN)).alias("value_ids"))
        if KEY_ID_COLUMN in source.columns:
            exprs.append(F.collect_set(F.col(KEY_ID_COLUMN)).alias("key_ids"))
        self._exprs = exprs
        self._observation = Observation(f"streamgroup_decode_{uuid.uuid4().hex}")
        self._cached: dict[str, Any] | None = None
        observed = source.observe(self._observation, *exprs)
        self.df = observed if policy is DecodeErrorPolicy.NULL else observed.filter(F.col(ERROR_COLUMN).isNull())

    def _metrics(self) -> dict[str, Any]:
        if self._cached is not None:
            return self._cached
        observation: Any = self._observation
        java = getattr(observation, "_jo", None)
        if java is not None:
            metrics = dict(observation.get) if java.future().isCompleted() else None
        else:
            metrics = dict(observation.get) or None
        # A pass of our own when the function ran no action over its DataFrame, or when its action ran the plan
        # more than once (a global sort samples the data in a job of its own, and the metrics add up both runs):
        # more records than a range holds.
        if metrics is None or any(
            int(metrics.get(f"records_{i}") or 0) > end - start
            for shard, i in self._names.items()
            for start, end in [self._ranges[shard]]
        ):
            metrics = self._source.agg(*self._exprs).collect()[0].asDict(recursive=False)
        self._cached = metrics
        return metrics

    def counts(self) -> dict[str, int]:
        metrics = self._metrics()
        return {shard: int(metrics.get(f"records_{i}") or 0) for shard, i in self._names.items()}

    def settle(self) -> DecodeOutcome:
        """What the wave commits: each shard's accounting and dead letters; ``DecodeParkError`` for the shards
        whose range must stop."""
        metrics = self._metrics()
        parked: dict[str, str] = {}
        shards: dict[str, ShardDecode] = {}
        dead_shards: list[str] = []
        for shard, i in self._names.items():
            records = int(metrics.get(f"records_{i}") or 0)
            bad = int(metrics.get(f"bad_{i}") or 0)
            unresolvable = metrics.get(f"unresolvable_{i}")
            first = metrics.get(f"first_{i}")
            if unresolvable is not None:
                offset, error = _pair(unresolvable)
                parked[shard] = f"offset {offset}: {error}"
            elif bad and self._policy is DecodeErrorPolicy.FAIL:
                offset, error = _pair(first)
                parked[shard] = (
                    f"{bad} of {records} records could not be decoded (on_decode_error: fail); the first, at offset "
                    f"{offset}: {error}"
                )
            if bad and self._policy is DecodeErrorPolicy.DEAD_LETTER:
                dead_shards.append(shard)
            shards[shard] = ShardDecode(
                records=records,
                decoded=records - bad,
                dead_lettered=bad if self._policy is DecodeErrorPolicy.DEAD_LETTER else 0,
                nulled=bad if self._policy is DecodeErrorPolicy.NULL else 0,
            )
        if parked:
            raise DecodeParkError(parked)
        ids = {int(v) for v in (metrics.get("value_ids") or [])} | {int(v) for v in (metrics.get("key_ids") or [])}
        if self._registry is not None:
            for schema_id in ids:  # held for the next waves' tasks (an outage then costs nothing)
                try:
                    self._registry.by_id(schema_id)
                except Exception:  # a warm-up: the tasks ask again when they need it
                    continue
        if dead_shards:
            drafts = self._dead_records(dead_shards)
            for shard in dead_shards:
                shards[shard] = ShardDecode(**{**shards[shard].__dict__, "dead_records": tuple(drafts.get(shard, ()))})
        return DecodeOutcome(shards, frozenset(ids))

    def _dead_records(self, shards: list[str]) -> dict[str, list[DeadRecordDraft]]:
        """The first bad records of each shard with their raw bytes: the shards' ranges read again (only when a
        range held bad records), keeping the raw key and value of the bad ones."""
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        out: dict[str, list[DeadRecordDraft]] = {}
        for shard in shards:
            again = self._read_again({shard: self._ranges[shard]})
            rows = again.filter(F.col(ERROR_COLUMN).isNotNull()).orderBy(self._offset).limit(MAX_DEAD_RECORDS)
            for row in rows.collect():
                data = row.asDict(recursive=False)
                out.setdefault(shard, []).append(
                    DeadRecordDraft(
                        offset=int(data[self._offset]),
                        error=str(data[ERROR_COLUMN])[:1000],
                        key=raw_bytes_text(data.get(RAW_KEY_COLUMN)),
                        value=raw_bytes_text(data.get(RAW_VALUE_COLUMN)),
                    )
                )
        return out


def _pair(value: Any) -> tuple[Any, Any]:
    if value is None:
        return None, None
    if hasattr(value, "asDict"):
        data = list(value.asDict().values())
        return data[0], data[1]
    return value[0], value[1]
