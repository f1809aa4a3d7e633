"""The example project: a clickstream consumed by three member sensors, aggregated with PySpark.

Start it with ``bash scripts/example.sh`` (``STREAM=v3io`` for the v3io stream); settings come from the
environment (jobs/settings.py). Only the group resource differs between the streams: the asset and the
sensors reach the stream through it.
"""

import dagster as dg

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupResource, StreamSparkResource, V3ioStreamGroup
from jobs import settings
from jobs.clickstream import ASSETS, SENSORS
from sensors.clickstream import clickstream_members


def streamgroup_resource() -> StreamGroupResource:
    if settings.STREAM == "v3io":
        return V3ioStreamGroup(
            group=settings.GROUP,
            endpoint=settings.V3IO_API,
            container=settings.V3IO_CONTAINER,
            stream_path=settings.V3IO_STREAM_PATH,
            access_key=dg.EnvVar(settings.V3IO_ACCESS_KEY_ENV),
            store_url=dg.EnvVar(settings.STORE_URL_ENV) if settings.STORE_URL_SET else settings.V3IO_STORE_URL,
            heartbeat_interval_s=settings.HEARTBEAT_S,
            session_timeout_s=settings.SESSION_TIMEOUT_S,
            drain_timeout_s=settings.DRAIN_TIMEOUT_S,
            max_records_per_run=settings.MAX_RECORDS_PER_RUN,
            run_mode=settings.RUN_MODE,
            min_backlog=settings.MIN_BACKLOG,
            max_wait_s=settings.MAX_WAIT_S,
            carry_on_s=settings.CARRY_ON_S,
        )
    return KafkaStreamGroup(
        group=settings.GROUP,
        bootstrap_servers=settings.BOOTSTRAP,
        topics=[settings.TOPIC],
        spark_reader=settings.SPARK_READER,
        store_url=dg.EnvVar(settings.STORE_URL_ENV) if settings.STORE_URL_SET else None,
        heartbeat_interval_s=settings.HEARTBEAT_S,
        session_timeout_s=settings.SESSION_TIMEOUT_S,
        drain_timeout_s=settings.DRAIN_TIMEOUT_S,
        max_records_per_run=settings.MAX_RECORDS_PER_RUN,
        run_mode=settings.RUN_MODE,
        min_backlog=settings.MIN_BACKLOG,
        max_wait_s=settings.MAX_WAIT_S,
        carry_on_s=settings.CARRY_ON_S,
        **typed_records(),
    )


def typed_records() -> dict[str, str]:
    """``CLICKSTREAM_FORMAT=avro``: the events are Avro under the Schema Registry, decoded into typed columns."""
    if settings.FORMAT == "avro":
        return {"value_format": "avro", "schema_registry_url": settings.SCHEMA_REGISTRY_URL}
    return {}


defs = dg.Definitions(
    assets=ASSETS,
    sensors=[*clickstream_members, *SENSORS],
    resources={
        "streamgroup": streamgroup_resource(),
        "pyspark": StreamSparkResource(master=settings.SPARK_MASTER, remote=settings.SPARK_REMOTE),
    },
    executor=dg.in_process_executor,
)
