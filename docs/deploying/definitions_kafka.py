"""A production code location on Kafka (docs/deploying.md): a SASL_SSL topic, the group state in a
PostgreSQL database that the members of every deployment share, the runs on a Spark Connect endpoint.

Nothing here is a secret or an address: each comes from the environment of the code location's server and of
its runs, where the platform puts it (a Kubernetes Secret through ``env_secrets``, Docker's ``env_vars``).
"""

import os

import dagster as dg
from pyspark.sql import DataFrame

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamSparkResource, stream_asset, stream_definitions


@stream_asset(group="clickstream", name="page_views")
def page_views(context: dg.AssetExecutionContext, df: DataFrame) -> None:
    """Views per page of the run's offset ranges, appended to the lake."""
    df.groupBy("key").count().write.mode("append").parquet(os.environ["CLICKSTREAM_OUTPUT"])


defs = stream_definitions(
    page_views,
    KafkaStreamGroup(
        group="clickstream",
        bootstrap_servers=dg.EnvVar("KAFKA_BOOTSTRAP_SERVERS"),
        topics=["clicks"],
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username=dg.EnvVar("KAFKA_SASL_USERNAME"),
        sasl_password=dg.EnvVar("KAFKA_SASL_PASSWORD"),
        # postgresql+psycopg://USER:PASSWORD@HOST:5432/DB: one database for the members of every deployment.
        store_url=dg.EnvVar("STREAMGROUP_STORE_URL"),
        heartbeat_interval_s=5,
        session_timeout_s=20,
    ),
    spark=StreamSparkResource(remote=dg.EnvVar("SPARK_REMOTE")),  # sc://spark-connect:15002
    members=3,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
