"""Keying a run's output by its offset ranges, so every retry, relaunch or backfill of a range replaces only that
range's output.

A run's ranges come back with the same bounds when they run again (a failed range's retry, a range handed over
after a drain expiry or a dead run, a launch that raised), so output written under a key of
``(shard, start, end)`` with Spark's dynamic partition overwrite is replaced by the range's next run and
never counted twice; output keyed by shard alone would have each range delete the shard's earlier ranges. The
layout and what it does not guarantee are ``sinks/parquet.py``'s (``RangeFolderSink``).
"""

from __future__ import annotations

from dagster_streamgroup.sinks.parquet import RANGE_COLUMN, range_key, with_range_column

__all__ = ["RANGE_COLUMN", "range_key", "with_range_column"]
