"""Run tags and range partition keys: the identity a run carries from the sensor tick to its commit.

A run launched by a member carries every field of its ``RangeReport`` as a tag, so the run can present its
commit without reading anything else, and the UI can filter runs by group, shard or member. A run without
the member tags (a backfill from the UI or the CLI) re-processes its range and never commits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from dagster_streamgroup.protocol import Launch, RangeReport

PREFIX = "streamgroup/"
TAG_GROUP = PREFIX + "group"
TAG_SHARD = PREFIX + "shard"
TAG_START = PREFIX + "start"
TAG_END = PREFIX + "end"
TAG_EPOCH = PREFIX + "epoch"
TAG_MEMBER = PREFIX + "member"
TAG_ATTEMPT = PREFIX + "attempt"
TAG_RANGE_KEY = PREFIX + "range_key"
"""The protocol's run key of the range (the Dagster run key adds the epoch, see ``dagster_run_key``)."""
TAG_BACKFILL = PREFIX + "backfill"

MEMBER_TAGS = (TAG_GROUP, TAG_SHARD, TAG_START, TAG_END, TAG_EPOCH, TAG_MEMBER, TAG_RANGE_KEY)

_NAME_RE = re.compile(r"[^A-Za-z0-9_]")


def dagster_name(group: str) -> str:
    """A group name as Dagster accepts it in sensor and partitions-definition names."""
    return _NAME_RE.sub("_", group)


def partitions_def_name(group: str) -> str:
    return f"{dagster_name(group)}_ranges"


def range_partition_key(shard: str, start: int, end: int) -> str:
    """``<shard>:<start>-<end>``; shard ids may hold ':' themselves (Kafka ``topic:partition``)."""
    return f"{shard}:{start}-{end}"


def parse_range_partition_key(key: str) -> tuple[str, int, int]:
    shard, sep, span = key.rpartition(":")
    start_s, dash, end_s = span.partition("-")
    if not sep or not shard or not dash or not start_s.isdigit() or not end_s.isdigit():
        raise ValueError(f"partition key {key!r} is not a range key '<shard>:<start>-<end>'")
    start, end = int(start_s), int(end_s)
    if start > end:
        raise ValueError(f"partition key {key!r}: start {start} is after end {end}")
    return shard, start, end


def dagster_run_key(launch: Launch) -> str:
    """The Dagster run key of a launch: the protocol's key (range + attempt) plus the shard epoch.

    The epoch matters when a range is launched again by the same member after its ownership moved (a drain
    that expired, or the member leaving and coming back): Dagster keeps a run key used for good, per sensor,
    so without the epoch that relaunch would be skipped as a duplicate."""
    return f"{launch.run_key}:e{launch.epoch}"


def launch_tags(launch: Launch) -> dict[str, str]:
    return {
        TAG_GROUP: launch.group,
        TAG_SHARD: launch.shard,
        TAG_START: str(launch.start),
        TAG_END: str(launch.end),
        TAG_EPOCH: str(launch.epoch),
        TAG_MEMBER: launch.member_id,
        TAG_ATTEMPT: str(launch.attempt),
        TAG_RANGE_KEY: launch.run_key,
    }


def backfill_tags(group: str, shard: str) -> dict[str, str]:
    """Tags of a backfill run: the shard tag keeps the one-run-per-shard limit, and no member identity."""
    return {TAG_BACKFILL: "true", TAG_GROUP: group, TAG_SHARD: shard}


class RangeTagsError(ValueError):
    """The run's tags name a range that does not match its partition, or only part of a member identity."""


def report_from_tags(tags: Mapping[str, str], shard: str, start: int, end: int) -> RangeReport | None:
    """The commit identity of a member-launched run, or ``None`` for a backfill run (nothing to commit)."""
    if tags.get(TAG_BACKFILL, "").lower() == "true":
        return None
    present = [t for t in MEMBER_TAGS if t in tags]
    if not present:
        return None
    missing = [t for t in MEMBER_TAGS if t not in tags]
    if missing:
        raise RangeTagsError(f"run tags name a member launch but lack {missing}; refusing to commit")
    try:
        tag_start, tag_end, epoch = int(tags[TAG_START]), int(tags[TAG_END]), int(tags[TAG_EPOCH])
    except ValueError as exc:
        raise RangeTagsError(f"run tags {TAG_START}/{TAG_END}/{TAG_EPOCH} must be integers: {exc}") from None
    if (tags[TAG_SHARD], tag_start, tag_end) != (shard, start, end):
        raise RangeTagsError(
            f"run tags name {tags[TAG_SHARD]} [{tag_start}, {tag_end}) but the partition is {shard} [{start}, {end})"
        )
    return RangeReport(
        shard=shard, member_id=tags[TAG_MEMBER], epoch=epoch, start=start, end=end, run_key=tags[TAG_RANGE_KEY]
    )
