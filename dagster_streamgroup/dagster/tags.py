"""What a run carries from the sensor tick to its commit: its ranges (run config), its identity (run tags).

A run launched by a member holds its ranges and run key in its run config (``StreamRunConfig``: shard, start,
end, attempt and epoch of each), so it can present its commit without reading anything else, and names its group
and member (and its shard, when it has one) in tags, so the UI can filter runs by them; its Dagster run key is
the protocol's. A run without a member (a
backfill from the UI or the CLI) re-processes its ranges and never commits.

Partitions are shards, not ranges: one dynamic partition per shard, so a stream running for a year keeps
as many partition keys as it has shards, and every committed range is a materialization of its shard.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import dagster as dg
from pydantic import Field

from dagster_streamgroup import run_tags as _names
from dagster_streamgroup.protocol import Launch, RangeReport

# The names' home is below the Dagster layer (``run_tags``), where the launcher and the patches reach them.
PREFIX = _names.PREFIX
TAG_GROUP = _names.TAG_GROUP
TAG_MEMBER = _names.TAG_MEMBER
TAG_RUN_KEY = _names.TAG_RUN_KEY
TAG_RANGES = _names.TAG_RANGES
TAG_RECORDS = _names.TAG_RECORDS
TAG_ATTEMPT = _names.TAG_ATTEMPT
TAG_SHARD = _names.TAG_SHARD
TAG_BACKFILL = _names.TAG_BACKFILL
TAG_START = _names.TAG_START
TAG_END = _names.TAG_END
TAG_ALIGN = _names.TAG_ALIGN
TAG_CHUNK = _names.TAG_CHUNK
ASSET_BACKFILL_OF = _names.ASSET_BACKFILL_OF
ASSET_REPLACES_BY_COORDINATES = _names.ASSET_REPLACES_BY_COORDINATES
TAG_LAUNCH_FAILED = _names.TAG_LAUNCH_FAILED

_NAME_RE = re.compile(r"[^A-Za-z0-9_]")


def dagster_name(group: str) -> str:
    """A group name as Dagster accepts it in sensor and partitions-definition names."""
    return _NAME_RE.sub("_", group)


def partitions_def_name(group: str) -> str:
    """The shard partitions of the group's stream asset."""
    return f"{dagster_name(group)}_shards"


def legacy_partitions_def_name(group: str) -> str:
    """The one-key-per-range partitions of versions before shard partitions (removed by ``streamgroup
    prune-partitions``)."""
    return f"{dagster_name(group)}_ranges"


class RangeSpec(dg.Config):
    """One offset range of a run: ``[start, end)`` of ``shard``."""

    shard: str = Field(description="The shard: '<topic>:<partition>' (Kafka) or the shard number (v3io).")
    start: int = Field(ge=0, description="First offset (inclusive).")
    end: int = Field(ge=0, description="End offset (exclusive).")
    attempt: int = Field(default=0, ge=0, description="Set by member sensors: the range's attempt.")
    epoch: int = Field(default=0, ge=0, description="Set by member sensors: the shard epoch it was launched under.")


class StreamRunConfig(dg.Config):
    """The ranges a run of a stream asset processes. Member sensors fill every field; to re-process ranges by
    hand (a backfill from the Launchpad), give only ``ranges`` (shard, start, end): nothing is committed."""

    ranges: list[RangeSpec] = Field(default_factory=list, description="The offset ranges, one per shard at most.")
    member: str | None = Field(default=None, description="Set by member sensors: the member that launched the run.")
    run_key: str | None = Field(default=None, description="Set by member sensors: the protocol's run key.")


def dagster_run_key(launches: Sequence[Launch]) -> str:
    """The Dagster run key of a run: the protocol's key, which names the run's ranges, attempts and epochs.

    A range recorded in flight before shard epochs were part of run keys (state schema 2) gets the epoch
    appended, as the Dagster run key of its run had then, so an upgrade never requests its run twice."""
    first = launches[0]
    if len(launches) == 1 and not re.search(rf":e{first.epoch}(:l[0-9]+)?$", first.run_key):
        return f"{first.run_key}:e{first.epoch}"
    return first.run_key


def run_config(launches: Sequence[Launch]) -> StreamRunConfig:
    first = launches[0]
    return StreamRunConfig(
        ranges=[RangeSpec(shard=x.shard, start=x.start, end=x.end, attempt=x.attempt, epoch=x.epoch) for x in launches],
        member=first.member_id,
        run_key=first.run_key,
    )


