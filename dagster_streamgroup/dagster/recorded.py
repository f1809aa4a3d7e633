"""Whether Dagster holds a committed range's materialization: asked by a member before it repairs the record of
a run that ended, and by a run whose commit the group found made already, before it records the range again.

A range is committed once, and recorded once: by the run that committed it, or, when that run died between
its commit and its events, by a member's repair. Both ask this first, because a run that ended may still be
writing (a run marked canceled or failed while its worker runs on), and a run's commit may be found made
already by another execution of the same run (two workers of one run, a write retried after its answer was
lost): only the first record of a range counts.
"""

from __future__ import annotations

import itertools

import dagster as dg

LOOKUP_PAGE = 100


def materialized_for(
    instance: dg.DagsterInstance,
    asset_key: dg.AssetKey,
    run_key: str,
    shard_range: tuple[str, int, int],
    since: float | None = None,
    pages: int | None = None,
) -> bool:
    """Whether a materialization of ``shard_range``'s partition (since ``since``, the run's creation) names
    ``run_key`` and the range's start: the run's own, or a repair recorded by any member. Paged, newest first,
    ``pages`` pages at most; asked only for ranges whose record is in doubt."""
    shard, start, _end = shard_range
    records_filter = dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[shard], after_timestamp=since)
    cursor: str | None = None
    for _ in itertools.repeat(None) if pages is None else range(pages):
        page = instance.fetch_materializations(records_filter, limit=LOOKUP_PAGE, cursor=cursor)
        for event_record in page.records:
            materialization = event_record.asset_materialization
            if materialization is None:
                continue
            metadata = materialization.metadata
            key, first = metadata.get("run_key"), metadata.get("start")
            if key is not None and key.value == run_key and first is not None and first.value == start:
                return True
        if not page.has_more:
            return False
        cursor = page.cursor
    return False
