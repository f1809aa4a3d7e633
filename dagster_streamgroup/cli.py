"""``streamgroup``: inspect groups, backfill offset ranges, and start the local stream servers."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def main() -> None:
    """dagster-streamgroup: Dagster sensors as members of a stream consumer group."""


@main.group()
def local() -> None:
    """Start the embedded servers used for trying the project and by its tests (127.0.0.1 only)."""


@local.command("kafka")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=9092, show_default=True)
def local_kafka(host: str, port: int) -> None:
    """Run the local Kafka-compatible broker in the foreground until Ctrl-C."""
    from dagster_streamgroup.local.kafka_broker import serve

    serve(host=host, port=port)


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


if __name__ == "__main__":
    main()
