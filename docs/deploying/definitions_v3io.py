"""A production code location on an Iguazio v3io stream (docs/deploying.md): the group state is a KV item
next to the stream (no database to run), the access key is a mounted file, and the runs' Spark is a
cluster (``spark://`` standalone master, or ``yarn``/``k8s://`` where pyspark is set up for them).
"""

import os

import dagster as dg
from pyspark.sql import DataFrame

from dagster_streamgroup.dagster import StreamSparkResource, V3ioStreamGroup, stream_asset, stream_definitions


@stream_asset(group="clickstream", name="page_views")
def page_views(context: dg.AssetExecutionContext, df: DataFrame) -> None:
    """Views per page of the run's offset ranges, appended to the lake."""
    df.groupBy("key").count().write.mode("append").parquet(os.environ["CLICKSTREAM_OUTPUT"])


defs = stream_definitions(
    page_views,
    V3ioStreamGroup(
        group="clickstream",
        endpoint=dg.EnvVar("V3IO_API"),  # http://v3io-webapi:8081
        container="bigdata",
        stream_path="clicks",
        access_key_file=dg.EnvVar("V3IO_ACCESS_KEY_FILE"),  # /var/run/secrets/streamgroup/v3io-access-key
        store_url="v3io",
        heartbeat_interval_s=5,
        session_timeout_s=20,
    ),
    spark=StreamSparkResource(
        master=dg.EnvVar("SPARK_MASTER"),  # spark://spark-master:7077
        spark_config={"spark.executor.memory": "4g", "spark.executor.cores": "2"},
    ),
    members=3,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
