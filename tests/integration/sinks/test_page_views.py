"""The example's downstream page views per minute (jobs/page_views.py) against the clicks Delta table as the
Delta sink writes it: after any refresh, each minute's views and users equal a recount of the table's rows,
through first refreshes, new ranges, retried and backfilled ranges whose rows changed, and a table without a
change data feed (every minute again). Only the minutes a change touched are recomputed."""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from dagster_streamgroup.sinks import DeltaSink
from jobs import page_views
from tests.integration.sinks.test_delta_sink import Range

T0 = dt.datetime(2026, 12, 7, 23, 58, tzinfo=dt.UTC)  # the minutes span midnight: two days, two partitions


def click_rows(shard: str, start: int, end: int, salt: int = 0) -> pa.Table:
    """Rows as the example's ``click_rows`` makes them: a record per second from T0, pages and users by offset."""
    topic, _, partition = shard.rpartition(":")
    offsets = list(range(start, end))
    at = [T0 + dt.timedelta(seconds=o) for o in offsets]
    minute = [t.replace(second=0) for t in at]
    return pa.table(
        {
            "topic": pa.array([topic] * len(offsets), pa.string()),
            "partition": pa.array([int(partition)] * len(offsets), pa.int32()),
            "offset": pa.array(offsets, pa.int64()),
            "user": [f"u{(o * 7 + salt) % 13}" for o in offsets],
            "page": [f"/p{(o + salt) % 3}" for o in offsets],
            "minute": pa.array(minute, pa.timestamp("us", tz="UTC")),
            "day": pa.array([m.date() for m in minute], pa.date32()),
        }
    )


def recount(clicks: Path) -> dict[tuple[str, object], tuple[int, int]]:
    rows = DeltaTable(str(clicks)).to_pyarrow_table().to_pylist()
    views: Counter[tuple[str, object]] = Counter()
    users: defaultdict[tuple[str, object], set[str]] = defaultdict(set)
    for r in rows:
        key = (r["page"], r["minute"])
        views[key] += 1
        users[key].add(r["user"])
    return {k: (views[k], len(users[k])) for k in views}


def test_views_per_minute_stay_a_recount_of_the_clicks_as_ranges_land_and_are_replaced(tmp_path: Path) -> None:
    clicks, views = tmp_path / "clicks", tmp_path / "views"
    sink = DeltaSink(table=str(clicks), partition_by=["day"], configuration={"delta.enableChangeDataFeed": "true"})
    assert page_views.refresh(clicks, views).source_version is None, "no clicks table yet: nothing to do"

    def write(ranges: list[Range], salt: int = 0) -> None:
        sink.write(pa.concat_tables([click_rows(r.shard, r.start, r.end, salt) for r in ranges]), ranges)

    write([Range("c:0", 0, 150), Range("c:1", 0, 100)])
    first = page_views.refresh(clicks, views)
    assert first.full and first.minutes == 3 and page_views.views_by_minute(views) == recount(clicks)
    write([Range("c:0", 150, 200)])  # a new range: only the minute it touches is recomputed
    second = page_views.refresh(clicks, views)
    assert (second.full, second.minutes, second.previous_version) == (False, 2, first.source_version)
    assert page_views.views_by_minute(views) == recount(clicks)
    write([Range("c:1", 30, 100)], salt=1)  # a backfill whose rows changed (new pages and users)
    write([Range("c:1", 0, 30)], salt=1)
    third = page_views.refresh(clicks, views)
    assert not third.full and page_views.views_by_minute(views) == recount(clicks)
    sink.write(click_rows("c:0", 0, 0), [Range("c:0", 100, 200)])  # a range retried with no rows: deletes only
    fourth = page_views.refresh(clicks, views)
    assert fourth.minutes == 3 and page_views.views_by_minute(views) == recount(clicks)
    assert page_views.refresh(clicks, views).minutes == 0, "nothing new: nothing recomputed"
    assert page_views.reflected_version(views) == DeltaTable(str(clicks)).version()


def test_a_clicks_table_without_a_change_data_feed_is_recounted_whole(tmp_path: Path) -> None:
    clicks, views = tmp_path / "clicks", tmp_path / "views"
    sink = DeltaSink(table=str(clicks), partition_by=["day"])
    sink.write(click_rows("c:0", 0, 90), [Range("c:0", 0, 90)])
    page_views.refresh(clicks, views)
    sink.write(click_rows("c:0", 30, 90, salt=2), [Range("c:0", 30, 90)])
    again = page_views.refresh(clicks, views)
    assert again.full and page_views.views_by_minute(views) == recount(clicks)
