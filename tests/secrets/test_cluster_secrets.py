"""What a standalone Spark cluster shows of a secret option: a run's read with the SASL password from
``dagster.EnvVar``, through each reader (the Python source's ``kafka.sasl.password`` option, Spark's Kafka source's
``kafka.sasl.jaas.config``), on the local standalone cluster (a master, two workers, executors in other
processes); then the application's UI and REST API while it runs, its event log, the master's UI, and every file
of the cluster (the master's and workers' logs, the executors' stdout and stderr in the workers' directories) are
searched for the password (as written, hex and base64)."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import SparkSession

from dagster_streamgroup.dagster import KafkaStreamGroup
from dagster_streamgroup.dagster.spark_session import StreamSparkResource
from dagster_streamgroup.local.kafka_broker import BrokerInfo, free_port
from dagster_streamgroup.local.kafka_data import produce_sample
from dagster_streamgroup.local.spark_cluster import SparkCluster
from tests.fixtures.kafka import SASL_PASSWORD, SASL_USER, TopicFactory
from tests.secrets.evidence import event_log_evidence, spark_ui_evidence
from tests.secrets.leaks import Evidence, describe, find_secrets

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.spark_cluster, pytest.mark.slow]

PASSWORD_ENV = "STREAMGROUP_TEST_CLUSTER_SASL_PASSWORD"


def test_a_read_on_the_standalone_cluster_shows_no_secret_in_its_ui_event_log_or_files(
    kafka_broker: BrokerInfo,
    kafka_topics: TopicFactory,
    spark_cluster: SparkCluster,
    classic_sessions: Callable[[StreamSparkResource], AbstractContextManager[SparkSession]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if kafka_broker.sasl_bootstrap is None:
        pytest.skip("the external cluster named by STREAMGROUP_KAFKA_BOOTSTRAP has no SASL_SSL listener of ours")
    topic = kafka_topics(2)
    ends = produce_sample(kafka_broker.bootstrap, topic, 2, 600)
    monkeypatch.setenv(PASSWORD_ENV, SASL_PASSWORD)
    events = tmp_path / "events"
    events.mkdir()
    ui_port = free_port()
    spark_resource = StreamSparkResource(
        master=spark_cluster.master_url,
        spark_config={
            **spark_cluster.application_config(),
            "spark.ui.enabled": "true",
            "spark.ui.port": str(ui_port),
            "spark.eventLog.enabled": "true",
            "spark.eventLog.dir": str(events),
        },
    )
    evidence = Evidence()
    counts: dict[str, object] = {}
    with classic_sessions(spark_resource) as spark:
        for reader in ("python", "spark-kafka"):
            resource = KafkaStreamGroup(
                group=f"cluster-secrets-{reader}",
                bootstrap_servers=str(kafka_broker.sasl_bootstrap),
                topics=[topic],
                security_protocol="SASL_SSL",
                sasl_mechanism="SCRAM-SHA-512",
                sasl_username=SASL_USER,
                sasl_password=dg.EnvVar(PASSWORD_ENV),
                ssl_ca_location=str(kafka_broker.ca_file),
                store_url=f"sqlite:///{tmp_path / 'state.db'}",
                spark_reader=reader,
            ).process_config_and_initialize()
            df = resource.read_ranges(spark, {f"{topic}:{p}": (0, end) for p, end in ends.items()})
            assert df.count() == sum(ends.values()), reader
            evidence.add(f"explain ({reader})", df._jdf.queryExecution().toString())
        counts["application ui"] = spark_ui_evidence(f"http://127.0.0.1:{ui_port}", evidence, connect=False)
        for path in ("/", "/json/"):
            with urllib.request.urlopen(f"{spark_cluster.webui_url}{path}", timeout=30) as response:
                evidence.add(f"master ui: {path}", response.read())
    counts["event logs"] = event_log_evidence(events, evidence)
    evidence.add_tree(spark_cluster.scratch)
    executor_logs = [p for p in evidence.files if p.name in {"stdout", "stderr"}]
    assert counts["event logs"] == 1 and executor_logs, (counts, evidence.summary())
    shown = b"".join(text for where, text in evidence.texts.items() if where.startswith("spark ui"))
    assert b"kafka.sasl.password" in shown or b"sasl.jaas.config" in shown or b"redacted" in shown, counts
    findings = find_secrets(evidence, {"sasl_password": SASL_PASSWORD})
    assert not findings, f"secrets found ({counts}):\n{describe(findings)}"