def run_tags(launches: Sequence[Launch]) -> dict[str, str]:
    """Only what a user filters runs by, and what a shard's concurrency limit keys on: the group, the member, and
    the shard of a single-shard run. The rest (run key, ranges, attempts) is in the run config, the run key in
    ``dagster/run_key`` too; a tag each would make the runs list a wall of chips."""
    first = launches[0]
    tags = {TAG_GROUP: first.group, TAG_MEMBER: first.member_id}
    if len(launches) == 1:
        tags[TAG_SHARD] = first.shard
    return tags


def backfill_tags(
    group: str, shard: str, start: int, end: int, *, align: bool | None = None, chunk: int | None = None
) -> dict[str, str]:
    """Tags of a backfill of one shard partition: its range, and no member identity."""
    tags = {TAG_BACKFILL: "true", TAG_GROUP: group, TAG_SHARD: shard, TAG_START: str(start), TAG_END: str(end)}
    if align is not None:
        tags[TAG_ALIGN] = str(align).lower()
    if chunk is not None:
        tags[TAG_CHUNK] = str(chunk)
    return tags


def backfill_options(tags: Mapping[str, str], *, align: bool, chunk: int) -> tuple[bool, int]:
    """``(align, chunk)`` of a backfill run: its tags', else the given defaults."""
    text = tags.get(TAG_ALIGN, str(align)).strip().lower()
    if text not in {"true", "false"}:
        raise RangeTagsError(f"tag {TAG_ALIGN} must be true or false, got {tags[TAG_ALIGN]!r}")
    chunk_text = tags.get(TAG_CHUNK, str(chunk))
    try:
        size = int(chunk_text)
    except ValueError:
        raise RangeTagsError(f"tag {TAG_CHUNK} must be an integer, got {chunk_text!r}") from None
    if size < 1:
        raise RangeTagsError(f"tag {TAG_CHUNK} must be >= 1, got {size}")
    return text == "true", size


class RangeTagsError(ValueError):
    """A run's configuration or tags name ranges that cannot be processed as given."""


def member_reports(config: StreamRunConfig, group: str, tags: Mapping[str, str]) -> list[RangeReport] | None:
    """The commit identities of a member-launched run, or ``None`` for a backfill (nothing to commit)."""
    if tags.get(TAG_BACKFILL, "").lower() == "true":
        return None
    if config.member is None:
        if config.run_key is not None:
            raise RangeTagsError("run config names a run_key but no member; refusing to commit")
        return None
    if config.run_key is None:
        raise RangeTagsError("run config names a member but no run_key; refusing to commit")
    if tags.get(TAG_GROUP, group) != group:
        raise RangeTagsError(f"run tags name group {tags[TAG_GROUP]!r}, the asset's is {group!r}")
    if tags.get(TAG_MEMBER, config.member) != config.member:
        raise RangeTagsError(f"run tags name member {tags[TAG_MEMBER]!r} but its config {config.member!r}")
    return [
        RangeReport(
            shard=r.shard, member_id=config.member, epoch=r.epoch, start=r.start, end=r.end, run_key=config.run_key
        )
        for r in config.ranges
    ]


def check_ranges(ranges: Sequence[RangeSpec]) -> None:
    shards = [r.shard for r in ranges]
    if len(set(shards)) != len(shards):
        raise RangeTagsError(f"a run holds at most one range per shard, got {shards}")
    for r in ranges:
        if r.start > r.end:
            raise RangeTagsError(f"range {r.shard} [{r.start}, {r.end}): start is after end")


def ranges_from_backfill_tags(partition_keys: Sequence[str], tags: Mapping[str, str]) -> list[RangeSpec]:
    """A backfill of shard partitions (the UI's, or ``streamgroup backfill``): the same offset range of each."""
    start_text, end_text = tags.get(TAG_START), tags.get(TAG_END)
    if start_text is None or end_text is None:
        raise RangeTagsError(
            f"a run of shard partitions {list(partition_keys)} needs the offset range to re-process: add the tags "
            f"{TAG_START} and {TAG_END} to the backfill (or use `streamgroup backfill`, or give ranges in the run "
            "config from the Launchpad)"
        )
    try:
        start, end = int(start_text), int(end_text)
    except ValueError:
        raise RangeTagsError(f"tags {TAG_START}/{TAG_END} must be integers, got {start_text!r}/{end_text!r}") from None
    if start < 0 or start > end:
        raise RangeTagsError(f"tags {TAG_START}/{TAG_END}: need 0 <= start <= end, got [{start}, {end})")
    return [RangeSpec(shard=key, start=start, end=end) for key in partition_keys]
