"""The Dagster surface: group resources, member sensors, the stream asset, checks, backfill helpers, components."""

from dagster_streamgroup.dagster.assets import (
    CommitRefusedError,
    StreamRange,
    backfill_asset_of,
    freshness_windows,
    range_of,
    ranges_of,
    sink_replaces_by_coordinates,
    stream_asset,
    stream_freshness_policy,
)
from dagster_streamgroup.dagster.checks import LAG_CHECK, PARKED_CHECK
from dagster_streamgroup.dagster.component import (
    KafkaStreamGroupComponent,
    StreamGroupComponent,
    V3ioStreamGroupComponent,
)
from dagster_streamgroup.dagster.definitions import stream_definitions
from dagster_streamgroup.dagster.output import range_key, with_range_column
from dagster_streamgroup.dagster.resources import (
    KafkaStreamGroup,
    StreamGroupConfigError,
    StreamGroupResource,
    V3ioStreamGroup,
)
from dagster_streamgroup.dagster.sensors import member_sensor_names, member_sensors
from dagster_streamgroup.dagster.spark_session import StreamSparkResource
from dagster_streamgroup.spark.session import prepare_environment as prepare_spark_environment

__all__ = [
    "LAG_CHECK",
    "PARKED_CHECK",
    "CommitRefusedError",
    "KafkaStreamGroup",
    "KafkaStreamGroupComponent",
    "StreamGroupComponent",
    "StreamGroupConfigError",
    "StreamGroupResource",
    "StreamRange",
    "StreamSparkResource",
    "V3ioStreamGroup",
    "V3ioStreamGroupComponent",
    "backfill_asset_of",
    "freshness_windows",
    "member_sensor_names",
    "member_sensors",
    "prepare_spark_environment",
    "range_key",
    "range_of",
    "ranges_of",
    "sink_replaces_by_coordinates",
    "stream_asset",
    "stream_definitions",
    "stream_freshness_policy",
    "with_range_column",
]
