"""The example's settings, from the environment so scripts/example.sh and the end-to-end test share them.

``CLICKSTREAM_STREAM`` picks the stream: ``kafka`` (default; a topic on ``CLICKSTREAM_BOOTSTRAP``) or ``v3io``
(a stream on the v3io web API ``CLICKSTREAM_V3IO_API``, group state kept next to it). A bad value stops the
code location from loading with the variable's name, instead of surfacing later as a failing sensor tick.
The v3io access key is read from ``V3IO_ACCESS_KEY`` by the resource itself (``dagster.EnvVar``), so its
value never enters the Dagster run or resource configuration.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import ValidationError

from dagster_streamgroup.streams.v3io_config import ACCESS_KEY_ENV, V3ioStreamConfig, check_group


class SettingsError(ValueError):
    """An example setting is invalid; the message names the environment variable."""


def _text(name: str, default: str) -> str:
    value = os.environ.get(name, default).strip()
    if not value:
        raise SettingsError(f"{name}: must not be empty")
    return value


def _number(name: str, default: str, *, minimum: float, integer: bool) -> float:
    text = _text(name, default)
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise SettingsError(f"{name}: must be {kind}, got {text!r}") from None
    if value < minimum:
        raise SettingsError(f"{name}: must be >= {minimum:g}, got {text!r}")
    return value


def _int(name: str, default: str, minimum: int = 1) -> int:
    return int(_number(name, default, minimum=minimum, integer=True))


def _float(name: str, default: str, minimum: float) -> float:
    return _number(name, default, minimum=minimum, integer=False)


def _choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    value = _text(name, default).lower()
    if value not in choices:
        raise SettingsError(f"{name}: must be one of {', '.join(choices)}, got {value!r}")
    return value


STREAMS = ("kafka", "v3io")
STREAM = _choice("CLICKSTREAM_STREAM", "kafka", STREAMS)
GROUP = _text("CLICKSTREAM_GROUP", "clickstream")
PARTITIONS = _int("CLICKSTREAM_PARTITIONS", "8")
"""Partitions of the Kafka topic, or shards of the v3io stream, that the producer creates."""
MEMBERS = _int("CLICKSTREAM_MEMBERS", "3")
HEARTBEAT_S = _float("CLICKSTREAM_HEARTBEAT_S", "5", minimum=1)  # Dagster ticks a sensor at most once a second
SESSION_TIMEOUT_S = _float("CLICKSTREAM_SESSION_TIMEOUT_S", "20", minimum=1)
DRAIN_TIMEOUT_S = _float("CLICKSTREAM_DRAIN_TIMEOUT_S", "600", minimum=1)
"""How long the shard of a member that died with a run in flight waits for that run (the resource's
``drain_timeout_s``). Members of another deployment cannot see whether that run is still alive, so a whole
deployment that dies holds its in-flight shards this long (docs/deploying.md)."""
STORE_URL_ENV = "CLICKSTREAM_STORE_URL"
STORE_URL_SET = bool(os.environ.get(STORE_URL_ENV, "").strip())
"""Whether the group state lives at ``$CLICKSTREAM_STORE_URL`` (e.g. ``postgresql://...``, for members in
several deployments) instead of the default (SQLite in ``$DAGSTER_HOME``; the KV item next to a v3io stream).
The resource reads it as ``dagster.EnvVar``, so a password in it never becomes a literal of the definitions."""
MAX_RECORDS_PER_RUN = _int("CLICKSTREAM_MAX_RECORDS_PER_RUN", "1000000")
RUN_MODE = _choice("CLICKSTREAM_RUN_MODE", "member", ("member", "shard"))
MIN_BACKLOG = _int("CLICKSTREAM_MIN_BACKLOG", "20000")
MAX_WAIT_S = _float("CLICKSTREAM_MAX_WAIT_S", "15", minimum=0)
CARRY_ON_S = _float("CLICKSTREAM_CARRY_ON_S", "60", minimum=0)
"""How long a member's run keeps taking its shards' next ranges (the resource's ``carry_on_s``; 0: a run per
wave of ranges)."""
OUTPUT = Path(_text("CLICKSTREAM_OUTPUT", "output/clickstream")).resolve()
SINK = _choice("CLICKSTREAM_SINK", "parquet", ("parquet", "delta"))
"""Where the stream asset's output goes. ``parquet``: page views per range, page and minute, one Parquet folder per
range under ``OUTPUT`` (sinks.RangeFolderSink's layout). ``delta``: each click's row, keeping its source
coordinates, in the Delta table ``OUTPUT/clicks`` (sinks.DeltaSink), and page views per minute, kept correct as
ranges land, in ``OUTPUT/page_views_per_minute`` by a downstream asset (scripts/example.sh uses this one)."""
CLICKS_TABLE = OUTPUT / "clicks"
VIEWS_TABLE = OUTPUT / "page_views_per_minute"
SPARK_MASTER = _text("CLICKSTREAM_SPARK_MASTER", "local[2]")
SPARK_REMOTE = os.environ.get("CLICKSTREAM_SPARK_REMOTE", "").strip() or None

FORMATS = ("json", "avro")
FORMAT = _choice("CLICKSTREAM_FORMAT", "json", FORMATS)
"""How the events are encoded: ``json`` text, or ``avro`` in the Confluent wire format with the schema in the Schema
Registry at ``CLICKSTREAM_SCHEMA_REGISTRY_URL`` (Kafka only): the group then hands the function typed columns."""
SCHEMA_REGISTRY_URL = _text("CLICKSTREAM_SCHEMA_REGISTRY_URL", "http://127.0.0.1:8085/apis/ccompat/v7")

# Kafka
BOOTSTRAP = _text("CLICKSTREAM_BOOTSTRAP", "127.0.0.1:9092")
TOPIC = _text("CLICKSTREAM_TOPIC", "clicks")
SPARK_READER = _choice("CLICKSTREAM_SPARK_READER", "python", ("auto", "spark-kafka", "python"))
"""How the runs read their ranges (the Kafka group resource's ``spark_reader``)."""

# v3io
V3IO_API = _text("CLICKSTREAM_V3IO_API", "http://127.0.0.1:8081")
V3IO_CONTAINER = _text("CLICKSTREAM_V3IO_CONTAINER", "bigdata")
V3IO_STREAM_PATH = _text("CLICKSTREAM_V3IO_STREAM_PATH", "clicks")
V3IO_ACCESS_KEY_ENV = ACCESS_KEY_ENV
"""The variable the access key is read from, at tick and run time (never a literal in the definitions)."""
V3IO_STORE_URL = "v3io"
"""The group state lives as a KV item next to the stream, so nothing but the v3io API is needed."""

_V3IO_VARIABLES = {
    "endpoint": "CLICKSTREAM_V3IO_API",
    "container": "CLICKSTREAM_V3IO_CONTAINER",
    "stream_path": "CLICKSTREAM_V3IO_STREAM_PATH",
}


def _check_v3io() -> None:
    """The v3io values as the resource will check them, but with the variable names in the message."""
    try:
        check_group(GROUP)
    except ValueError as exc:
        raise SettingsError(f"CLICKSTREAM_GROUP: {exc}") from None
    try:
        V3ioStreamConfig(endpoint=V3IO_API, container=V3IO_CONTAINER, stream_path=V3IO_STREAM_PATH)
    except ValidationError as exc:
        problems = [
            f"{_V3IO_VARIABLES.get(str(e['loc'][0]), 'CLICKSTREAM_V3IO') if e['loc'] else 'CLICKSTREAM_V3IO'}: "
            f"{e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors(include_input=False, include_url=False)
        ]
        raise SettingsError("; ".join(problems)) from None
    if not os.environ.get(V3IO_ACCESS_KEY_ENV, "").strip():
        raise SettingsError(f"{V3IO_ACCESS_KEY_ENV}: must hold the v3io access key when CLICKSTREAM_STREAM=v3io")


if STREAM == "v3io":
    _check_v3io()
    if FORMAT != "json":
        raise SettingsError("CLICKSTREAM_FORMAT: the example's v3io stream carries json events")
