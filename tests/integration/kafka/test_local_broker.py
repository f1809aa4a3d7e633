"""The local Apache Kafka launcher (KRaft, one node, from the fetched jars) and the data producer."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from dagster_streamgroup.local.kafka_broker import (
    LIBS_ENV,
    SASL_PASSWORD_ENV,
    BrokerInfo,
    BrokerStartError,
    KafkaNotInstalledError,
    LocalKafka,
    free_port,
    kafka_libs,
    running_broker,
    wait_until_answering,
)
from dagster_streamgroup.local.kafka_data import create_topics, produce_sample
from dagster_streamgroup.streams.kafka import KafkaBackend
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from tests.fixtures.kafka import TopicFactory
from tests.secrets.proc import CommandLineSampler, environment

pytestmark = pytest.mark.kafka


def test_a_broker_starts_on_a_free_loopback_port_and_is_stopped_by_pid() -> None:
    with running_broker() as broker:
        assert broker.bootstrap.startswith("127.0.0.1:")
        assert broker.pid is not None
        os.kill(broker.pid, 0)  # alive
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=10)
        assert [b.host for b in metadata.brokers.values()] == ["127.0.0.1"]
        assert broker.startup_s is not None and broker.startup_s > 0
        assert broker.data_dir is not None and (broker.data_dir / "log" / "meta.properties").is_file()
        java = Path(f"/proc/{broker.pid}/cmdline").read_bytes().split(b"\0")
        assert b"-Xmx512m" in java and b"kafka.Kafka" in java  # a bounded heap, the real broker's entry point
    with pytest.raises(ProcessLookupError):
        os.kill(broker.pid, 0)


def test_a_broker_killed_and_started_again_keeps_what_it_acknowledged(tmp_path: Path) -> None:
    broker = LocalKafka(tmp_path / "kafka")
    try:
        broker.start()
        create_topics(broker.bootstrap, {"kept": 1})
        producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all"})
        for i in range(100):
            producer.produce("kept", f"r{i}".encode(), partition=0)
        assert producer.flush(30) == 0
        del producer
        port, first_pid = broker.port, broker.pid
        broker.kill()
        broker.start()
        assert broker.port == port and broker.pid != first_pid
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "check", "enable.auto.commit": False})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition("kept", 0), timeout=30)
            assert (low, high) == (0, 100)
        finally:
            consumer.close()
    finally:
        broker.stop()


def test_missing_jars_fail_with_the_set_up_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("dagster_streamgroup.local.kafka_broker.PROJECT_ROOT", tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(LIBS_ENV, raising=False)
    with pytest.raises(KafkaNotInstalledError, match=r"scripts/setup\.sh"):
        kafka_libs()


def _sasl_client(broker: BrokerInfo, password: str, ca: Path | None) -> dict[str, str | int]:
    config: dict[str, str | int] = {
        "bootstrap.servers": str(broker.sasl_bootstrap),
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "svc",
        "sasl.password": password,
        "socket.timeout.ms": 5000,
    }
    if ca is not None:
        config["ssl.ca.location"] = str(ca)
    return config


def test_the_sasl_ssl_listener_takes_the_scram_user_and_refuses_a_wrong_password_or_an_untrusted_ca(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The password reaches the broker in an admin request only: no command line of the start holds it (the
    format step used to take it as ``--add-scram``, where ``ps`` showed it), and the JVM's environment holds
    neither the CLI's variable nor another that a user exported it in."""
    right = secrets.token_urlsafe(18)
    monkeypatch.setenv(SASL_PASSWORD_ENV, right)
    monkeypatch.setenv("STREAMGROUP_TEST_EXPORTED_PASSWORD", right)
    with CommandLineSampler(interval_s=0.02) as sampler, running_broker(sasl_users={"svc": right}) as broker:
        assert broker.sasl_bootstrap is not None and broker.ca_file is not None and broker.pid is not None
        jvm_environment = environment(broker.pid)
        ok = AdminClient(_sasl_client(broker, right, broker.ca_file))
        assert ok.list_topics(timeout=20).brokers
        for password, ca in (("wrong-password", broker.ca_file), (right, None)):
            refused = AdminClient(_sasl_client(broker, password, ca))
            started = time.monotonic()
            with pytest.raises(KafkaException):
                refused.list_topics(timeout=5)
            assert time.monotonic() - started < 10
    assert jvm_environment is not None and "PATH" in jvm_environment  # read: the check below can fail
    assert right not in "\n".join(f"{k}={v}" for k, v in jvm_environment.items())
    assert SASL_PASSWORD_ENV not in jvm_environment and "STREAMGROUP_TEST_EXPORTED_PASSWORD" not in jvm_environment
    formats = [line for line in sampler.lines if b"kafka.tools.StorageTool" in line]
    assert formats, f"the format step was not seen in {sampler.samples} samples"
    assert not [line for line in sampler.lines if right.encode() in line]


def test_waiting_for_a_broker_that_is_not_listening_logs_no_connection_errors(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """librdkafka writes a "Connection refused" line to stderr for each reconnect of a client created too
    early; on every start of the example those lines read like a failure."""
    silent = f"127.0.0.1:{free_port()}"
    with pytest.raises(BrokerStartError, match="nothing listens on the port"):
        wait_until_answering(silent, timeout_s=0.5)
    with running_broker() as broker:
        pass
    # stderr is the whole process's: clients of other tests log about their own addresses
    ours = [line for line in capfd.readouterr().err.splitlines() if silent in line or broker.bootstrap in line]
    assert not [line for line in ours if "Connection refused" in line]


def test_sample_data_ends_each_partition_so_watermarks_are_exact(
    kafka_bootstrap: str, kafka_topics: TopicFactory
) -> None:
    topic = kafka_topics(4)
    ends = produce_sample(kafka_bootstrap, topic, 4, 20_000, value_size=10)
    assert sum(ends.values()) == 20_004  # the records plus one trailing record per partition
    backend = KafkaBackend(KafkaStreamConfig(bootstrap_servers=kafka_bootstrap, topics=[topic]))
    marks = backend.watermarks(backend.shards())
    assert {int(s.rsplit(":", 1)[1]): m.high for s, m in marks.items()} == ends


def test_a_broker_dies_with_the_process_that_started_it() -> None:
    """A test process that crashes (a segfault in a client library, SIGKILL) must leave no broker running."""
    import subprocess
    import sys

    code = (
        "import os\nfrom dagster_streamgroup.local.kafka_broker import running_broker\n"
        "with running_broker() as broker:\n    print(broker.pid, flush=True)\n    os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    pid = int(done.stdout.strip().splitlines()[-1])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text(errors="replace"):
        assert time.monotonic() < deadline, f"broker {pid} outlived the process that started it"
        time.sleep(0.1)
