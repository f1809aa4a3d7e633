"""The names of the tags and metadata keys a stream asset's runs carry: the vocabulary the Dagster layer, the run
launcher and the run coordinator share. No imports: the launcher and the patches stand on it without importing
the Dagster layer above them (``dagster/tags.py`` re-exports every name)."""

from __future__ import annotations

PREFIX = "streamgroup/"
TAG_GROUP = PREFIX + "group"
TAG_MEMBER = PREFIX + "member"
TAG_RUN_KEY = PREFIX + "run_key"
"""Set by earlier versions only: the protocol's run key is in the run config (``run_key``) and is the run's
Dagster run key (``dagster/run_key``)."""
TAG_RANGES = PREFIX + "ranges"
TAG_RECORDS = PREFIX + "records"
TAG_ATTEMPT = PREFIX + "attempt"
"""Set by earlier versions only: how many ranges, records and the highest attempt; the run config holds each
range (shard, start, end, attempt, epoch) and the run's first log message shows them as a table."""
TAG_SHARD = PREFIX + "shard"
"""Set on runs of a single shard (backfills, retries), for filtering and per-shard run limits."""
TAG_BACKFILL = PREFIX + "backfill"
TAG_START = PREFIX + "start"
TAG_END = PREFIX + "end"
"""A backfill of shard partitions from the UI gives its offset range in these two tags."""
TAG_ALIGN = PREFIX + "align"
"""``false``: a backfill cuts its range in pieces instead of following the committed ranges (the default, unless the
asset's sink replaces rows by their coordinates)."""
TAG_CHUNK = PREFIX + "chunk"
"""A backfill's piece size where no committed range is recorded (default: the group's ``max_records_per_run``)."""
ASSET_BACKFILL_OF = PREFIX + "backfill_of"
"""Metadata of a stream asset's backfill asset: the stream asset's key."""
ASSET_REPLACES_BY_COORDINATES = PREFIX + "replaces_by_coordinates"
"""Metadata of a stream asset whose sink replaces rows by their source coordinates (shard and offset)."""
TAG_LAUNCH_FAILED = PREFIX + "launch_failed"
"""Set on a run whose launch raised (its value: the error's type): no worker ever read its ranges, so its
member relaunches them without counting an attempt."""
