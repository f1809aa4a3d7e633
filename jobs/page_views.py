"""Page views per page and minute, kept correct as the stream's ranges land in the clicks Delta table.

The stream asset writes each click's row into the clicks table (``sinks.DeltaSink``: each run replaces exactly its
ranges' rows). This downstream step keeps the per-minute aggregate of those rows in a second Delta table, instead of
per-range partials a reader must sum:

- it reads what changed in the clicks table since the version it last reflected, from the table's change data
  feed (inserted and deleted rows alike: a retried or backfilled range deletes its old rows and inserts new ones);
- it recomputes every minute those changes touched, from the clicks table at one version (all of that minute's
  rows, whatever range they came from), and replaces those minutes' rows in one Delta commit, which also records
  the clicks version it reflects (a Delta application transaction), so a refresh that died before its commit is
  simply done again, and one that committed is never applied twice.

A minute is right once every range holding its clicks has landed: a minute's views grow as ranges land and settle
when the stream has moved past it. Plain functions over table paths, so the asset, the tests and the benchmark call
the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

SOURCE_APP_ID = "page_views_per_minute:clicks"
"""The views table's application transaction: the clicks table version it reflects."""
CHANGE_TYPES = ("insert", "delete", "update_preimage", "update_postimage")


@dataclass(frozen=True)
class Refresh:
    """What a refresh did."""

    source_version: int | None
    """The clicks table version the views now reflect (none: no clicks table yet)."""
    previous_version: int | None
    minutes: int
    """Minutes recomputed (all of them on a first or full refresh)."""
    rows: int
    """Rows of the views table written (page x minute)."""
    full: bool


def _open(path: str | Path) -> DeltaTable | None:
    from deltalake import DeltaTable

    return DeltaTable(str(path)) if DeltaTable.is_deltatable(str(path)) else None


def reflected_version(views: str | Path) -> int | None:
    """The clicks table version the views table reflects (none: never refreshed)."""
    table = _open(views)
    if table is None:
        return None
    version = table.transaction_version(SOURCE_APP_ID)
    return None if version is None else int(version)


def changed_minutes(clicks: DeltaTable, after: int, upto: int) -> pa.Array | None:
    """The minutes of the clicks rows inserted or deleted in versions ``(after, upto]``; none when the change data
    feed does not cover them (the table was written without it, or its log was cleaned since)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if clicks.metadata().configuration.get("delta.enableChangeDataFeed", "").lower() != "true":
        return None  # delta-rs answers from the added files alone then: deleted rows would go unseen
    try:
        changes = pa.table(clicks.load_cdf(starting_version=after + 1, ending_version=upto, columns=["minute"]))
    except Exception:
        return None
    return pc.unique(changes.column("minute")).drop_null()


def aggregate(clicks: DeltaTable, minutes: pa.Array | None) -> pa.Table:
    """Views and distinct users per page and minute, over the given minutes (all: ``None``), from the clicks table's
    loaded version; partitions are pruned by day."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    dataset = clicks.to_pyarrow_dataset()
    condition = None
    if minutes is not None:
        days = pc.unique(pc.cast(minutes, pa.date32()))
        condition = ds.field("day").isin(days) & ds.field("minute").isin(minutes)
    rows = dataset.to_table(columns=["page", "minute", "user"], filter=condition)
    grouped = rows.group_by(["page", "minute"]).aggregate([("user", "count"), ("user", "count_distinct")])
    return pa.table(
        {
            "day": pc.cast(grouped.column("minute"), pa.date32()),
            "minute": grouped.column("minute"),
            "page": grouped.column("page"),
            "views": grouped.column("user_count"),
            "users": grouped.column("user_count_distinct"),
        }
    )


def refresh(clicks_path: str | Path, views_path: str | Path) -> Refresh:
    """Bring the views table up to the clicks table's latest version, recomputing only the minutes that changed."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    clicks = _open(clicks_path)
    previous = reflected_version(views_path)
    if clicks is None:
        return Refresh(source_version=None, previous_version=previous, minutes=0, rows=0, full=False)
    version = clicks.version()
    if previous == version:
        return Refresh(source_version=version, previous_version=previous, minutes=0, rows=0, full=False)
    minutes = changed_minutes(clicks, previous, version) if previous is not None and previous < version else None
    views = aggregate(clicks, minutes)
    commit = CommitProperties(
        app_transactions=[Transaction(app_id=SOURCE_APP_ID, version=version)],
        custom_metadata={"page_views.source_version": str(version)},
    )
    if minutes is None:  # the first refresh, or changes the feed cannot show: every minute again
        write_deltalake(
            str(views_path), views, mode="overwrite", partition_by=["day"], commit_properties=commit,
            schema_mode="overwrite",
        )  # fmt: skip
        counted = len(set(views.column("minute").to_pylist()))
    else:
        predicate = (
            "minute IN (" + ", ".join(f"'{m.isoformat()}'" for m in minutes.to_pylist()) + ")"
            if len(minutes)
            else "false"
        )
        write_deltalake(
            str(views_path), views, mode="overwrite", predicate=predicate, partition_by=["day"],
            commit_properties=commit,
        )  # fmt: skip
        counted = len(minutes)
    return Refresh(
        source_version=version, previous_version=previous, minutes=counted, rows=views.num_rows, full=minutes is None
    )


def views_by_minute(views_path: str | Path) -> dict[tuple[str, object], tuple[int, int]]:
    """``(page, minute) -> (views, users)`` of the views table, for checks."""
    table = _open(views_path)
    if table is None:
        return {}
    rows = table.to_pyarrow_table().to_pylist()
    return {(r["page"], r["minute"]): (r["views"], r["users"]) for r in rows}
