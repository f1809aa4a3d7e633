"""Bad configuration of the resources: each field at its bounds and with a wrong type, store URLs, and
``dagster.EnvVar`` values that are unset or resolve to something invalid.

Every case must fail when the code location loads (or, for an EnvVar, when it resolves in the tick or run),
with the field named, before any member touches a store or a stream: nothing can move an offset.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic import ValidationError

from dagster_streamgroup.dagster import (
    KafkaStreamGroup,
    StreamGroupConfigError,
    StreamSparkResource,
    V3ioStreamGroup,
    member_sensors,
    stream_asset,
)
from dagster_streamgroup.stores.base import StoreConfigError, StoreUnavailableError

CONFIG_ERRORS = (ValidationError, StreamGroupConfigError, dg.DagsterInvalidConfigError)
SECRET = "pa55-w0rd-never-shown"


def kafka(**overrides: Any) -> KafkaStreamGroup:
    fields: dict[str, Any] = {"group": "g", "bootstrap_servers": "127.0.0.1:9092", "topics": ["clicks"]}
    return KafkaStreamGroup(**{**fields, **overrides})


def v3io(**overrides: Any) -> V3ioStreamGroup:
    fields: dict[str, Any] = {
        "group": "g",
        "endpoint": "http://127.0.0.1:8081",
        "container": "bigdata",
        "stream_path": "clicks",
        "access_key": SECRET,
    }
    return V3ioStreamGroup(**{**fields, **overrides})


def refused(build: Any, field: str) -> str:
    """The error text of a configuration that must be refused; it names ``field`` and never the secret."""
    with pytest.raises(CONFIG_ERRORS) as caught:
        build()
    text = str(caught.value)
    assert field in text, text
    assert SECRET not in text
    return text


@pytest.mark.parametrize("interval", [2.5, 0.5, 1.2])
def test_a_heartbeat_interval_that_is_not_whole_seconds_fails_at_load(interval: float) -> None:
    """Dagster ticks sensors on whole seconds: member_sensors() rounds the interval for it, but the session
    timeout counts heartbeats of the resource's value, so 2.5 s would silently tick every 2 s."""
    text = refused(lambda: kafka(heartbeat_interval_s=interval, session_timeout_s=20), "heartbeat_interval_s")
    assert "whole" in text
    refused(lambda: v3io(heartbeat_interval_s=interval, session_timeout_s=20), "heartbeat_interval_s")
    assert kafka(heartbeat_interval_s=3.0, session_timeout_s=20).heartbeat_interval_s == 3


def test_member_sensors_refuse_a_fractional_interval_when_defined() -> None:
    @stream_asset(group="g_fraction", name="events_fraction")
    def events(context: dg.AssetExecutionContext, df: Any) -> None:
        return None

    with pytest.raises(ValueError, match="heartbeat_interval_s"):
        member_sensors(events, members=1, heartbeat_interval_s=2.5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("heartbeat_interval_s", 0),
        ("session_timeout_s", -1.0),
        ("join_grace_s", -0.5),
        ("drain_timeout_s", 0),
        ("min_backlog", 0),
        ("max_wait_s", -1.0),
        ("max_attempts", 0),
        ("after_max_attempts", "drop"),
        ("seek", "middle"),
        ("on_data_loss", "ignore"),
        ("spark_split_records", 0),
        ("spark_pack_records", 0),
        ("lag_alert_records", -1),
        ("lag_alert_seconds", 0.0),
        ("lag_alert_seconds", float("nan")),
        ("run_mode", "batch"),
        ("seek_timestamp_ms", -1),
        ("tick_wait_s", -0.5),
        ("tick_wait_s", 4.0),
        ("carry_on_s", -1.0),
    ],
    ids=[
        "heartbeat_interval_s",
        "session_timeout_s",
        "join_grace_s",
        "drain_timeout_s",
        "min_backlog",
        "max_wait_s",
        "max_attempts",
        "after_max_attempts",
        "seek",
        "on_data_loss",
        "spark_split_records",
        "spark_pack_records",
        "lag_alert_records",
        "lag_alert_seconds-zero",
        "lag_alert_seconds-nan",
        "run_mode",
        "seek_timestamp_ms",
        "tick_wait_s-negative",
        "tick_wait_s-past-the-daemon-pass",
        "carry_on_s",
    ],
)
def test_a_group_field_out_of_its_bounds_is_named(field: str, value: object) -> None:
    extra = {"seek": "timestamp"} if field == "seek_timestamp_ms" else {}
    refused(lambda: kafka(**{field: value}, **extra), field)


