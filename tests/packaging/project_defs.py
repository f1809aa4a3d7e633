"""A stream asset as a user adds it to a project ``create-dagster project`` made: copied by ``tests.packaging.wheel``
into ``src/<project>/defs/clicks.py``, and loaded by Dagster's ``load_from_defs_folder`` like any defs module.

The broker comes from the environment (``CLICKS_BOOTSTRAP``): the test starts one on a free port. The group
launches a run as soon as one record waits (``min_backlog=1``, no ``max_wait_s``), so a small sample is read at
the first tick that owns its partitions.
"""

from __future__ import annotations

import os
from typing import Any

import dagster as dg

from dagster_streamgroup.dagster import (
    KafkaStreamGroup,
    StreamSparkResource,
    ranges_of,
    stream_asset,
    stream_definitions,
)

GROUP = "new_project_clicks"


@stream_asset(group=GROUP, name="clicks_per_page")
def clicks_per_page(context: dg.AssetExecutionContext, df: Any) -> dict[str, Any]:
    """Clicks per page over the run's ranges (a real project would write them somewhere, idempotently per range)."""
    from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

    pages = df.select(F.get_json_object(F.col("value").cast("string"), "$.page").alias("page"))
    counts = {row["page"]: row["count"] for row in pages.groupBy("page").count().collect()}
    context.log.info(f"{sum(counts.values())} clicks over {', '.join(r.shard for r in ranges_of(context))}")
    return {"pages": dg.MetadataValue.int(len(counts)), "clicks": dg.MetadataValue.int(sum(counts.values()))}


defs = stream_definitions(
    clicks_per_page,
    KafkaStreamGroup(
        group=GROUP,
        bootstrap_servers=os.environ.get("CLICKS_BOOTSTRAP", "127.0.0.1:9092"),
        topics=[os.environ.get("CLICKS_TOPIC", "clicks")],
        heartbeat_interval_s=5,
        join_grace_s=0,
        min_backlog=1,
        max_wait_s=0,
    ),
    spark=StreamSparkResource(master="local[1]"),
    members=1,
)
