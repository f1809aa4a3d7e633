"""A second code location of the secrets test: one Kafka group whose state store URL, from ``dg.EnvVar``, is a
libpq keyword DSN holding the state role's password (``host=... password=...``), a form no store opens.

The variable is set when the location loads, so the URL is refused then: the location fails to load with one
error naming ``store_url`` and the variable, shown without the password (``password=***``). Before, the URL was
checked only in each tick, and every tick failed with the whole DSN in its error: Dagster's tick history, the
daemon's log and the UI showed the password once per tick."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamSparkResource, member_sensors, stream_asset
from tests.secrets.names import REFUSED_BOOTSTRAP_ENV, REFUSED_GROUP_ENV, REFUSED_STORE_URL_ENV, REFUSED_TOPIC_ENV

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

GROUP = dg.EnvVar(REFUSED_GROUP_ENV).get_value() or "refused"


@stream_asset(group=GROUP, name="clicks_refused_store")
def clicks_refused_store(context: dg.AssetExecutionContext, df: DataFrame) -> dict[str, Any]:
    """Never runs: its group's store cannot be opened."""
    return {"records_read": df.count()}


defs = dg.Definitions(
    assets=[clicks_refused_store],
    sensors=member_sensors(
        clicks_refused_store, members=1, heartbeat_interval_s=3, default_status=dg.DefaultSensorStatus.RUNNING
    ),
    resources={
        "streamgroup": KafkaStreamGroup(
            group=GROUP,
            bootstrap_servers=dg.EnvVar(REFUSED_BOOTSTRAP_ENV),
            topics=[dg.EnvVar(REFUSED_TOPIC_ENV).get_value() or "clicks"],
            store_url=dg.EnvVar(REFUSED_STORE_URL_ENV),
            heartbeat_interval_s=3,
            session_timeout_s=15,
        ),
        "pyspark": StreamSparkResource(master="local[1]"),
    },
)
