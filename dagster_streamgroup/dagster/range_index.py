"""Who records a committed range's bounds in the store's index (``stores/ranges.py``), and what a backfill reads back.

The run that commits a range records its bounds right after the commit, before its materializations: a run that
dies in between leaves the range in the state's unrecorded runs, and the member that repairs its materializations
records the bounds too. Until the member has confirmed a run recorded, the state still holds its ranges, so a
backfill reads the index and those: nothing the group committed is missing from what it aligns to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dagster_streamgroup.dagster.resources import StreamGroupResource
from dagster_streamgroup.protocol import GroupState
from dagster_streamgroup.stores.ranges import CommittedRange, range_index
from dagster_streamgroup.streams.base import Watermarks


def record_committed_ranges(
    resource: StreamGroupResource, ranges: Iterable[CommittedRange], marks: Mapping[str, Watermarks] | None = None
) -> None:
    """Record ``ranges`` (just committed); ``marks``: the shards' watermarks, whose low ends drop the ranges that
    fell out of retention."""
    ranges = list(ranges)
    if not ranges:
        return
    floors = {shard: marks[shard].low for shard, _, _ in ranges if marks is not None and shard in marks}
    range_index(resource.store()).record_ranges(resource.state_key(), ranges, floors)


def committed_ranges(
    resource: StreamGroupResource, state: GroupState | None, shard: str, start: int, end: int
) -> list[tuple[int, int]]:
    """The committed ranges of ``shard`` over ``[start, end)``: the index's, and those of runs whose records their
    member has not confirmed yet (still in the state)."""
    found = set(range_index(resource.store()).ranges_between(resource.state_key(), shard, start, end))
    if state is not None:
        for run in state.unrecorded_runs.values():
            found.update((lo, hi) for s, lo, hi in run.ranges if s == shard and hi > start and lo < end)
    return sorted(found)
