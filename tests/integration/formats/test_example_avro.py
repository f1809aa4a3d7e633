"""The example's Avro variant (``FORMAT=avro bash scripts/example.sh``): its producer, run as the script runs it,
registers the events' schema and writes Avro through confluent-kafka's serializer; the example's computation reads
the typed records as it reads the JSON ones. The script refuses a bad FORMAT before any set-up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamRange, StreamSparkResource
from jobs.clickstream import page_views
from jobs.clickstream_events import PAGES
from tests.fixtures.kafka import TopicFactory, unique_name

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FORMAT": "xml"}, "example: FORMAT must be json or avro, got 'xml'"),
        ({"FORMAT": "avro", "STREAM": "v3io"}, "example: FORMAT=avro needs STREAM=kafka"),
    ],
)
def test_the_example_refuses_a_bad_format_at_once(env: dict[str, str], message: str) -> None:
    done = subprocess.run(["bash", str(ROOT / "scripts/example.sh")], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2 and message in done.stderr
    assert "setup:" not in done.stdout + done.stderr


def test_the_examples_avro_events_read_as_typed_rows(
    kafka_bootstrap: str, kafka_topics: TopicFactory, registry_url: str, tmp_path: Path
) -> None:
    topic = unique_name("clicks-avro")
    producer = [sys.executable, "-m", "jobs.clickstream_events", "--bootstrap", kafka_bootstrap, "--topic", topic,
                "--partitions", "2", "--rate", "200", "--seconds", "1",
                "--format", "avro", "--registry", registry_url]  # fmt: skip
    done = subprocess.run(producer, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    kafka_topics.created.append(topic)
    assert done.returncode == 0, done.stderr
    assert f"as Avro ({registry_url})" in done.stdout
    resource = KafkaStreamGroup(
        group="clickstream", bootstrap_servers=kafka_bootstrap, topics=[topic], value_format="avro",
        schema_registry_url=registry_url, store_url=f"sqlite:///{tmp_path / 'state.db'}",
    )  # fmt: skip
    ends = resource.backend().watermarks([f"{topic}:0", f"{topic}:1"])
    ranges = {shard: (0, marks.high) for shard, marks in ends.items()}
    records = sum(end for _, end in ranges.values())
    assert records >= 200
    spark = StreamSparkResource(master="local[1]").spark_session
    df = resource.read_ranges(spark, ranges)
    assert df.schema["value"].dataType.simpleString() == "struct<user:string,page:string,ts:bigint,referrer:string>"
    rows = page_views(df, [StreamRange(s, a, b) for s, (a, b) in ranges.items()]).collect()
    assert sum(r["views"] for r in rows) == records, "every event counted, as its JSON twin would be"
    assert {r["page"] for r in rows} <= set(PAGES)
