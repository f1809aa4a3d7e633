"""Outputs that replace exactly a range's rows in one atomic commit: Delta tables, Kafka topics, Parquet folders.

A stream asset hands its rows to a sink, which commits them before the run commits its ranges into the group
state (``sinks/base.py`` says why the order is the guarantee). ``write_ranges`` is the one call; a stream asset
can also declare its sink (``stream_asset(..., sink=DeltaSink(...))``) and return its DataFrame. docs/outputs.md
compares the sinks with each other and with the peers' sinks.
"""

from dagster_streamgroup.sinks.base import RangeSink, SinkResult, SinkRun, to_arrow
from dagster_streamgroup.sinks.coordinates import CoordinateColumns, SinkColumnsError
from dagster_streamgroup.sinks.delta import DeltaSink, DeltaSinkError
from dagster_streamgroup.sinks.kafka import SOURCE_HEADER, KafkaSinkError, KafkaSinkFencedError, KafkaTopicSink
from dagster_streamgroup.sinks.parquet import RangeFolderSink, range_key, with_range_column
from dagster_streamgroup.sinks.write import Sink, write_ranges

__all__ = [
    "SOURCE_HEADER",
    "CoordinateColumns",
    "DeltaSink",
    "DeltaSinkError",
    "KafkaSinkError",
    "KafkaSinkFencedError",
    "KafkaTopicSink",
    "RangeFolderSink",
    "RangeSink",
    "Sink",
    "SinkColumnsError",
    "SinkResult",
    "SinkRun",
    "range_key",
    "to_arrow",
    "with_range_column",
    "write_ranges",
]
