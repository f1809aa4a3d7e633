"""Three member sensors of the clickstream group, running as soon as the code location loads."""

from __future__ import annotations

import dagster as dg

from dagster_streamgroup.dagster import member_sensors
from jobs import settings
from jobs.clickstream import stream

clickstream_members = member_sensors(
    stream,
    members=settings.MEMBERS,
    heartbeat_interval_s=settings.HEARTBEAT_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
