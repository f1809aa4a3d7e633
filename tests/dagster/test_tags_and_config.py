"""Pure parts of the Dagster layer: range keys, run tags, and resource validation that names the field."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupConfigError, StreamSparkResource, V3ioStreamGroup
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.protocol import Launch
from dagster_streamgroup.spark.redaction import SECRET_REDACTION_REGEX, STRING_REDACTION_KEY


def launch(**overrides: object) -> Launch:
    fields: dict[str, object] = {
        "group": "g",
        "shard": "clicks:3",
        "start": 100,
        "end": 250,
        "attempt": 1,
        "epoch": 4,
        "member_id": "g_member_0",
        "run_key": "g:clicks:3:100-250:a1",
    }
    fields.update(overrides)
    return Launch.model_validate(fields)


def test_partitions_are_shards_and_run_keys_name_ranges_attempts_and_epochs() -> None:
    assert sgt.partitions_def_name("click-stream") == "click_stream_shards"
    single = launch(run_key="g:clicks:3:100-250:a1:e4")
    assert sgt.dagster_run_key([single]) == "g:clicks:3:100-250:a1:e4"
    # a range recorded in flight before run keys carried the epoch keeps the Dagster key its run had
    assert sgt.dagster_run_key([launch()]) == "g:clicks:3:100-250:a1:e4"
    batch = [
        launch(shard="clicks:3", run_key="g:g_member_0:2r:abc"),
        launch(shard="clicks:4", run_key="g:g_member_0:2r:abc"),
    ]
    assert sgt.dagster_run_key(batch) == "g:g_member_0:2r:abc"
    tags = sgt.run_tags(batch)
    assert tags == {sgt.TAG_GROUP: "g", sgt.TAG_MEMBER: batch[0].member_id}  # filters, no per-run figures
    assert sgt.run_tags([single]) == {sgt.TAG_GROUP: "g", sgt.TAG_MEMBER: single.member_id, sgt.TAG_SHARD: "clicks:3"}


def test_run_config_carries_the_commit_identity() -> None:
    batch = [launch(shard="clicks:3", run_key="k"), launch(shard="clicks:4", epoch=7, run_key="k")]
    config = sgt.run_config(batch)
    reports = sgt.member_reports(config, "g", sgt.run_tags(batch))
    assert reports is not None
    assert [(r.shard, r.member_id, r.epoch, r.start, r.end, r.run_key) for r in reports] == [
        ("clicks:3", "g_member_0", 4, 100, 250, "k"),
        ("clicks:4", "g_member_0", 7, 100, 250, "k"),
    ]


def test_backfills_commit_nothing() -> None:
    ranges = [sgt.RangeSpec(shard="clicks:3", start=0, end=10)]
    assert sgt.member_reports(sgt.StreamRunConfig(ranges=ranges), "g", {}) is None
    config = sgt.run_config([launch(run_key="k")])
    assert sgt.member_reports(config, "g", {**sgt.run_tags([launch()]), sgt.TAG_BACKFILL: "true"}) is None
    assert sgt.ranges_from_backfill_tags(["clicks:3"], sgt.backfill_tags("g", "clicks:3", 5, 9)) == [
        sgt.RangeSpec(shard="clicks:3", start=5, end=9)
    ]


@pytest.mark.parametrize(
    ("tags", "words"),
    [
        ({}, "needs the offset range"),
        ({sgt.TAG_START: "a", sgt.TAG_END: "9"}, "must be integers"),
        ({sgt.TAG_START: "9", sgt.TAG_END: "5"}, "0 <= start <= end"),
    ],
)
def test_a_backfill_of_shard_partitions_without_a_valid_range_is_refused(tags: dict[str, str], words: str) -> None:
    with pytest.raises(sgt.RangeTagsError, match=words):
        sgt.ranges_from_backfill_tags(["clicks:3"], tags)


def test_mismatched_or_partial_identities_refuse_to_commit() -> None:
    config = sgt.run_config([launch(run_key="k")])
    with pytest.raises(sgt.RangeTagsError, match="run tags name member"):
        sgt.member_reports(config, "g", {sgt.TAG_MEMBER: "someone_else"})
    with pytest.raises(sgt.RangeTagsError, match="run tags name group"):
        sgt.member_reports(config, "g", {sgt.TAG_GROUP: "other"})
    with pytest.raises(sgt.RangeTagsError, match="no run_key"):
        sgt.member_reports(config.model_copy(update={"run_key": None}), "g", {})
    with pytest.raises(sgt.RangeTagsError, match="one range per shard"):
        sgt.check_ranges([sgt.RangeSpec(shard="s", start=0, end=1), sgt.RangeSpec(shard="s", start=1, end=2)])


def kafka_group(**overrides: object) -> KafkaStreamGroup:
    fields: dict[str, object] = {"group": "g", "bootstrap_servers": "127.0.0.1:9092", "topics": ["clicks"]}
    fields.update(overrides)
    return KafkaStreamGroup(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"bootstrap_servers": "nohost"}, "bootstrap_servers"),
        ({"topics": ["bad topic"]}, "topics"),
        ({"session_timeout_s": 5.0, "heartbeat_interval_s": 5.0}, "session_timeout_s"),
        ({"max_records_per_run": 0}, "max_records_per_run"),
        ({"security_protocol": "SASL_SSL"}, "sasl_mechanism"),
        ({"properties": {"sasl.password": "x"}}, "properties"),
        ({"group": " "}, "group"),
        ({"store_url": "mysql://u:p@db/x"}, "store_url: mysql://***@db/x is not a state store URL"),
        ({"store_url": "v3io"}, "store_url: 'v3io' keeps the state next to a v3io stream"),
        ({"store_url": "memory://"}, "store_url: memory:// keeps the state inside one process"),
        # malformed URLs of known schemes fail at load too, not at the first tick
        ({"store_url": "sqlite://"}, "store_url: store URL 'sqlite://': a SQLite store needs a file path"),
        ({"store_url": "sqlite:///:memory:"}, "a SQLite store needs a file path"),
        ({"store_url": "postgresql://u:pw:x@h:port/db"}, "store_url: store URL postgresql://*** is not a URL"),
        ({"store_url": "v3io://h:1/c?foo=1"}, "store_url: v3io://h:1/c?***: unknown option(s) ['foo']"),
        ({"store_url": "v3io://h:1"}, "store_url: v3io://h:1: expected v3io://HOST[:PORT]/CONTAINER"),
    ],
)
def test_config_errors_name_the_field(overrides: dict[str, object], field: str) -> None:
    with pytest.raises((ValidationError, StreamGroupConfigError)) as info:
        kafka_group(**overrides)
    assert field in str(info.value)


def test_secrets_stay_out_of_reprs_and_errors() -> None:
    secret = "hunter2-very-secret"
    ok = kafka_group(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u", sasl_password=secret)
    assert secret not in repr(ok)
    assert secret not in str(ok)
    with pytest.raises((ValidationError, StreamGroupConfigError)) as info:
        kafka_group(security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_password=secret)
    assert "sasl_username" in str(info.value)
    assert secret not in str(info.value)


def test_env_var_secrets_resolve_at_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    resource = kafka_group(
        security_protocol="SASL_SSL", sasl_mechanism="PLAIN", sasl_username="u", sasl_password=dg.EnvVar("SG_PW")
    )
    monkeypatch.setenv("SG_PW", "from-env")
    resolved = resource.process_config_and_initialize()
    assert resolved.stream_config().client_config()["sasl.password"] == "from-env"
    assert "from-env" not in repr(resolved)


def test_spark_resource_targets() -> None:
    local = StreamSparkResource()
    assert local.effective_config()["spark.master"] == "local[*]"
    assert local.effective_config()["spark.driver.bindAddress"] == "127.0.0.1"
    remote = StreamSparkResource(remote="sc://127.0.0.1:15002")
    assert remote.effective_config() == {
        "spark.remote": "sc://127.0.0.1:15002",
        STRING_REDACTION_KEY: SECRET_REDACTION_REGEX,  # the server's plan texts hide our secret options
    }
    with pytest.raises(ValidationError, match="remote"):
        StreamSparkResource(remote="http://x")


def test_a_rotated_v3io_key_file_gets_new_clients(tmp_path: Path) -> None:
    """The code server lives long; clients built with the old key must not outlive a rotation."""
    key_file = tmp_path / "access-key"
    key_file.write_text("first-key")
    resource = V3ioStreamGroup(
        group="g", endpoint="http://127.0.0.1:1", container="c", stream_path="s", access_key_file=str(key_file)
    )
    before = resource.backend()
    assert resource.backend() is before
    key_file.write_text("rotated-key")
    after = resource.backend()
    assert after is not before
    assert resource.backend() is after


def test_a_rotated_kafka_password_replaces_the_cached_client(tmp_path: Path) -> None:
    """Each rotation used to add a client beside the old one: a code server that lives for days kept every
    AdminClient, with its threads and sockets, that it had ever built."""
    from dagster_streamgroup.dagster import resources

    password_file = tmp_path / "sasl-password"
    password_file.write_text("first")
    resource = kafka_group(
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="u",
        sasl_password_file=str(password_file),
    )
    before = resource.backend()
    cached = len(resources._backends)
    for rotation in range(3):
        password_file.write_text(f"rotated-{rotation}")
        assert resource.backend() is not before
        before = resource.backend()
    assert len(resources._backends) == cached


def test_fields_from_env_vars_are_checked_when_they_resolve() -> None:
    """An EnvVar reaches the validators as its variable's name: checking that name would refuse every
    deployment that passes, say, a PostgreSQL URL with its password the recommended way."""
    resource = kafka_group(
        store_url=dg.EnvVar("STREAMGROUP_TEST_STATE_URL"), bootstrap_servers=dg.EnvVar("STREAMGROUP_TEST_BOOTSTRAP")
    )
    assert isinstance(resource.store_url, dg.EnvVar) and isinstance(resource.bootstrap_servers, dg.EnvVar)
    with pytest.raises((ValidationError, StreamGroupConfigError), match="store_url"):
        kafka_group(store_url="STREAMGROUP_TEST_STATE_URL")  # the same text, given literally, is checked


def test_a_runs_ranges_read_as_a_table_on_its_run_page() -> None:
    from dagster_streamgroup.dagster.assets import ranges_table

    table = ranges_table(
        [
            sgt.RangeSpec(shard="clicks:3", start=100, end=250, attempt=1, epoch=4),
            sgt.RangeSpec(shard="clicks:12", start=0, end=7),
        ]
    )
    assert table.splitlines() == [
        "shard      start  end  records  attempt",
        "clicks:3     100  250      150        1",
        "clicks:12      0    7        7        0",
    ]
