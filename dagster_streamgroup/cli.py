"""``streamgroup``: inspect groups, backfill offset ranges, and start the local stream servers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from dagster_streamgroup.dagster.operator import GroupHandle


class _Commands(click.Group):
    """The project's own errors (stream, store, state, configuration, an extra not installed) end a command with
    their message, not a traceback: they already say what failed and what to change."""

    def invoke(self, ctx: click.Context) -> object:
        from pydantic import ValidationError

        from dagster_streamgroup.extras import MissingExtraError
        from dagster_streamgroup.protocol.codec import StateFormatError
        from dagster_streamgroup.stores.base import StoreConfigError, StoreUnavailableError
        from dagster_streamgroup.streams.base import StreamError

        try:
            return super().invoke(ctx)
        except (
            StreamError,
            StoreUnavailableError,
            StoreConfigError,
            StateFormatError,
            ValidationError,
            MissingExtraError,
        ) as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Commands)
def main() -> None:
    """dagster-streamgroup: Dagster sensors as members of a stream consumer group."""


@main.group()
def local() -> None:
    """Start the embedded servers used for trying the project and by its tests (127.0.0.1 only)."""


@local.command("kafka")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=9092, show_default=True)
@click.option(
    "--data",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Data directory, kept across starts (default: a temporary one, deleted at exit).",
)
@click.option(
    "--sasl-user",
    "sasl_user",
    default=None,
    metavar="NAME",
    help="Add a SASL_SSL listener (SCRAM-SHA-512, a throw-away CA) with this user; its password is read from "
    "STREAMGROUP_KAFKA_SASL_PASSWORD.",
)
def local_kafka(host: str, port: int, data: Path | None, sasl_user: str | None) -> None:
    """Run a local Apache Kafka broker (KRaft, one node, from the jars `scripts/setup.sh` fetched) in the
    foreground until Ctrl-C."""
    import os

    from dagster_streamgroup.local.kafka_broker import BrokerStartError, serve

    users: dict[str, str] = {}
    if sasl_user is not None:
        password = os.environ.get("STREAMGROUP_KAFKA_SASL_PASSWORD", "")
        if not password:
            raise click.UsageError("--sasl-user needs the password in STREAMGROUP_KAFKA_SASL_PASSWORD")
        users[sasl_user] = password
    try:
        serve(host=host, port=port, data_dir=data, sasl_users=users)
    except BrokerStartError as exc:
        raise click.ClickException(str(exc)) from None


@local.command("v3io")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8081, show_default=True)
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), required=True, help="Data directory.")
@click.option(
    "--access-key",
    envvar="STREAMGROUP_V3IO_ACCESS_KEY",
    default=None,
    help="Require this access key (also from STREAMGROUP_V3IO_ACCESS_KEY); otherwise any non-empty key passes.",
)
def local_v3io(host: str, port: int, data: Path, access_key: str | None) -> None:
    """Run the local v3io-compatible server in the foreground until Ctrl-C."""
    from dagster_streamgroup.local.v3io.server import serve

    serve(host=host, port=port, data_dir=data, access_key=access_key)


@local.command("spark-connect")
@click.option("--port", type=int, default=15002, show_default=True)
@click.option("--master", default="local[2]", show_default=True)
@click.option("--driver-memory", default="2g", show_default=True)
@click.option("--rss-limit-mb", type=int, default=4096, show_default=True, help="Restart above this; 0 turns it off.")
@click.option("--conf", "confs", multiple=True, metavar="KEY=VALUE", help="Extra Spark configuration.")
def local_spark_connect(port: int, master: str, driver_memory: str, rss_limit_mb: int, confs: tuple[str, ...]) -> None:
    """Run a local Spark Connect server (127.0.0.1) that runs attach to instead of starting a JVM each."""
    from pydantic import ValidationError

    from dagster_streamgroup.local.spark_connect import ConnectServerSettings, serve

    bad = [c for c in confs if "=" not in c]
    if bad:
        raise click.BadParameter(f"expected KEY=VALUE, got {bad[0]!r}", param_hint="--conf")
    try:
        settings = ConnectServerSettings(
            master=master,
            driver_memory=driver_memory,
            rss_limit_mb=rss_limit_mb or None,
            conf=dict(c.split("=", 1) for c in confs),
        )
    except ValidationError as exc:
        raise click.UsageError(str(exc)) from exc
    serve(port, settings)


@local.command("spark-cluster")
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--cores", type=int, default=1, show_default=True, help="Cores each worker offers.")
@click.option("--memory", default="1g", show_default=True, help="Memory each worker offers its executors.")
def local_spark_cluster(workers: int, cores: int, memory: str) -> None:
    """Run a Spark standalone master and workers (127.0.0.1, from pyspark's jars) until Ctrl-C; point
    StreamSparkResource(master=...) or `local spark-connect --master` at the URL it prints."""
    from pydantic import ValidationError

    from dagster_streamgroup.local.spark_cluster import SparkClusterSettings, SparkClusterStartError, serve

    try:
        settings = SparkClusterSettings(workers=workers, cores_per_worker=cores, worker_memory=memory)
    except ValidationError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        serve(settings)
    except SparkClusterStartError as exc:
        raise click.ClickException(str(exc)) from None


_definitions_option = click.option(
    "--definitions",
    "definitions_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("definitions.py"),
    show_default=True,
    help="The code location file whose Definitions hold the group resource.",
)
_group_option = click.option("--group", required=True, help="The consumer group name.")


def _group(definitions_path: Path, group: str) -> GroupHandle:
    from dagster_streamgroup.dagster.operator import OperatorError, find_group, load_definitions

    try:
        return find_group(load_definitions(definitions_path), group)
    except OperatorError as exc:
        raise click.UsageError(str(exc)) from None


def _when(seconds: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@main.command("status")
@_group_option
@_definitions_option
@click.option("--events", "n_events", type=int, default=10, show_default=True, help="Recent events to show.")
def status(group: str, definitions_path: Path, n_events: int) -> None:
    """Members, shards, owners, epochs, committed offsets, high watermarks, lag, in-flight and parked ranges."""
    from rich.console import Console
    from rich.table import Table

    from dagster_streamgroup.dagster.operator import load_state, mirror_warnings, shard_rows

    handle = _group(definitions_path, group)
    resource = handle.resource
    state = load_state(resource)
    console = Console(width=None if sys.stdout.isatty() else 200)
    if state is None:
        console.print(f"group {group!r} on {resource.backend().stream_id} has no state yet (no member has ticked)")
        return
    marks = resource.backend().watermarks(list(state.shards))
    now = resource.store().now()
    members = Table(title=f"group {group} on {state.stream}: members")
    for column in ("member", "joined", "last heartbeat", "shards"):
        members.add_column(column)
    for mid, member in sorted(state.members.items()):
        owned = sum(1 for s in state.shards.values() if s.owner == mid)
        members.add_row(mid, _when(member.joined), f"{now - member.heartbeat:.1f} s ago", str(owned))
    console.print(members)
    shards = Table(title="shards")
    for column in ("shard", "owner", "epoch", "committed", "high", "lag", "in flight", "parked", "waits on"):
        shards.add_column(column, justify="right" if column in {"epoch", "committed", "high", "lag"} else "left")
    rows = shard_rows(state, marks)
    for row in rows:
        shards.add_row(
            row.shard,
            row.owner,
            str(row.epoch),
            "-" if row.committed is None else str(row.committed),
            "-" if row.high is None else str(row.high),
            "-" if row.lag is None else str(row.lag),
            row.inflight,
            row.parked,
            row.waits,
        )
    console.print(shards)
    total = sum(r.lag for r in rows if r.lag is not None)
    console.print(f"total lag: {total} records")
    for warning in mirror_warnings(resource, state):
        console.print(f"WARNING {warning}")
    if state.dead_letters:
        letters = Table(title="dead letters (unresolved: `streamgroup resolve --group ...` once dealt with)")
        for column in ("at", "shard", "range", "reason"):
            letters.add_column(column)
        for letter in state.dead_letters:
            letters.add_row(_when(letter.at), letter.shard, f"[{letter.start}, {letter.end})", letter.reason)
        console.print(letters)
    if n_events > 0 and state.events:
        events = Table(title="recent events")
        for column in ("at", "kind", "shard/member", "range", "detail"):
            events.add_column(column)
        for event in state.events[-n_events:]:
            span = f"[{event.start}, {event.end})" if event.start is not None else ""
            events.add_row(_when(event.at), event.kind.value, event.shard or event.member_id or "", span, event.detail)
        console.print(events)


@main.command("unpark")
@_group_option
@_definitions_option
@click.option("--shard", required=True, help="The parked shard, e.g. clicks:3.")
@click.option("--skip", is_flag=True, help="Dead-letter the parked range and continue after it (records skipped).")
def unpark_command(group: str, definitions_path: Path, shard: str, skip: bool) -> None:
    """Resume a parked shard: its range is retried (or, with --skip, recorded as dead-lettered)."""
    from dagster_streamgroup.dagster.operator import OperatorError, unpark

    handle = _group(definitions_path, group)
    try:
        changed = unpark(handle.resource, shard, skip=skip)
    except OperatorError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"{shard}: " + (("skipped" if skip else "unparked") if changed else "was not parked"))


def _timestamp_ms(value: str, option: str) -> int:
    import datetime as dt

    if value.isdigit():
        return int(value)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        message = f"{value!r} is neither epoch milliseconds nor an ISO 8601 time"
        raise click.BadParameter(message, param_hint=option) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


@main.command("backfill")
@_group_option
@_definitions_option
@click.option("--shard", required=True, help="The shard to re-process, e.g. clicks:3.")
@click.option("--from", "start", type=int, default=None, help="First offset (inclusive).")
@click.option("--to", "end", type=int, default=None, help="End offset (exclusive).")
@click.option("--since", default=None, help="Start at the first record at/after this time (ISO 8601 or epoch ms).")
@click.option("--until", default=None, help="End before the first record at/after this time.")
@click.option(
    "--chunk",
    type=int,
    default=None,
    help="Records per run where no committed range is (default: the group's max_records_per_run).",
)
@click.option(
    "--align/--no-align",
    default=True,
    show_default=True,
    help="One run per range the group committed, with its bounds (read from the webserver), so output keyed by "
    "range is replaced; --no-align cuts [from, to) in --chunk pieces.",
)
@click.option("--dagster-url", default="http://127.0.0.1:3000", show_default=True, help="The Dagster webserver.")
@click.option("--dry-run", is_flag=True, help="Print the ranges without launching.")
def backfill(
    group: str,
    definitions_path: Path,
    shard: str,
    start: int | None,
    end: int | None,
    since: str | None,
    until: str | None,
    chunk: int | None,
    align: bool,
    dagster_url: str,
    dry_run: bool,
) -> None:
    """Re-process offsets of one shard as a Dagster backfill (shown in the UI); committed offsets do not move."""
    from dagster_streamgroup.dagster.operator import (
        DagsterGraphQL,
        OperatorError,
        aligned_ranges,
        check_backfill_range,
        chunk_ranges,
        launch_backfill,
    )

    if (start is None) == (since is None) or (end is None) == (until is None):
        raise click.UsageError(
            "give the start as --from OFFSET or --since TIME, and the end as --to OFFSET or --until TIME"
        )
    handle = _group(definitions_path, group)
    backend = handle.resource.backend()
    try:
        if since is not None:
            start = backend.offset_for_time(shard, _timestamp_ms(since, "--since"))
        if until is not None:
            end = backend.offset_for_time(shard, _timestamp_ms(until, "--until"))
        assert start is not None and end is not None
        options = ("--since" if since is not None else "--from", "--until" if until is not None else "--to")
        check_backfill_range(handle, shard, start, end, options)
        size = chunk if chunk is not None else handle.resource.max_records_per_run
        ranges = chunk_ranges(start, end, size)
        if align and len(handle.assets) == 1:
            try:
                committed = DagsterGraphQL(dagster_url).committed_ranges(handle.assets[0].key, shard)
            except OperatorError as exc:
                if not dry_run:
                    raise
                click.echo(f"not aligned with the committed ranges ({exc}); --chunk pieces:", err=True)
            else:
                ranges = aligned_ranges(start, end, committed, size)
                if ranges[0][0] < start or ranges[-1][1] > end:
                    click.echo(
                        f"[{start}, {end}) cuts a committed range: the backfill covers "
                        f"[{ranges[0][0]}, {ranges[-1][1]}), whole ranges",
                        err=True,
                    )
        if dry_run:
            for s, e in ranges:
                click.echo(f"{shard} [{s}, {e})")
            return
        backfill_ids = launch_backfill(handle, shard, ranges, dagster_url)
    except (OperatorError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"{len(backfill_ids)} backfill(s) over {shard} [{start}, {end}), one run each:")
    for backfill_id, (s, e) in zip(backfill_ids, ranges, strict=True):
        click.echo(f"  [{s}, {e}) {dagster_url.rstrip('/')}/runs/b/{backfill_id}")


@main.command("reset")
@_group_option
@_definitions_option
@click.option(
    "--shard",
    "shards",
    multiple=True,
    metavar="SHARD[=OFFSET]",
    help="A shard to move (repeat it; default: every shard the group consumes); SHARD=OFFSET moves it to OFFSET.",
)
@click.option("--to-earliest", "to", flag_value="earliest", help="To the first offset each log still holds.")
@click.option("--to-latest", "to", flag_value="latest", help="To the end of each log (what waits is skipped).")
@click.option("--to-datetime", "when", default=None, help="To the first record at/after this time (ISO 8601 or ms).")
@click.option("--to-offset", "offset", type=int, default=None, help="To this offset (every --shard given).")
@click.option("--dry-run", is_flag=True, help="Print where each shard would move, and what it skips or reads again.")
def reset_command(
    group: str,
    definitions_path: Path,
    shards: tuple[str, ...],
    to: str | None,
    when: str | None,
    offset: int | None,
    dry_run: bool,
) -> None:
    """Move the group's shards, the supported way: through the group state (one compare-and-set, an event per
    shard, the ranges in flight fenced), then Kafka's group offsets. A reset made with Kafka's own
    kafka-consumer-groups tool is refused by the members and restored."""
    from dagster_streamgroup.dagster.operator import OperatorError, apply_reset, plan_reset

    chosen = [s for s in (when is not None, offset is not None, to is not None) if s]
    if len(chosen) > 1:
        raise click.UsageError("give one of --to-earliest, --to-latest, --to-datetime, --to-offset")
    named: list[str] = []
    explicit: dict[str, int] = {}
    for item in shards:
        shard, sep, value = item.partition("=")
        if not sep:
            named.append(shard)
        elif value.isdigit():
            explicit[shard] = int(value)
        else:
            raise click.BadParameter(f"{item!r}: the offset after '=' must be an integer >= 0", param_hint="--shard")
    how = "timestamp" if when is not None else "offset" if offset is not None else to
    if how == "offset" and not named:
        raise click.UsageError("--to-offset moves the shards named with --shard; name them")
    handle = _group(definitions_path, group)
    try:
        moves = plan_reset(
            handle.resource,
            named,
            how,
            offsets=explicit,
            offset=offset,
            timestamp_ms=_timestamp_ms(when, "--to-datetime") if when is not None else None,
        )
        for move in moves:
            was = "-" if move.committed is None else str(move.committed)
            click.echo(f"{move.shard}: {was} -> {move.target} ({move.what}; the log holds [{move.low}, {move.high}))")
        if dry_run:
            click.echo(f"dry run: {len(moves)} shard(s) would move; nothing was changed")
            return
        _state, failed = apply_reset(handle.resource, moves)
    except (OperatorError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"{len(moves)} shard(s) moved in the group state; ranges in flight on them are fenced")
    if failed is not None:
        click.echo(f"mirroring the new offsets failed (the members' ticks restore the mirror): {failed}", err=True)


@main.command("resolve")
@_group_option
@_definitions_option
@click.option("--shard", default=None, help="Only this shard's dead letters (default: all).")
def resolve_command(group: str, definitions_path: Path, shard: str | None) -> None:
    """Mark dead-lettered ranges as dealt with: they leave `status` and the asset check."""
    from dagster_streamgroup.dagster.operator import OperatorError, resolve_dead_letters

    try:
        handle = _group(definitions_path, group)
        resolved = resolve_dead_letters(handle.resource, shard)
    except (OperatorError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    for letter in resolved:
        click.echo(f"resolved {letter.shard} [{letter.start}, {letter.end}): {letter.reason}")
    click.echo(f"{len(resolved)} dead letter(s) resolved")


@main.command("prune-partitions")
@_group_option
@click.option("--dry-run", is_flag=True, help="Only count the keys.")
def prune_partitions_command(group: str, dry_run: bool) -> None:
    """Upgrade step: delete the one-per-range partition keys of earlier versions ($DAGSTER_HOME's instance).
    Committed offsets live in the group state and do not move; past materializations stay in the event log."""
    import dagster as dg

    from dagster_streamgroup.dagster.operator import prune_legacy_partitions

    with dg.DagsterInstance.get() as instance:
        count = prune_legacy_partitions(instance, group, dry_run=dry_run)
    click.echo(f"{count} range partition key(s) {'would be deleted' if dry_run else 'deleted'}")


if __name__ == "__main__":
    main()
