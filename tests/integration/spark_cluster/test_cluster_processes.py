"""The local standalone cluster's processes: settings and Java are checked with errors that say what to fix, a
process that dies at start fails the start with its log, everything listens on 127.0.0.1, and on exit every
process (master, workers, the executors they started) is stopped by PID, also when the body raised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from dagster_streamgroup.local import procfs
from dagster_streamgroup.local.spark_cluster import (
    DAEMON_PROPERTIES,
    JavaNotFoundError,
    SparkClusterSettings,
    SparkClusterStartError,
    alive_workers,
    executor_of,
    find_java,
    parse_java_version,
    running_spark_cluster,
)
from dagster_streamgroup.local.spark_connect import stop_process_tree

LOOPBACK = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1 in /proc/net/tcp and tcp6 (mapped)
DRIVER = """
import json, sys
from dagster_streamgroup.dagster.spark_session import StreamSparkResource
spark = StreamSparkResource(master=sys.argv[1], spark_config=json.loads(sys.argv[2])).spark_session
print("ready", spark.range(8).count(), flush=True)
sys.stdin.read()  # hold the application (and its executors) until the test ends this process
"""


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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("workers", 0),
        ("cores_per_worker", 0),
        ("worker_memory", "a lot"),
        ("daemon_memory", "256 MB"),
        ("start_timeout_s", 0),
        ("conf", {"spark.a=b": "c"}),
        ("conf", {"spark.a": "line\nbreak"}),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        SparkClusterSettings(**{field: value})  # type: ignore[arg-type]


def test_pure_helpers() -> None:
    assert parse_java_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert parse_java_version('java version "1.8.0_392"') == 8
    assert parse_java_version('openjdk version "21" 2023-09-19') == 21
    assert parse_java_version("no java here") is None
    status = {
        "workers": [{"id": "w1", "state": "ALIVE"}, {"id": "w2", "state": "DEAD"}, {"id": "w3", "state": "ALIVE"}]
    }
    assert alive_workers(status) == ["w1", "w3"]
    assert alive_workers({}) == []
    executor = [b"/usr/bin/java", b"-cp", b"x", b"org.apache.spark.executor.CoarseGrainedExecutorBackend"]
    assert executor_of([*executor, b"--executor-id", b"3", b"--app-id", b"app-1"]) == ("3", "app-1")
    assert executor_of([b"/usr/bin/java", b"org.apache.spark.deploy.SparkSubmit", b"pyspark-shell"]) is None
    assert DAEMON_PROPERTIES["spark.master.rest.enabled"] == "false"


def test_missing_java_says_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(JavaNotFoundError, match=r"Java not found: install a Java 17\+ runtime .* or set JAVA_HOME"):
        find_java({"PATH": str(tmp_path)})
    with pytest.raises(JavaNotFoundError, match=rf"JAVA_HOME={tmp_path}: no executable bin/java"):
        find_java({"JAVA_HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")})


def test_java_older_than_17_is_refused(tmp_path: Path) -> None:
    """No Java 11 is installed here, so a stand-in ``java`` prints what one would (the only stub in these tests)."""
    (tmp_path / "bin").mkdir()
    java = tmp_path / "bin" / "java"
    java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.22\" 2024-01-16' >&2\n")
    java.chmod(0o755)
    with pytest.raises(JavaNotFoundError, match=r'is openjdk version "11\.0\.22".*needs Java 17 or newer'):
        find_java({"JAVA_HOME": str(tmp_path)})


@pytest.mark.spark_cluster
def test_a_process_that_dies_at_start_fails_the_start_with_its_log() -> None:
    """A heap too small for any JVM: the master exits at once, and the error carries its log's tail."""
    settings = SparkClusterSettings(workers=1, daemon_memory="1k")
    with pytest.raises(SparkClusterStartError) as caught, running_spark_cluster(settings):
        pytest.fail("the cluster started with a 1 KiB heap")
    message = str(caught.value)
    assert "Spark master (pid" in message and "exited with code" in message
    assert "Too small maximum heap" in message or "Error occurred during initialization of VM" in message
    pid = int(message.split("(pid ", 1)[1].split(")", 1)[0])
    assert procfs.alive([pid]) == []


@pytest.mark.spark
@pytest.mark.spark_cluster
@pytest.mark.slow
def test_loopback_only_and_every_process_stopped_by_pid_when_the_body_fails() -> None:
    """A driver in another process holds an application, so the worker runs an executor; the body then raises. The
    master, the worker and the executor all listened on 127.0.0.1 only, and are all gone after the exit."""
    settings = SparkClusterSettings(workers=1)
    seen: dict[str, list[int]] = {}
    scratch: Path | None = None
    driver: subprocess.Popen[str] | None = None
    try:
        with pytest.raises(RuntimeError, match="the test body failed"), running_spark_cluster(settings) as cluster:
            scratch = cluster.scratch
            assert cluster.master is not None
            conf = json.dumps(cluster.application_config())
            driver = subprocess.Popen(
                [sys.executable, "-c", DRIVER, cluster.master_url, conf],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                start_new_session=True,
            )
            assert driver.stdout is not None
            assert driver.stdout.readline().split() == ["ready", "8"]
            executors = cluster.executor_processes()
            assert len(executors) == 1 and executors[0].worker_pid == cluster.workers[0].pid
            seen = {
                "master": [cluster.master.pid],
                "workers": [w.pid for w in cluster.workers],
                "executors": [e.pid for e in executors],
            }
            for role, pids in seen.items():
                addresses = listening_addresses(pids)
                assert addresses and addresses <= LOOPBACK, f"{role} listens on {addresses}"
            raise RuntimeError("the test body failed")
        deadline = time.monotonic() + 10
        while procfs.alive([pid for pids in seen.values() for pid in pids]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert procfs.alive([pid for pids in seen.values() for pid in pids]) == []
        assert scratch is not None and not scratch.exists()
    finally:
        if driver is not None:
            stop_process_tree(driver.pid, timeout_s=10)
