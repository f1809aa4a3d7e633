"""``streamgroup``: inspect groups, backfill offset ranges, and start the local stream servers."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console

    from dagster_streamgroup.dagster.operator import GroupHandle
    from dagster_streamgroup.dagster.resources import StreamGroupResource


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
    "STREAMGROUP_KAFKA_SASL_PASSWORD (the broker's JVM does not get the variable).",
)
def local_kafka(host: str, port: int, data: Path | None, sasl_user: str | None) -> None:
    """Run a local Apache Kafka broker (KRaft, one node, from the jars `scripts/setup.sh` fetched) in the
    foreground until Ctrl-C."""
    import os

    from dagster_streamgroup.local.kafka_broker import SASL_PASSWORD_ENV, BrokerStartError, serve

    users: dict[str, str] = {}
    if sasl_user is not None:
        password = os.environ.get(SASL_PASSWORD_ENV, "")
        if not password:
            raise click.UsageError(f"--sasl-user needs the password in {SASL_PASSWORD_ENV}")
        users[sasl_user] = password
    try:
        serve(host=host, port=port, data_dir=data, sasl_users=users)
    except BrokerStartError as exc:
        raise click.ClickException(str(exc)) from None


@local.command("registry")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8085, show_default=True)
def local_registry(host: str, port: int) -> None:
    """Run a local Schema Registry (Apicurio Registry's application, which `scripts/setup.sh` fetched, serving
    Confluent's API at /apis/ccompat/v7; in-memory storage; Java 21+) in the foreground until Ctrl-C."""
    from dagster_streamgroup.local.schema_registry import RegistryStartError, serve

    try:
        serve(host=host, port=port)
    except RegistryStartError as exc:
        raise click.ClickException(str(exc)) from None


@local.command("v3io")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8081, show_default=True)
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), required=True, help="Data directory.")
@click.option(
    "--access-key",
    envvar="STREAMGROUP_V3IO_ACCESS_KEY",
    default=None,
    help="Require this access key; otherwise any non-empty key passes. Give it in STREAMGROUP_V3IO_ACCESS_KEY: a "
    "command line is visible to every local user.",
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
    type=click.Path(path_type=Path),
    default=None,
    help="The code location whose Definitions hold the group resource: a definitions file, or a dg project's "
    "folder. Default: the dg project holding the working directory (as dg finds it), else ./definitions.py.",
)
_group_option = click.option("--group", required=True, help="The consumer group name.")


def _group(definitions_path: Path | None, group: str) -> GroupHandle:
    """The group's resource from the code location. In a ``dg`` project the command then works from the project's
    root, as ``dg`` does, so the group state's default file is the one the members write."""
    import os

    from dagster_streamgroup.dagster.code_location import DefinitionsNotFoundError, load_definitions
    from dagster_streamgroup.dagster.operator import OperatorError, find_group

    try:
        loaded = load_definitions(definitions_path)
        if loaded.project is not None:
            os.chdir(loaded.project.root)
        return find_group(loaded.definitions, group)
    except (OperatorError, DefinitionsNotFoundError) as exc:
        raise click.UsageError(str(exc)) from None


def _require_store(handle: GroupHandle) -> None:
    """A command that changes the state refuses a SQLite file that does not exist instead of creating it."""
    from dagster_streamgroup.dagster.operator import missing_store

    absent = missing_store(handle.resource)
    if absent is not None:
        raise click.UsageError(
            f"group {handle.resource.group!r}: its state store {absent} does not exist (no member has ticked "
            "against it); run this where the members run (the same DAGSTER_HOME, or the dg project's folder), or "
            "set store_url"
        )


def _warn_if_members_elsewhere(console: Console, resource: StreamGroupResource, absent: Path | None) -> None:
    """No state here, but the stream holds the group's committed offsets (members mirror every commit there):
    the members are running, or ran, against another store."""
    from dagster_streamgroup.streams.base import StreamError

    try:
        backend = resource.backend()
        committed = backend.committed(resource.group, backend.shards())
    except StreamError:
        return
    moved = {shard: offset for shard, offset in committed.items() if offset}
    if not moved:
        return
    hint = (
        "members write the default file under $DAGSTER_HOME, else in .streamgroup/ at the dg project's root (or "
        "the working directory outside a dg project): run status with the members' DAGSTER_HOME or from their "
        "project, or set store_url"
    )
    console.print(
        f"warning: the stream holds committed offsets of group {resource.group!r} on {len(moved)} shard(s) "
        f"({', '.join(f'{s}={o}' for s, o in sorted(moved.items())[:4])}{' ...' if len(moved) > 4 else ''}), "
        f"so members are running or ran against another store; {hint}"
        + (f" ({absent} was not created)" if absent is not None else ""),
        soft_wrap=True,
    )


