"""The example project deployed with credentials, given as docs/kafka.md and docs/dagster.md say to give them.

The Kafka group is the example's own asset and member sensors (``jobs/``, ``sensors/``, settings from
``CLICKSTREAM_*``), its resource authenticating with SASL_SSL and SCRAM-SHA-512 (the password in a mounted file under
``$CLICKSTREAM_SECRET_PATH``, Nuclio's ``secretPath`` convention) and keeping its group state in PostgreSQL
(``store_url`` from ``dg.EnvVar``: the URL holds the password). The v3io group runs the example's aggregation
over a v3io stream, its key from ``dg.EnvVar("V3IO_ACCESS_KEY")`` and its state next to the stream. No secret
is a literal here: the code location holds variable names and a file name only. A third group, a Kafka group
on its own topic, is the component's: ``component_defs/clicks_yaml/defs.yaml``, its password ``{env: NAME}``.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import (
    KafkaStreamGroup,
    StreamSparkResource,
    V3ioStreamGroup,
    member_sensors,
    ranges_of,
    stream_asset,
    with_range_column,
)
from dagster_streamgroup.dagster.devserver import ROOT
from jobs import settings
from jobs.clickstream import EVENT_SCHEMA, page_views_per_minute, payload_column
from sensors.clickstream import clickstream_members
from tests.secrets.names import (
    SASL_PASSWORD_FILE,
    SASL_USERNAME,
    SECRET_PATH_ENV,
    SSL_CA_ENV,
    STORE_URL_ENV,
    V3IO_ASSET,
    V3IO_KEY_ENV,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

V3IO_GROUP = f"{settings.GROUP}_v3io"
V3IO_OUTPUT = settings.OUTPUT / "v3io"


@stream_asset(group=V3IO_GROUP, name=V3IO_ASSET, resource_key="streamgroup_v3io", kinds={"spark", "v3io", "parquet"})
def page_views_per_minute_v3io(context: dg.AssetExecutionContext, df: DataFrame) -> dict[str, Any]:
    """The example's views and distinct users per page and minute, over the v3io stream."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    events = with_range_column(df, ranges_of(context)).select(
        "range", F.from_json(F.col(payload_column(df)).cast("string"), EVENT_SCHEMA).alias("e")
    )
    per_minute = events.groupBy(
        "range", F.col("e.page").alias("page"), F.date_trunc("minute", F.timestamp_millis("e.ts")).alias("minute")
    ).agg(F.count(F.lit(1)).alias("views"), F.countDistinct("e.user").alias("users"))
    per_minute.write.mode("overwrite").option("partitionOverwriteMode", "dynamic").partitionBy("range").parquet(
        str(V3IO_OUTPUT)
    )
    return {"output": dg.MetadataValue.path(str(V3IO_OUTPUT))}


_policy: dict[str, Any] = {
    "heartbeat_interval_s": settings.HEARTBEAT_S,
    "session_timeout_s": settings.SESSION_TIMEOUT_S,
    "max_records_per_run": settings.MAX_RECORDS_PER_RUN,
    "run_mode": settings.RUN_MODE,
    "min_backlog": settings.MIN_BACKLOG,
    "max_wait_s": settings.MAX_WAIT_S,
}

python_defs = dg.Definitions(
    assets=[page_views_per_minute, page_views_per_minute_v3io],
    sensors=[
        *clickstream_members,
        *member_sensors(
            page_views_per_minute_v3io,
            members=settings.MEMBERS,
            heartbeat_interval_s=settings.HEARTBEAT_S,
            default_status=dg.DefaultSensorStatus.RUNNING,
        ),
    ],
    resources={
        "streamgroup": KafkaStreamGroup(
            group=settings.GROUP,
            bootstrap_servers=settings.BOOTSTRAP,
            topics=[settings.TOPIC],
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username=SASL_USERNAME,
            ssl_ca_location=os.environ.get(SSL_CA_ENV),
            secret_path=dg.EnvVar(SECRET_PATH_ENV),
            sasl_password_file=SASL_PASSWORD_FILE,
            store_url=dg.EnvVar(STORE_URL_ENV),
            # A failed range becomes a dead letter at once: its error message is then kept in the group state,
            # shown by `streamgroup status` and the no_parked_ranges check, where the search looks for secrets.
            max_attempts=1,
            after_max_attempts="dead_letter",
            **_policy,
        ),
        "streamgroup_v3io": V3ioStreamGroup(
            group=V3IO_GROUP,
            endpoint=settings.V3IO_API,
            container=settings.V3IO_CONTAINER,
            stream_path=settings.V3IO_STREAM_PATH,
            access_key=dg.EnvVar(V3IO_KEY_ENV),
            store_url="v3io",
            **_policy,
        ),
        "pyspark": StreamSparkResource(master=settings.SPARK_MASTER, remote=settings.SPARK_REMOTE),
    },
    executor=dg.in_process_executor,
)

component_defs = dg.load_defs(defs_root=importlib.import_module("tests.secrets.component_defs"), project_root=ROOT)
defs = dg.Definitions.merge(python_defs, component_defs)
del python_defs, component_defs  # Dagster loads a module with exactly one Definitions at module scope
