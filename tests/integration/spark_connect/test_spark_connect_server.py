"""The local Spark Connect server against real Spark: it listens on loopback only, serves a Python Data Source
read to a run in another process, shares its Python workers between sessions, stops by PID with nothing left
behind, and its memory guard restarts it only when no client is connected."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.spark_connect import (
    ConnectServerSettings,
    needs_restart,
    run_probe,
    running_connect_server,
)
from dagster_streamgroup.local.spark_connect_server import spark_conf
from dagster_streamgroup.spark.session import LOCAL_CONF

RUN_TIMEOUT_S = 300.0
LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 in /proc/net/tcp and tcp6 (mapped)


def listening_addresses(pids: list[int]) -> set[str]:
    """Local addresses of the TCP sockets in LISTEN state that these processes hold."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:[") : -1])
        except OSError:
            continue
    addresses = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                addresses.add(fields[1].rsplit(":", 1)[0])
    return addresses


def test_guard_rule() -> None:
    assert needs_restart(rss_mb=5000, limit_mb=4096, connections=0)
    assert not needs_restart(rss_mb=5000, limit_mb=4096, connections=1)
    assert not needs_restart(rss_mb=4000, limit_mb=4096, connections=0)
    assert not needs_restart(rss_mb=5000, limit_mb=None, connections=0)


def test_server_sessions_compute_as_local_sessions_do() -> None:
    """A run gives the same results (session time zone) and task counts (shuffle partitions) whether its
    Spark is the Connect server or a local session; the caller's extra conf still wins."""
    conf = spark_conf(
        15002, master="local[2]", driver_memory="2g", isolate_sessions=False, local_dir=None,
        extra={"spark.sql.shuffle.partitions": "16"},
    )  # fmt: skip
    for key, value in LOCAL_CONF.items():
        expected = "16" if key == "spark.sql.shuffle.partitions" else value
        assert conf[key] == expected, key
    assert conf["spark.connect.grpc.binding.address"] == "127.0.0.1"


@pytest.mark.parametrize(
    ("field", "value"),
    [("driver_memory", "two gigs"), ("rss_limit_mb", 0), ("check_interval_s", -1), ("master", "")],
)
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        ConnectServerSettings(**{field: value})  # type: ignore[arg-type]


@pytest.mark.spark
@pytest.mark.slow
def test_server_serves_runs_on_loopback_and_stops_clean() -> None:
    with running_connect_server() as server:
        assert server.remote == f"sc://127.0.0.1:{server.port}"
        assert server.warm_up_result is not None and server.warm_up_result["rows"] == 1000
        tree = procfs.process_tree(server.pid)
        daemons_after_warm_up = len(tree)

        first = run_probe(server.remote, RUN_TIMEOUT_S)
        second = run_probe(server.remote, RUN_TIMEOUT_S, rows=5)
        assert (first["rows"], second["rows"]) == (1000, 5)
        # Sessions share the warm Python daemons instead of each starting its own set.
        assert len(procfs.process_tree(server.pid)) <= daemons_after_warm_up + 2

        tree = procfs.process_tree(server.pid)
        addresses = listening_addresses(tree)
        assert addresses, "the server tree holds no listening socket"
        assert addresses <= LOOPBACK, f"listening beyond 127.0.0.1: {addresses}"
        assert len(tree) > 2  # the driver, its JVM, and Python daemons
    assert procfs.alive(tree) == []


@pytest.mark.spark
@pytest.mark.slow
def test_memory_guard_restarts_only_when_no_client_is_connected() -> None:
    settings = ConnectServerSettings(rss_limit_mb=1, check_interval_s=3600, warm_up=False)
    with running_connect_server(settings=settings) as server:
        first_pid = server.pid
        first_tree = procfs.process_tree(first_pid)
        with socket.create_connection(("127.0.0.1", server.port)):
            deadline = time.monotonic() + 10
            while server.active_connections() == 0 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert server.active_connections() >= 1
            assert server.check_memory() is False  # over the limit, but a client is connected
            assert server.pid == first_pid
        deadline = time.monotonic() + 10
        while server.active_connections() > 0 and time.monotonic() < deadline:
            time.sleep(0.05)

        assert server.check_memory() is True
        assert server.restarts == 1
        assert server.pid != first_pid
        assert procfs.alive(first_tree) == []
        after = run_probe(server.remote, RUN_TIMEOUT_S)
        assert after["rows"] == 1000
        second_tree = procfs.process_tree(server.pid)
    assert procfs.alive(second_tree) == []
