"""Three member sensors of the clickstream group, running as soon as the code location loads."""

from __future__ import annotations

import dagster as dg

from dagster_streamgroup.dagster import member_sensors
from jobs import settings
from jobs.clickstream import page_views_per_minute

clickstream_members = member_sensors(
    page_views_per_minute,
    members=settings.MEMBERS,
    heartbeat_interval_s=settings.HEARTBEAT_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
)
