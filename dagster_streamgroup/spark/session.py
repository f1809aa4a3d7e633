"""A local SparkSession that works on a developer machine and in tests.

Python workers must run the interpreter that has this package and confluent-kafka installed, which Spark
takes only from ``PYSPARK_PYTHON`` (the ``spark.pyspark.python`` setting did not help); Spark must listen
on loopback only, and needs no UI for batch reads."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from dagster_streamgroup.redact import read
from dagster_streamgroup.spark.connector import with_spark_format_jars, with_spark_kafka_jars
from dagster_streamgroup.spark.redaction import with_string_redaction

DEFAULT_CONNECT_PORT = 15002
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    # A run's log is the product's lines: no console progress bars from the driver (the UI shows the jobs).
    "spark.ui.showConsoleProgress": "false",
}

LOG4J2_CONFIG = Path(__file__).with_name("log4j2.properties")
"""A local driver's log settings: Spark's defaults without its start-up banner and Hadoop's native-library
warning, which every run process printed to the ``dg dev`` console."""


ARROW_JAVA_OPTIONS = "-Darrow.enable_unsafe_memory_access=true -Darrow.enable_null_check_for_get=false"
"""Our sources hand Spark Arrow batches, which its JVM copies value by value into rows. Arrow Java checks bounds,
reference counts and nulls on every such read unless told not to (its documented throughput switches): those
checks were about a sixth of the JVM's CPU in a profile (JFR) of a range read."""


def with_arrow_java_options(conf: Mapping[str, str]) -> dict[str, str]:
    """``conf`` with ``ARROW_JAVA_OPTIONS`` ahead of any ``spark.driver.extraJavaOptions`` and
    ``spark.executor.extraJavaOptions`` of the caller (a later ``-D`` of the same property wins, so the caller
    keeps the last word). The executors read the ranges on a cluster."""
    out = dict(conf)
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        own = conf.get(key, "").strip()
        out[key] = f"{ARROW_JAVA_OPTIONS} {own}".strip()
    return out


LOOPBACK_DRIVER = ("spark.driver.host", "spark.driver.bindAddress")


def session_conf(master: str, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of a classic session: loopback only for a local master; on a cluster the driver must be
    reachable from executors on other hosts, so its address is left to Spark (or the caller's ``conf``). Spark's
    own Kafka source is on the classpath where the project fetched it (``with_spark_kafka_jars``)."""
    base = dict(LOCAL_CONF)
    given = dict(conf or {})
    if not master.startswith("local"):
        for key in LOOPBACK_DRIVER:
            base.pop(key)
    else:  # the driver is this host's: its log settings ahead of the caller's (a later -D wins)
        own = given.get("spark.driver.extraJavaOptions", "").strip()
        given["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()} {own}".strip()
    return with_spark_format_jars(
        with_spark_kafka_jars(with_string_redaction(with_arrow_java_options({**base, **given})))
    )


class SparkConnectUnavailableError(ConnectionError):
    """The Spark Connect server a run needs does not accept connections."""


def connect_address(remote: str, field: str = "remote") -> tuple[str, int]:
    """(host, port) of a Spark Connect URL ``sc://host[:port][/;param=value...]`` (15002 by default). A URL the
    redaction cannot read (a ``;`` right after the port, an ``@``) is refused: Spark's client would quote its
    parameters, a token among them, in its error."""
    reading = read(remote)
    authority = remote.removeprefix("sc://").split("/", 1)[0]
    host, sep, port = authority.rpartition(":")
    if not sep:
        host, port = authority, str(DEFAULT_CONNECT_PORT)
    if not reading.well_formed or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}: {reading.shown!r} is not sc://HOST[:PORT][/;param=value...]")
    return host.strip("[]"), int(port)


def shown_remote(remote: str) -> str:
    """A Connect URL as it may be shown: its token (``;token=...``) hidden (``redact``)."""
    return read(remote).shown


def wait_for_connect_server(remote: str, timeout_s: float, *, poll_s: float = 0.5) -> None:
    """Return once the Connect server accepts a TCP connection, or raise after ``timeout_s``.

    The Connect client retries an unreachable server for about ten minutes before it fails, so a run started
    while the server is down would hang that long and then fail with a gRPC error. Waiting here covers a
    server restart (about 20 s) and otherwise fails soon, naming the server."""
    host, port = connect_address(remote)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, max(timeout_s, 0.1))):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise SparkConnectUnavailableError(
                    f"remote: the Spark Connect server {shown_remote(remote)} does not accept connections "
                    f"({exc.strerror or exc}) after {timeout_s:g} s; start it (streamgroup local spark-connect "
                    f"--port {port}) or point remote at a running one. Nothing was read or committed."
                ) from None
        time.sleep(poll_s)


def prepare_environment() -> None:
    """Point Spark's Python workers at this interpreter and keep Spark on 127.0.0.1 (unless already set)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def local_spark_session(
    master: str = "local[2]", app_name: str = "dagster-streamgroup", conf: Mapping[str, str] | None = None
) -> SparkSession:
    """Build (or get) a local session with the data sources of this package registered."""
    prepare_environment()
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in session_conf(master, conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    from dagster_streamgroup.spark.kafka_source import register

    register(spark)
    return spark
