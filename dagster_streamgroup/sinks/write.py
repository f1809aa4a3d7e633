"""``write_ranges``: a run's rows into a sink in one call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field

from dagster_streamgroup.sinks.base import SinkResult, SinkRun
from dagster_streamgroup.sinks.coordinates import CoordinateColumns, ShardRange
from dagster_streamgroup.sinks.delta import DeltaSink
from dagster_streamgroup.sinks.kafka import KafkaTopicSink
from dagster_streamgroup.sinks.parquet import RangeFolderSink

Sink = Annotated[DeltaSink | KafkaTopicSink | RangeFolderSink, Field(discriminator="kind")]
"""Any sink, told apart by ``kind`` (``delta``, ``kafka``, ``parquet_ranges``): the Component's ``sink:``."""


def write_ranges(
    df: Any,
    ranges: Sequence[ShardRange],
    sink: DeltaSink | KafkaTopicSink | RangeFolderSink | None = None,
    *,
    table: str | None = None,
    partition_by: Sequence[str] = (),
    coordinates: CoordinateColumns | None = None,
    run: SinkRun | None = None,
) -> SinkResult:
    """Commit ``df``'s rows as the output of ``ranges`` (``ranges_of(context)``), replacing what earlier writes of
    those records left: into ``sink``, or into the Delta table ``table`` partitioned by ``partition_by``.

    ``df`` keeps each row's source coordinates (``topic``/``partition``/``offset``, or v3io's ``shard``/
    ``sequence_number``; other names through ``coordinates``)."""
    if sink is None:
        if table is None:
            raise ValueError("write_ranges: give a sink, or table= for a Delta table")
        sink = DeltaSink(table=table, partition_by=list(partition_by), coordinates=coordinates or CoordinateColumns())
    elif table is not None or partition_by or coordinates is not None:
        raise ValueError(
            "write_ranges: table, partition_by and coordinates describe a Delta table; the sink has its own"
        )
    return sink.write(df, ranges, run)
