"""``streamgroup local registry`` as a user runs it: Apicurio Registry's application on a loopback port, answering
Confluent's API to confluent-kafka's own client (a schema registered, BACKWARD compatibility refusing a change), and
stopped by Ctrl-C with its process gone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from dagster_streamgroup.local.kafka_broker import free_port
from dagster_streamgroup.local.schema_registry import RegistryNotInstalledError, answers, registry_home, registry_java
from tests.fixtures.required import missing


def test_streamgroup_local_registry_serves_confluents_api_until_ctrl_c(tmp_path: Path) -> None:
    try:
        registry_home()
        registry_java()
    except RegistryNotInstalledError as exc:
        missing("registry", str(exc))
    port = free_port()
    streamgroup = Path(sys.executable).parent / "streamgroup"
    log = (tmp_path / "registry.out").open("wb")
    proc = subprocess.Popen([str(streamgroup), "local", "registry", "--port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}/apis/ccompat/v7"
    try:
        deadline = time.monotonic() + 90
        while not answers(url):
            assert proc.poll() is None, (tmp_path / "registry.out").read_text()
            assert time.monotonic() < deadline, "the registry did not answer within 90 s"
            time.sleep(0.3)
        client = SchemaRegistryClient({"url": url})
        first = {"type": "record", "name": "A", "fields": [{"name": "x", "type": "int"}]}
        schema_id = client.register_schema("a-value", Schema(json.dumps(first), "AVRO"))
        assert client.get_latest_version("a-value").schema_id == schema_id
        breaking = {"type": "record", "name": "A", "fields": [{"name": "y", "type": "int"}]}
        with pytest.raises(SchemaRegistryError) as refused:
            client.register_schema("a-value", Schema(json.dumps(breaking), "AVRO"))
        assert refused.value.http_status_code == 409, "BACKWARD, as Confluent's registry defaults to"
        printed = (tmp_path / "registry.out").read_text()
        assert f"Confluent API) at {url}" in printed and "Ctrl-C stops it" in printed
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
    assert not answers(url), "stopped with its JVM"
