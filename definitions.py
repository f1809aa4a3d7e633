"""The example project: a clickstream consumed by three member sensors, aggregated with PySpark.

Start it with ``bash scripts/example.sh``; settings come from the environment (jobs/settings.py).
"""

import dagster as dg

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamSparkResource
from jobs import settings
from jobs.clickstream import page_views_per_minute
from sensors.clickstream import clickstream_members

defs = dg.Definitions(
    assets=[page_views_per_minute],
    sensors=clickstream_members,
    resources={
        "streamgroup": KafkaStreamGroup(
            group=settings.GROUP,
            bootstrap_servers=settings.BOOTSTRAP,
            topics=[settings.TOPIC],
            heartbeat_interval_s=settings.HEARTBEAT_S,
            session_timeout_s=settings.SESSION_TIMEOUT_S,
            max_records_per_run=settings.MAX_RECORDS_PER_RUN,
        ),
        "pyspark": StreamSparkResource(master=settings.SPARK_MASTER, remote=settings.SPARK_REMOTE),
    },
    executor=dg.in_process_executor,
)
