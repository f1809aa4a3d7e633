"""Pure parts of the Dagster layer: range keys, run tags, and resource validation that names the field."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_streamgroup.dagster import KafkaStreamGroup, StreamGroupConfigError, StreamSparkResource, V3ioStreamGroup
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.protocol import Launch


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


def test_range_key_round_trips_shards_with_colons() -> None:
    key = sgt.range_partition_key("clicks:3", 100, 250)
    assert key == "clicks:3:100-250"
    assert sgt.parse_range_partition_key(key) == ("clicks:3", 100, 250)


@pytest.mark.parametrize("key", ["clicks", "clicks:3", "clicks:3:100", "clicks:3:a-b", ":1-2", "s:5-4"])
def test_bad_range_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match="partition key"):
        sgt.parse_range_partition_key(key)


def test_tags_carry_the_commit_identity() -> None:
    item = launch()
    tags = sgt.launch_tags(item)
    report = sgt.report_from_tags(tags, "clicks:3", 100, 250)
    assert report is not None
    assert (report.member_id, report.epoch, report.run_key) == ("g_member_0", 4, item.run_key)
    assert sgt.dagster_run_key(item) == "g:clicks:3:100-250:a1:e4"
    assert sgt.dagster_run_key(launch(epoch=5)) != sgt.dagster_run_key(item)


def test_backfill_and_untagged_runs_commit_nothing() -> None:
    assert sgt.report_from_tags({}, "s:0", 0, 10) is None
    tags = {**sgt.launch_tags(launch()), sgt.TAG_BACKFILL: "true"}
    assert sgt.report_from_tags(tags, "clicks:3", 100, 250) is None


def test_partial_or_mismatched_tags_refuse_to_commit() -> None:
    tags = sgt.launch_tags(launch())
    partial = {k: v for k, v in tags.items() if k != sgt.TAG_EPOCH}
    with pytest.raises(sgt.RangeTagsError, match="epoch"):
        sgt.report_from_tags(partial, "clicks:3", 100, 250)
    with pytest.raises(sgt.RangeTagsError, match="partition is clicks:3 \\[100, 300\\)"):
        sgt.report_from_tags(tags, "clicks:3", 100, 300)


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
        ({"store_url": "mysql://u:p@db/x"}, "store_url: mysql://u:***@db/x is not a state store URL"),
        ({"store_url": "v3io"}, "store_url: 'v3io' keeps the state next to a v3io stream"),
        ({"store_url": "memory://"}, "store_url: memory:// keeps the state inside one process"),
        # malformed URLs of known schemes fail at load too, not at the first tick
        ({"store_url": "sqlite://"}, "store_url: store URL 'sqlite://': a SQLite store needs a file path"),
        ({"store_url": "sqlite:///:memory:"}, "a SQLite store needs a file path"),
        ({"store_url": "postgresql://u:pw:x@h:port/db"}, "store_url: store URL 'postgresql://u:***@h:port/db'"),
        ({"store_url": "v3io://h:1/c?foo=1"}, "store_url: v3io://h:1/c: unknown option(s) ['foo']"),
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
    assert remote.effective_config() == {"spark.remote": "sc://127.0.0.1:15002"}
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