def test_a_lag_check_without_any_limit_is_refused_and_either_limit_alone_is_taken() -> None:
    refused(lambda: kafka(lag_alert_records=None), "lag_alert_records")
    assert kafka(lag_alert_records=None, lag_alert_seconds=30.0).lag_alert_seconds == 30.0
    assert kafka(lag_alert_seconds=5.0).lag_alert_records == 1_000_000


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"seek": "timestamp"}, "seek_timestamp_ms: required when seek is 'timestamp'"),
        ({"seek_timestamp_ms": 1_700_000_000_000}, "seek_timestamp_ms: only used with seek='timestamp'"),
    ],
    ids=["timestamp-missing", "timestamp-unused"],
)
def test_group_fields_that_contradict_each_other_are_named(overrides: dict[str, Any], field: str) -> None:
    refused(lambda: kafka(**overrides), field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("heartbeat_interval_s", "fast"),
        ("max_records_per_run", "many"),
        ("topics", "clicks"),
        ("properties", {"fetch.max.bytes": ["1"]}),
        ("join_grace_s", "soon"),
        ("group", 7),
        ("secret_path", 5),
    ],
    ids=["heartbeat_interval_s", "max_records_per_run", "topics", "properties", "join_grace_s", "group", "secret_path"],
)
def test_a_field_of_the_wrong_type_is_named(field: str, value: object) -> None:
    refused(lambda: kafka(**{field: value}), field)


# The connection models' own checks (topics, ports, typed and secret properties, SASL/SSL/OIDC combinations,
# v3io endpoint, container, path and key sources) have their cases in tests/integration/kafka/test_kafka_config.py
# and tests/integration/v3io/test_v3io_backend.py; these are the inputs they do not try, given to the resources.
@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"bootstrap_servers": "a:1,,b:2"}, "bootstrap_servers"),
        ({"security_protocol": "TLS"}, "security_protocol"),
        ({"properties": {"bootstrap.servers": "x:1"}}, "set bootstrap_servers instead"),
    ],
    ids=["bootstrap-empty-entry", "protocol-unknown", "properties-typed-bootstrap"],
)
def test_a_kafka_connection_field_is_named(overrides: dict[str, Any], field: str) -> None:
    refused(lambda: kafka(**overrides), field)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"records_per_request": 10_001}, "records_per_request"),
        ({"records_per_request": "many"}, "records_per_request"),
        ({"endpoint": "http://127.0.0.1:8081/api"}, "endpoint"),
        ({"access_key": " "}, "access_key"),
        ({"stream_path": "/"}, "stream_path must not be empty"),
    ],
    ids=[
        "records_per_request-10001",
        "records_per_request-str",
        "endpoint-path",
        "access_key-blank",
        "stream_path-empty",
    ],
)
def test_a_v3io_connection_field_is_named(overrides: dict[str, Any], field: str) -> None:
    refused(lambda: v3io(**overrides), field)


@pytest.mark.parametrize(
    ("overrides", "fields"),
    [
        (
            {"endpoint": "http://v3io-webapi:8081/bigdata/my-stream@my-consumer-group"},
            "endpoint='http://v3io-webapi:8081', container='bigdata', stream_path='my-stream', "
            "group='my_consumer_group'",
        ),
        ({"stream_path": "bigdata/a/clicks@cg"}, "container='bigdata', stream_path='a/clicks', group='cg'"),
    ],
    ids=["endpoint", "stream_path"],
)
def test_a_nuclio_trigger_url_is_refused_with_the_fields_to_write(overrides: dict[str, Any], fields: str) -> None:
    """Nuclio's v3io-stream trigger takes one URL, ``http://HOST:PORT/CONTAINER/STREAM@GROUP``: a user bringing it
    here is told the fields it stands for (and a group name the platform accepts), not that a path is invalid."""
    text = refused(lambda: v3io(**overrides), "Nuclio v3io-stream trigger URL")
    assert fields in text, text


def test_nuclios_example_group_name_is_refused_with_the_name_to_use() -> None:
    """``my-consumer-group`` (Nuclio's documented example) cannot name a v3io attribute: the error says so and
    gives the name to use."""
    text = refused(lambda: v3io(group="my-consumer-group"), "group")
    assert "use 'my_consumer_group' instead" in text and "attribute names cannot hold" in text, text


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"remote": "sc://127.0.0.1:0"}, "remote"),
        ({"remote": "sc://:15002"}, "remote"),
        ({"master": "  "}, "master"),
        ({"spark_config": "spark.executor.memory=1g"}, "spark_config"),
        ({"connect_timeout_s": -1}, "connect_timeout_s"),
        ({"connect_timeout_s": "soon"}, "connect_timeout_s"),
    ],
    ids=[
        "remote-port-0",
        "remote-no-host",
        "master-blank",
        "spark_config-str",
        "connect_timeout_s-negative",
        "connect_timeout_s-str",
    ],
)
def test_a_spark_resource_field_is_named(overrides: dict[str, Any], field: str) -> None:
    refused(lambda: StreamSparkResource(**overrides), field)


