"""One call that wires a stream asset, its member sensors and resources into ``Definitions``."""

from __future__ import annotations

from typing import Any

import dagster as dg

from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.assets import backfill_asset_of
from dagster_streamgroup.dagster.resources import StreamGroupResource
from dagster_streamgroup.dagster.sensors import member_sensors, stream_target
from dagster_streamgroup.dagster.spark_session import StreamSparkResource


def stream_definitions(
    asset: dg.AssetsDefinition,
    group: StreamGroupResource,
    *,
    spark: dg.ConfigurableResource[Any] | None = None,
    members: int = 3,
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED,
) -> dg.Definitions:
    """The asset and its backfill asset, ``members`` member sensors (ticking every ``group.heartbeat_interval_s``),
    the group and Spark resources, and the in-process executor (a range run is one step: no extra process per
    step)."""
    target = stream_target(asset)
    if group.group != target.group:
        raise ValueError(f"group: the resource is group {group.group!r}, the asset was built for {target.group!r}")
    spark_key = asset.metadata_by_key[asset.key].get(sgt.PREFIX + "spark_resource_key", "pyspark")
    assert isinstance(spark_key, str)
    return dg.Definitions(
        assets=[asset, *filter(None, [backfill_asset_of(asset)])],
        sensors=member_sensors(
            asset, members=members, heartbeat_interval_s=group.heartbeat_interval_s, default_status=default_status
        ),
        resources={target.resource_key: group, spark_key: spark or StreamSparkResource()},
        executor=dg.in_process_executor,
    )
