"""The Spark Connect server process: ``python -m dagster_streamgroup.local.spark_connect_server --port P ...``.

Why not ``sbin/start-connect-server.sh``: its main class (``SparkConnectServer``) forces
``spark.sql.artifact.isolation.enabled=true``. With isolation on, every Connect session gets its own artifact
UUID, Spark keys its Python worker factories by the worker environment (which then includes that UUID), and so
every session starts new Python daemons (data-source planning, creation and the task workers) that stay
until the server stops (SPARK-54055, not fixed in Spark 4.3). That costs a few seconds on each run's first
Python Data Source read and ~400 MiB of RSS per run. Here the same Connect service is started by its
driver plugin (``SparkConnectPlugin``) in a classic driver whose sessions are not artifact-isolated, so all
sessions share one set of warm Python daemons. The price: artifacts added with ``addArtifacts`` are visible
to every session of this server, which is acceptable for a local, single-user server.

The process stops Spark cleanly on SIGTERM/SIGINT and exits on its own when its parent goes away, so a
crashed supervisor does not leave a JVM behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from dagster_streamgroup.spark.connector import with_spark_format_jars, with_spark_kafka_jars
from dagster_streamgroup.spark.redaction import with_string_redaction
from dagster_streamgroup.spark.session import LOCAL_CONF, with_arrow_java_options

PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
HOST = "127.0.0.1"


def spark_conf(
    port: int, *, master: str, driver_memory: str, isolate_sessions: bool, local_dir: str | None, extra: dict[str, str]
) -> dict[str, str]:
    """The driver configuration: the local session defaults (loopback only, no UI, UTC, a few shuffle
    partitions: a run's Spark work gives the same results and task counts over Connect as in a local session),
    the Connect plugin, the isolation choice above, and Arrow Java's unchecked reads
    (``with_arrow_java_options``) and Spark's own Kafka source where it was fetched (``with_spark_kafka_jars``).
    ``extra`` wins over these defaults."""
    conf = {
        **LOCAL_CONF,
        "spark.master": master,
        "spark.app.name": "streamgroup-spark-connect",
        "spark.driver.memory": driver_memory,
        "spark.plugins": PLUGIN,
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.log.level": "WARN",
        "spark.sql.artifact.isolation.enabled": "true" if isolate_sessions else "false",
    }
    if local_dir:
        conf["spark.local.dir"] = local_dir
    conf.update(extra)
    return with_spark_format_jars(with_spark_kafka_jars(with_string_redaction(with_arrow_java_options(conf))))


def _parse_conf(items: Sequence[str]) -> dict[str, str]:
    conf = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--conf must be KEY=VALUE, got {item!r}")
        conf[key.strip()] = value
    return conf


def _watch_parent(parent: int, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        if os.getppid() != parent:
            stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--isolate-sessions", action="store_true")
    parser.add_argument("--local-dir", default=None)
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", HOST)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=_watch_parent, args=(os.getppid(), stop), daemon=True).start()

    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    conf = spark_conf(
        args.port,
        master=args.master,
        driver_memory=args.driver_memory,
        isolate_sessions=args.isolate_sessions,
        local_dir=args.local_dir,
        extra=_parse_conf(args.conf),
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    print(f"spark connect server on sc://{HOST}:{args.port} (pid {os.getpid()})", flush=True)
    try:
        while not stop.wait(3600):
            pass
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