def test_a_sqlite_store_url_under_a_file_names_the_directory(tmp_path: Path) -> None:
    """A path that cannot become a directory used to surface as a bare NotADirectoryError from the first tick."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    resource = kafka(store_url=f"sqlite:///{blocker}/state.db")
    with pytest.raises(StoreConfigError, match=r"store_url: .*cannot create the SQLite file's directory") as caught:
        resource.store()
    assert str(blocker) in str(caught.value)


def test_a_sqlite_store_url_naming_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path) -> None:
    other = tmp_path / "notes.txt"
    other.write_bytes(b"someone else's file\n" * 100)
    before = other.read_bytes()
    with pytest.raises(StoreUnavailableError, match="file is not a database"):
        kafka(store_url=f"sqlite:///{other}").store()
    assert other.read_bytes() == before


@pytest.mark.parametrize(
    ("build", "variable"),
    [
        (lambda: kafka(store_url=dg.EnvVar("SG_RELIABILITY_UNSET_STORE")), "SG_RELIABILITY_UNSET_STORE"),
        (
            lambda: kafka(
                security_protocol="SASL_SSL",
                sasl_mechanism="PLAIN",
                sasl_username="u",
                sasl_password=dg.EnvVar("SG_RELIABILITY_UNSET_PASSWORD"),
            ),
            "SG_RELIABILITY_UNSET_PASSWORD",
        ),
        (lambda: v3io(access_key=dg.EnvVar("SG_RELIABILITY_UNSET_KEY")), "SG_RELIABILITY_UNSET_KEY"),
    ],
    ids=["store_url", "sasl_password", "access_key"],
)
def test_an_unset_env_var_fails_when_the_resource_initialises_naming_the_variable(
    build: Any, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(variable, raising=False)
    resource = build()  # the code location loads: the variable is only needed where the resource is used
    with pytest.raises(dg.DagsterInvalidConfigError, match=f'environment variable "{variable}" which is not set'):
        resource.process_config_and_initialize()


def test_an_unset_env_var_for_the_connect_url_fails_when_the_run_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SG_RELIABILITY_UNSET_REMOTE", raising=False)
    resource = StreamSparkResource(remote=dg.EnvVar("SG_RELIABILITY_UNSET_REMOTE"))
    with (
        pytest.raises(dg.DagsterInvalidConfigError, match="SG_RELIABILITY_UNSET_REMOTE"),
        resource.process_config_and_initialize_cm(),
    ):
        pass


@pytest.mark.parametrize(
    ("build", "variable", "value", "field"),
    [
        (
            lambda: kafka(bootstrap_servers=dg.EnvVar("SG_REL_BOOTSTRAP")),
            "SG_REL_BOOTSTRAP",
            "nohost",
            "bootstrap_servers",
        ),
        (lambda: kafka(store_url=dg.EnvVar("SG_REL_STORE")), "SG_REL_STORE", f"mysql://u:{SECRET}@h/db", "store_url"),
        (lambda: v3io(endpoint=dg.EnvVar("SG_REL_ENDPOINT")), "SG_REL_ENDPOINT", "ftp://h:1", "endpoint"),
    ],
    ids=["bootstrap_servers", "store_url", "endpoint"],
)
def test_an_env_var_that_resolves_to_a_bad_value_is_named_when_it_resolves(
    build: Any, variable: str, value: str, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    resource = build()
    monkeypatch.setenv(variable, value)
    refused(resource.process_config_and_initialize, field)


def test_a_connect_url_from_an_env_var_is_checked_when_it_resolves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The URL may carry a token (``;token=...``), so an EnvVar is the way to pass it; it used to be refused at
    load because the check read the variable's name as the URL."""
    monkeypatch.delenv("SG_REL_REMOTE", raising=False)
    resource = StreamSparkResource(remote=dg.EnvVar("SG_REL_REMOTE"))
    monkeypatch.setenv("SG_REL_REMOTE", f"sc://127.0.0.1:15002/;token={SECRET}")
    with resource.process_config_and_initialize_cm() as resolved:
        assert resolved.remote == f"sc://127.0.0.1:15002/;token={SECRET}"
    # Spark's client refuses a ";" right after the port, quoting the token in its error: refused before it.
    for bad, message in [("http://127.0.0.1:15002", "must be a Spark Connect URL"), (f"sc://h:1;token={SECRET}", "")]:
        monkeypatch.setenv("SG_REL_REMOTE", bad)
        with (
            pytest.raises(ValidationError, match=f"remote: {message}") as caught,
            resource.process_config_and_initialize_cm(),
        ):
            pass
        assert SECRET not in str(caught.value)
        refused(lambda: StreamSparkResource(remote=dg.EnvVar("SG_REL_REMOTE")), "SG_REL_REMOTE")  # set at load