def _when(seconds: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@main.command("status")
@_group_option
@_definitions_option
@click.option("--events", "n_events", type=int, default=10, show_default=True, help="Recent events to show.")
@click.option("--json", "as_json", is_flag=True, help="Print all of it as one JSON object (for scripts).")
def status(group: str, definitions_path: Path | None, n_events: int, as_json: bool) -> None:
    """Members, shards, owners, epochs, committed offsets, high watermarks, lag in records and seconds, in-flight
    and parked ranges."""
    from rich.console import Console
    from rich.table import Table

    from dagster_streamgroup.dagster.operator import load_state, mirror_warnings, missing_store, shard_rows
    from dagster_streamgroup.redact import redact
    from dagster_streamgroup.streams.base import seconds_behind

    handle = _group(definitions_path, group)
    resource = handle.resource
    if as_json:
        _status_json(resource, n_events)
        return
    console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
    store = redact(resource.resolved_store_url())
    console.print(
        f"state: {store}" + ("" if resource.store_url else " (the default: store_url is not set)"), soft_wrap=True
    )
    absent = missing_store(resource)
    state = None if absent is not None else load_state(resource)
    if state is None:
        where = f"{absent} does not exist" if absent is not None else "the store holds none"
        console.print(f"group {group!r} on {resource.backend().stream_id} has no state yet ({where}: no member has "
                      "ticked against this store)", soft_wrap=True)  # fmt: skip
        _warn_if_members_elsewhere(console, resource, absent)
        return
    backend = resource.backend()
    marks = backend.watermarks(list(state.shards))
    behind = seconds_behind(backend, {sid: s.committed for sid, s in state.shards.items()}, marks)
    now = resource.store().now()
    members = Table(title=f"group {group} on {state.stream}: members")
    for column in ("member", "joined", "last heartbeat", "shards"):
        members.add_column(column)
    for mid, member in sorted(state.members.items()):
        owned = sum(1 for s in state.shards.values() if s.owner == mid)
        members.add_row(mid, _when(member.joined), f"{now - member.heartbeat:.1f} s ago", str(owned))
    console.print(members)
    shards = Table(title="shards")
    numeric = {"epoch", "committed", "high", "lag", "seconds behind"}
    for column in ("shard", "owner", "epoch", "committed", "high", "lag", "seconds behind", "in flight", "parked"):
        shards.add_column(column, justify="right" if column in numeric else "left")
    shards.add_column("waits on")
    rows = shard_rows(state, marks, behind)
    for row in rows:
        shards.add_row(
            row.shard,
            row.owner,
            str(row.epoch),
            "-" if row.committed is None else str(row.committed),
            "-" if row.high is None else str(row.high),
            "-" if row.lag is None else str(row.lag),
            "-" if row.seconds_behind is None else f"{row.seconds_behind:.1f}",
            row.inflight,
            row.parked,
            row.waits,
        )
    console.print(shards)
    total = sum(r.lag for r in rows if r.lag is not None)
    worst = max((r.seconds_behind for r in rows if r.seconds_behind is not None), default=0.0)
    console.print(f"total lag: {total} records; furthest behind: {worst:.1f} s")
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


def _status_json(resource: StreamGroupResource, n_events: int) -> None:
    """``status --json``: the same data as the tables, one JSON object on stdout (no state: ``"state": null``)."""
    import dataclasses
    import json

    from dagster_streamgroup.dagster.operator import load_state, mirror_warnings, missing_store, shard_rows
    from dagster_streamgroup.redact import redact
    from dagster_streamgroup.streams.base import seconds_behind

    absent = missing_store(resource)
    state = None if absent is not None else load_state(resource)
    out: dict[str, Any] = {
        "group": resource.group,
        "store": redact(resource.resolved_store_url()),
        "stream": resource.backend().stream_id,
        "state": None,
    }
    if state is not None:
        backend = resource.backend()
        marks = backend.watermarks(list(state.shards))
        behind = seconds_behind(backend, {sid: s.committed for sid, s in state.shards.items()}, marks)
        now = resource.store().now()
        rows = shard_rows(state, marks, behind)
        out["state"] = {
            "members": [
                {
                    "member": mid,
                    "joined": member.joined,
                    "heartbeat_age_s": round(now - member.heartbeat, 3),
                    "shards": sum(1 for s in state.shards.values() if s.owner == mid),
                }
                for mid, member in sorted(state.members.items())
            ],
            "shards": [dataclasses.asdict(row) for row in rows],
            "total_lag": sum(r.lag for r in rows if r.lag is not None),
            "max_seconds_behind": max((r.seconds_behind for r in rows if r.seconds_behind is not None), default=0.0),
            "warnings": list(mirror_warnings(resource, state)),
            "dead_letters": [
                {"at": d.at, "shard": d.shard, "start": d.start, "end": d.end, "reason": d.reason}
                for d in state.dead_letters
            ],
            "events": [
                {
                    "at": e.at,
                    "kind": e.kind.value,
                    "shard": e.shard,
                    "member": e.member_id,
                    "start": e.start,
                    "end": e.end,
                    "detail": e.detail,
                }
                for e in (state.events[-n_events:] if n_events > 0 else [])
            ],
        }
    click.echo(json.dumps(out, indent=2))


@main.command("unpark")
@_group_option
@_definitions_option
@click.option("--shard", required=True, help="The parked shard, e.g. clicks:3.")
@click.option("--skip", is_flag=True, help="Dead-letter the parked range and continue after it (records skipped).")
def unpark_command(group: str, definitions_path: Path | None, shard: str, skip: bool) -> None:
    """Resume a parked shard: its range is retried (or, with --skip, recorded as dead-lettered)."""
    from dagster_streamgroup.dagster.operator import OperatorError, unpark

    handle = _group(definitions_path, group)
    _require_store(handle)
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
@click.option("--until", default=None, help="End before the first record at/after this time (not in the future).")
@click.option(
    "--chunk",
    type=int,
    default=None,
    help="Records per piece where no committed range is recorded (default: the group's max_records_per_run).",
)
@click.option(
    "--align/--no-align",
    default=None,
    help="Follow the ranges the group committed, with their bounds, so output keyed by range is replaced (the "
    "default, unless the asset's sink replaces rows by coordinates); --no-align cuts [from, to) in --chunk pieces.",
)
@click.option("--dagster-url", default="http://127.0.0.1:3000", show_default=True, help="The Dagster webserver.")
@click.option("--dry-run", is_flag=True, help="Print what would be re-processed without launching.")
@click.option("--wait", is_flag=True, help="Follow the backfill until its run ends; exit 1 if it failed.")
def backfill(
    group: str,
    definitions_path: Path | None,
    shard: str,
    start: int | None,
    end: int | None,
    since: str | None,
    until: str | None,
    chunk: int | None,
    align: bool | None,
    dagster_url: str,
    dry_run: bool,
    wait: bool,
) -> None:
    """Re-process offsets of one shard as one Dagster backfill (shown in the UI); committed offsets do not move."""
    import time

    from dagster_streamgroup.dagster import tags as sgt
    from dagster_streamgroup.dagster.backfill import describe, plan_of
    from dagster_streamgroup.dagster.operator import OperatorError, check_backfill_range, launch_backfill, load_state
    from dagster_streamgroup.protocol.backfill import BackfillRefusedError

    if (start is None) == (since is None) or (end is None) == (until is None):
        raise click.UsageError(
            "give the start as --from OFFSET or --since TIME, and the end as --to OFFSET or --until TIME"
        )
    if chunk is not None and chunk < 1:
        raise click.BadParameter(f"must be >= 1, got {chunk}", param_hint="--chunk")
    until_ms = None if until is None else _timestamp_ms(until, "--until")
    if until_ms is not None and until_ms > time.time() * 1000:
        raise click.BadParameter(
            f"{until!r} is in the future: a backfill re-processes records the group has committed; end at the "
            "present at the latest, or give --to OFFSET",
            param_hint="--until",
        )
    options = ("--since" if since is not None else "--from", "--until" if until is not None else "--to")
    handle = _group(definitions_path, group)
    resource = handle.resource
    try:
        coordinates = handle.replaces_by_coordinates
        align = not coordinates if align is None else align
        size = chunk if chunk is not None else resource.max_records_per_run
        backend = resource.backend()
        if since is not None:
            start = backend.offset_for_time(shard, _timestamp_ms(since, "--since"))
        if until_ms is not None:
            end = backend.offset_for_time(shard, until_ms)
        assert start is not None and end is not None
        check_backfill_range(handle, shard, start, end, options)
        spec = sgt.RangeSpec(shard=shard, start=start, end=end)
        try:
            plan = plan_of(
                resource, load_state(resource), spec, align=align, chunk=size, replaces_by_coordinates=coordinates
            )
        except BackfillRefusedError as exc:
            raise OperatorError(f"{options[0]}/{options[1]}: {exc}") from None
        for note in plan.notes():
            click.echo(note, err=True)
        click.echo(f"plan: {describe(plan)}, one run", err=True)
        if dry_run:
            for lo, hi in plan.ranges:
                click.echo(f"{shard} [{lo}, {hi})")
            return
        click.echo(f"launching one backfill through {dagster_url} ...", err=True)
        backfill_id = launch_backfill(handle, plan, align=align, chunk=size, dagster_url=dagster_url)
    except (OperatorError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    url = f"{dagster_url.rstrip('/')}/runs/b/{backfill_id}?tab=runs"
    click.echo(f"backfill {backfill_id} over {shard} [{plan.start}, {plan.end}): {url}")
    if wait:
        _follow_backfill(dagster_url, backfill_id)


def _follow_backfill(dagster_url: str, backfill_id: str, poll_s: float = 2.0) -> None:
    """Print the backfill's runs as their statuses change until it ends; a failed backfill exits 1. An error while
    following ends the command (exit 1) with the backfill's id already printed: the backfill goes on."""
    import time

    from dagster_streamgroup.dagster.operator import DagsterGraphQL, OperatorError

    client = DagsterGraphQL(dagster_url)
    started = time.monotonic()
    seen: dict[str, str] = {}
    while True:
        try:
            progress = client.backfill_progress(backfill_id)
        except OperatorError as exc:
            raise click.ClickException(f"following backfill {backfill_id} failed ({exc}); it goes on") from None
        for run_id, status in sorted(progress.runs.items()):
            if seen.get(run_id) != status:
                click.echo(f"  run {run_id}: {status} ({time.monotonic() - started:.0f} s)")
                seen[run_id] = status
        if progress.done:
            status = "SUCCESS" if progress.succeeded else progress.status
            click.echo(f"backfill {backfill_id}: {status} ({time.monotonic() - started:.0f} s)")
            if not progress.succeeded:
                raise SystemExit(1)
            return
        time.sleep(poll_s)


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
    shard, the ranges in flight fenced), then the stream's record of them (Kafka's group offsets, v3io's
    committed-sequence shard attributes). A reset made around the group (Kafka's kafka-consumer-groups tool, a
    v3io attribute set by hand as Nuclio users replay) is refused by the members and restored."""
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
def resolve_command(group: str, definitions_path: Path | None, shard: str | None) -> None:
    """Mark dead-lettered ranges as dealt with: they leave `status` and the asset check."""
    from dagster_streamgroup.dagster.operator import OperatorError, resolve_dead_letters

    try:
        handle = _group(definitions_path, group)
        _require_store(handle)
        resolved = resolve_dead_letters(handle.resource, shard)
    except (OperatorError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None
    for letter in resolved:
        click.echo(f"resolved {letter.shard} [{letter.start}, {letter.end}): {letter.reason}")
    click.echo(f"{len(resolved)} dead letter(s) resolved")


@main.command("index-ranges")
@_group_option
@_definitions_option
@click.option("--shard", "shards", multiple=True, help="Only these shards (default: every shard partition).")
def index_ranges_command(group: str, definitions_path: Path, shards: tuple[str, ...]) -> None:
    """Upgrade step: record the bounds of the ranges committed before this version ($DAGSTER_HOME's instance holds
    them as materializations), so that backfills over them replace them whole."""
    import dagster as dg

    from dagster_streamgroup.dagster.operator import OperatorError, index_history

    handle = _group(definitions_path, group)
    try:
        with dg.DagsterInstance.get() as instance:
            counts = index_history(instance, handle, shards)
    except OperatorError as exc:
        raise click.UsageError(str(exc)) from None
    for shard, count in sorted(counts.items()):
        click.echo(f"{shard}: {count} committed range(s) recorded")


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
