"""The group resources: one ``ConfigurableResource`` per stream kind, sharing the group and policy fields.

A resource is everything a sensor tick or a run needs to act as a member: the protocol policy, the state
store (chosen by URL) and the stream backend. Clients are cached per process and configuration, because
Dagster builds resources again for every sensor tick. Secret fields are excluded from reprs, and a
configuration error is raised when the resource is built (at code-location load), naming the field.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dagster_streamgroup import client_cache
from dagster_streamgroup.dagster.literal_secrets import refuse_literal_secrets
from dagster_streamgroup.extras import require
from dagster_streamgroup.member import GroupMember
from dagster_streamgroup.protocol import GroupPolicy
from dagster_streamgroup.redact import redact
from dagster_streamgroup.stores.base import StateStore, StoreConfigError, state_key
from dagster_streamgroup.stores.factory import check_store_url, open_store
from dagster_streamgroup.streams.base import StreamBackend
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from dagster_streamgroup.streams.v3io_config import V3ioConnection, V3ioStreamConfig, check_group

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

    from dagster_streamgroup.dagster.typed import RunDecoding
    from dagster_streamgroup.formats.config import FormatConfig
    from dagster_streamgroup.formats.spark import DecodedRecords
    from dagster_streamgroup.spark.record_counts import ObservedRecords

C = TypeVar("C", bound=BaseModel)

STORE_FILE = "streamgroup-state.db"
STATE_DIR = ".streamgroup"
_POLICY_FIELDS = tuple(GroupPolicy.model_fields)

_stores = client_cache.stores
_backends = client_cache.backends
_cached = client_cache.cached
release_cached_clients = client_cache.release_cached_clients
"""The per-process client cache lives below this layer (``dagster_streamgroup.client_cache``): a run worker
releases it without importing the Dagster layer."""


def default_store_url() -> str:
    """SQLite next to the Dagster instance, so sensors, runs and the CLI of one host agree on the file.

    Without ``DAGSTER_HOME`` (``dg dev`` and ``dagster dev`` then keep a temporary instance), the file is in
    ``.streamgroup/`` at the root of the ``dg`` project that holds the working directory, so the code server
    (started in ``src/``), its runs and a ``streamgroup status`` run from any folder of the project read the same
    file; outside a ``dg`` project, in ``.streamgroup/`` of the working directory."""
    home = os.environ.get("DAGSTER_HOME")
    return f"sqlite:///{((Path(home) if home else default_state_dir()) / STORE_FILE).resolve()}"


def default_state_dir() -> Path:
    """``.streamgroup/`` at the ``dg`` project's root, else in the working directory (``DAGSTER_HOME`` unset)."""
    return _state_dir_for(Path.cwd())


@functools.lru_cache(maxsize=16)
def _state_dir_for(cwd: Path) -> Path:
    """Per working directory: a member asks at every tick, and the project's files do not move under it."""
    from dagster_streamgroup.dagster.project import DgProjectError, find_dg_project

    try:
        project = find_dg_project(cwd)
    except DgProjectError:  # dg itself refuses such a project; the working directory is where it ran
        project = None
    return (project.root if project is not None else cwd) / STATE_DIR


def describe_validation_error(exc: ValidationError) -> str:
    """A pydantic error as one line per field, without the input values (they may hold secrets)."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        message = err["msg"].removeprefix("Value error, ")  # pydantic adds it again when this is re-raised
        where = ".".join(str(p) for p in err["loc"])
        parts.append(f"{where}: {message}" if where else message)  # a check across fields names them itself
    return "; ".join(parts)


_env_var_fields: ContextVar[frozenset[str]] = ContextVar("_env_var_fields", default=frozenset())
"""Fields of the resource being validated that were given as ``dagster.EnvVar`` (validation is synchronous)."""


DAEMON_LOOP_S = 5.0
"""Dagster's sensor daemon evaluates sensors at most once per loop of this many seconds
(``MIN_INTERVAL_LOOP_TIME`` in dagster/_daemon/sensor.py), whatever their ``minimum_interval_seconds``."""

TICK_WAIT_MARGIN_S = 1.5
"""What a tick that waited for a run still needs before the daemon's next pass: its second plan and the
daemon's launch of the runs it requests."""


class StreamGroupConfigError(ValueError):
    """A group resource's configuration is invalid; the message names the field."""


class StreamGroupResource(dg.ConfigurableResource["StreamGroupResource"]):
    """A consumer group over one stream. Subclasses add the stream's connection (``backend()``)."""

    model_config = ConfigDict(hide_input_in_errors=True)

    group: str = Field(description="The consumer group name (also the Kafka group id the offsets are mirrored to).")
    store_url: str | None = Field(
        default=None,
        repr=False,
        description="Where the group state lives: sqlite:///PATH (default: $DAGSTER_HOME/streamgroup-state.db), "
        "postgresql://USER:PASSWORD@HOST/DB for members on many hosts (use EnvVar when it holds a password), "
        "or, for a v3io stream, 'v3io': a KV item next to the stream.",
    )
    heartbeat_interval_s: float = Field(default=5.0, description="Seconds between member ticks (the sensor interval).")
    session_timeout_s: float = Field(default=20.0, description="A member silent this long is evicted.")
    join_grace_s: float | None = Field(default=None, description="Wait before a new member claims shards.")
    drain_timeout_s: float = Field(default=600.0, description="How long a departed member's run may still commit.")
    run_mode: str = Field(
        default="member",
        description="member: one run per member tick over all its ready shards (fixed costs paid once per batch); "
        "shard: one run per shard range.",
    )
    max_records_per_run: int = Field(
        default=1_000_000,
        description="Records one run reads at most; in member mode split across the member's shards by backlog.",
    )
    min_backlog: int = Field(default=20_000, description="Launch at once when this many records wait ...")
    max_wait_s: float = Field(
        default=15.0, description="... or once a smaller backlog has waited this long (the latency of a quiet stream)."
    )
    carry_on_s: float = Field(
        default=0.0,
        description="Member mode: for this long after it started, a run that committed takes its shards' next "
        "ranges in the same state write and reads them in the same Dagster run and Spark session (no new run, "
        "process or session per wave), while its member owns them and min_backlog records wait (up to max_wait_s "
        "for them; a run whose shards are caught up ends); 0: a run per wave of ranges.",
    )
    tick_wait_s: float = Field(
        default=3.0,
        description="A tick with nothing to launch while this member's runs are in flight and at least min_backlog "
        "records wait behind them waits up to this long for one of those runs to end, and launches the next "
        "ranges in the same tick instead of the next one (Dagster ticks sensors every 5 s at the fastest). Only "
        "where the daemon evaluates sensors in threads (sensors: use_threads in dagster.yaml), with more "
        "num_workers than member sensors; 0 turns it off.",
    )
    mirror_keep_alive_s: float = Field(
        default=3600.0,
        gt=0,
        description="Each member commits its shards' mirrored offsets again this often, the unchanged ones too: "
        "Kafka expires a member-less group's offsets offsets.retention.minutes (7 days) after their last commit, "
        "and a group started again from the mirror would otherwise fall back to its seek policy.",
    )
    max_attempts: int = Field(default=3, description="Runs of one range before it is parked or dead-lettered.")
    after_max_attempts: str = Field(
        default="park", description="park: stop the shard until unparked; dead_letter: record the range, move on."
    )
    seek: str = Field(default="earliest", description="earliest, latest or timestamp: start of a shard with no offset.")
    seek_timestamp_ms: int | None = Field(
        default=None, description="With seek='timestamp': epoch milliseconds of the first record to read."
    )
    on_data_loss: str = Field(
        default="fail", description="Offsets lost to retention: park the shard, or skip to the earliest offset."
    )
    on_recreated: str = Field(
        default="park",
        description="A shard's log deleted and created again (a Kafka topic recreated): park the shard until an "
        "operator resumes it, or read the new log from its first record (earliest). An event either way.",
    )
    spark_split_records: int = Field(
        default=50_000, description="Records per Spark partition when a range is read (large ranges are split)."
    )
    spark_pack_records: int | None = Field(
        default=10_000,
        description="Ranges smaller than this share a Spark task until it holds this many records (a task costs "
        "a consumer and a Python worker's turn whatever it reads); None: a task per range. Our Python sources only.",
    )
    lag_alert_records: int | None = Field(
        default=1_000_000,
        description="The lag asset check fails when a shard is more records behind than this (None: no limit "
        "in records; then lag_alert_seconds must be set).",
    )
    lag_alert_seconds: float | None = Field(
        default=None,
        description="The lag asset check fails when a shard's first record not yet committed is older than this "
        "many seconds (None: no limit in time).",
    )
    value_format: str = Field(
        default="bytes",
        description="How values are encoded: bytes (as they are, Spark's Kafka schema), string, json (with "
        "value_json_schema), avro, protobuf or json_schema (the Confluent wire format, schemas in the registry at "
        "schema_registry_url): the stream asset's DataFrame then has value as typed columns.",
    )
    key_format: str = Field(
        default="bytes", description="How Kafka keys are encoded (the same choices as value_format)."
    )
    value_json_schema: str | None = Field(default=None, description="With value_format json: the JSON Schema.")
    key_json_schema: str | None = Field(default=None, description="With key_format json: the JSON Schema.")
    value_record_name: str | None = Field(
        default=None,
        description="The value's fully qualified record name (RecordNameStrategy, TopicRecordNameStrategy).",
    )
    key_record_name: str | None = Field(default=None, description="The key's record name (as value_record_name).")
    on_decode_error: str = Field(
        default="fail",
        description="A record that cannot be decoded: fail (park its range, nothing committed), dead_letter (its "
        "coordinates, raw bytes and error go to the group's dead letters; the rest is committed) or null (a null "
        "value and the error in decodeError).",
    )
    schema_registry_url: str | None = Field(
        default=None, description="The Schema Registry's URL (Confluent's API), or several, comma-separated."
    )
    schema_registry_basic_auth_user_info: str | None = Field(
        default=None, repr=False, description="USER:PASSWORD for the registry's basic auth: use EnvVar."
    )
    schema_registry_basic_auth_user_info_file: str | None = Field(
        default=None, description="A mounted file holding USER:PASSWORD."
    )
    schema_registry_bearer_token: str | None = Field(
        default=None, repr=False, description="A static bearer token for the registry: use EnvVar."
    )
    schema_registry_bearer_token_file: str | None = Field(default=None, description="A mounted file holding it.")
    schema_registry_ssl_ca_location: str | None = None
    schema_registry_ssl_certificate_location: str | None = None
    schema_registry_ssl_key_location: str | None = None
    schema_registry_timeout_s: float = Field(default=10.0, description="Seconds a registry request may take.")
    subject_name_strategy: str = Field(
        default="TopicNameStrategy",
        description="Where schemas are registered: TopicNameStrategy (<topic>-value), RecordNameStrategy (the "
        "record's name) or TopicRecordNameStrategy (<topic>-<record's name>).",
    )

    @model_validator(mode="before")
    @classmethod
    def _note_env_vars(cls, data: Any) -> Any:
        # Pydantic hands the after-validators an EnvVar as a plain string (its name): remember which fields
        # came as EnvVars, so they are checked when they resolve (in the tick or run), not by their name.
        names = frozenset(k for k, v in data.items() if isinstance(v, dg.EnvVar)) if isinstance(data, dict) else None
        _env_var_fields.set(names or frozenset())
        return data

    def _from_env_var(self, name: str) -> bool:
        return name in _env_var_fields.get()

    def _at_load(self, name: str) -> tuple[str | None, str]:
        """A field's value as the definitions load, and how an error names it: a literal as itself; an EnvVar's
        value if its variable is set now (the code location's process is where the ticks and runs resolve it),
        else ``None`` (it is checked where it resolves)."""
        value = getattr(self, name)
        if not self._from_env_var(name):
            return value, name
        return os.environ.get(value), f"{name} (from the environment variable {value})"

    def _values_at_load(self, names: Iterable[str]) -> dict[str, Any] | None:
        """The EnvVar fields among ``names`` with their values as the definitions load; ``None`` if one of their
        variables is not set yet."""
        values = {}
        for name in names:
            if self._from_env_var(name):
                value, _ = self._at_load(name)
                if value is None:
                    return None
                values[name] = value
        return values

    @field_validator("heartbeat_interval_s")
    @classmethod
    def _whole_seconds(cls, value: float) -> float:
        # The member sensors tick at this interval, and Dagster ticks sensors on whole seconds: a fractional
        # value would be rounded for the sensor while the session timeout still counts the unrounded one.
        if value < 1 or value != int(value):
            raise ValueError(
                f"must be a whole number of seconds >= 1 (Dagster ticks sensors on whole seconds), got {value:g}"
            )
        return value

    @model_validator(mode="after")
    def _check_group_fields(self) -> StreamGroupResource:
        if not self.group.strip():
            raise ValueError("group: must be a non-empty name")
        for name in ("spark_split_records", "lag_alert_records", "spark_pack_records"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0")
        if self.lag_alert_seconds is not None and not self.lag_alert_seconds > 0:
            raise ValueError(f"lag_alert_seconds: must be > 0 (seconds), got {self.lag_alert_seconds:g}")
        if self.lag_alert_records is None and self.lag_alert_seconds is None:
            raise ValueError("lag_alert_records: None needs lag_alert_seconds set (the lag check needs a limit)")
        longest_wait = max(self.heartbeat_interval_s, DAEMON_LOOP_S) - TICK_WAIT_MARGIN_S
        if not 0 <= self.tick_wait_s <= longest_wait:
            raise ValueError(
                f"tick_wait_s: must be between 0 and {longest_wait:g} s (a tick must end {TICK_WAIT_MARGIN_S:g} s "
                f"before the daemon's next pass, every {max(self.heartbeat_interval_s, DAEMON_LOOP_S):g} s, or the "
                f"pass skips the member), got {self.tick_wait_s:g}"
            )
        self.policy()
        url, field = self._at_load("store_url")
        if url is not None:
            self._check_store_url(url, field)
        from dagster_streamgroup.dagster.typed import FORMAT_FIELDS, format_config

        # Fields given as EnvVars are checked with stand-ins now, and as resolved when a tick or run uses them.
        format_config(self, frozenset(name for name in FORMAT_FIELDS if self._from_env_var(name)))
        return self

    def format_config(self) -> FormatConfig:
        """The formats of the stream's records and their registry (``formats.FormatConfig``); a configuration
        error names the resource's field."""
        from dagster_streamgroup.dagster.typed import format_config

        return format_config(self)

    def subject_topics(self) -> list[str]:
        """The names the subject name strategies put before ``-value`` (Kafka: the topics)."""
        raise NotImplementedError

    OFFSET_COLUMN: ClassVar[str] = "offset"

    def _check_store_url(self, url: str, field: str = "store_url") -> None:
        if url == STORE_NEXT_TO_STREAM:
            raise StreamGroupConfigError(
                f"{field}: {url!r} keeps the state next to a v3io stream; {type(self).__name__} has none "
                "(use sqlite:///PATH or postgresql://...)"
            )
        try:
            check_store_url(url, field=field)
        except StoreConfigError as exc:
            raise StreamGroupConfigError(str(exc)) from None

    secret_fields: ClassVar[Mapping[str, str | None]] = {}
    """Fields that hold a secret, each with the field of a mounted file that may hold it instead."""
    connection_string_fields: ClassVar[tuple[str, ...]] = ("store_url",)
    """Fields holding a URL that may carry a secret (a password, a token): ``redact`` shows them, and a literal
    one holding a secret is refused when the definitions load."""

    def get_resource_definition(self) -> Any:
        """Dagster's definition of this resource, once no secret is a literal (``literal_secrets``)."""
        refuse_literal_secrets(
            self, self.secret_fields, self.connection_string_fields, keywords=(STORE_NEXT_TO_STREAM,)
        )
        return super().get_resource_definition()

    def policy(self) -> GroupPolicy:
        try:
            return GroupPolicy(**{name: getattr(self, name) for name in _POLICY_FIELDS})
        except ValidationError as exc:
            raise StreamGroupConfigError(describe_validation_error(exc)) from None

    def resolved_store_url(self) -> str:
        return self.store_url or default_store_url()

    def store(self) -> StateStore:
        url = self.resolved_store_url()
        if url.partition("://")[0].lower().startswith("postgres"):  # psycopg is the [postgres] extra's
            require("psycopg", "postgres", f"the PostgreSQL state store of group {self.group!r}")
        return _cached(_stores, redact(url), url, lambda: open_store(url, field="store_url"))

    def backend(self) -> StreamBackend:
        raise NotImplementedError

    def _connection_config(self, model: type[C], overrides: Mapping[str, Any] | None = None) -> C:
        """The stream's connection model built from this resource's fields of the same names (``overrides``:
        the values of fields given as EnvVars, as the definitions load)."""
        values: dict[str, Any] = {}
        for name in model.model_fields:
            value = (overrides or {}).get(name, getattr(self, name, None))
            if isinstance(value, dg.EnvVar):  # resolved when the resource is initialised in a tick or run
                value = "unresolved-env-var"
            if value is not None:
                values[name] = value
        try:
            return model(**values)
        except ValidationError as exc:
            raise StreamGroupConfigError(describe_validation_error(exc)) from None

    def member(self, member_id: str) -> GroupMember:
        return GroupMember(self.store(), self.backend(), self.group, member_id, self.policy())

    def state_key(self) -> str:
        return state_key(self.backend().stream_id, self.group)

    def read_range(self, spark: SparkSession, shard: str, start: int, end: int) -> DataFrame:
        """The records of ``[start, end)`` of ``shard`` as a Spark DataFrame (lazy)."""
        return self.read_ranges(spark, {shard: (start, end)})

    def read_ranges(
        self, spark: SparkSession, ranges: Mapping[str, tuple[int, int]], *, decode: Mapping[str, str] | None = None
    ) -> DataFrame:
        """The records of every ``shard: [start, end)`` as one Spark DataFrame (lazy): one read, one query
        plan, however many shards a run holds; large ranges are split into several Spark partitions. Typed records
        (``value_format``) are decoded under the subjects' latest schemas unless ``decode`` holds a run's
        (``formats.spark.decode_options``; ``{}``: raw bytes)."""
        raise NotImplementedError

    def records_by_shard(self, df: DataFrame) -> dict[str, int]:
        """Records per shard of a DataFrame this resource read (one Spark job)."""
        raise NotImplementedError

    def shard_condition(self, shard: str) -> Column:
        """True on the rows of ``shard`` in a DataFrame this resource read."""
        raise NotImplementedError

    def observed_records(
        self, spark: SparkSession, ranges: Mapping[str, tuple[int, int]], decoding: RunDecoding | None = None
    ) -> ObservedRecords | DecodedRecords:
        """The ranges read as one DataFrame whose first action also counts the records of each shard; with the
        run's ``decoding`` (typed records), decoded under its reader schemas and its decode-error policy."""
        conditions = {shard: self.shard_condition(shard) for shard in ranges}
        if decoding is not None:
            return decoding.observed(spark, ranges, conditions)
        from dagster_streamgroup.spark.record_counts import ObservedRecords

        return ObservedRecords(self.read_ranges(spark, ranges), conditions, self.records_by_shard)


_KAFKA_FIELDS = tuple(KafkaStreamConfig.model_fields)
SPARK_READERS = ("auto", "spark-kafka", "python")
SPARK_READER_DEFAULT = "python"
_SECRET_FIELDS = frozenset({"sasl_password", "oauthbearer_client_secret", "ssl_key_password"})


class KafkaStreamGroup(StreamGroupResource):
    """A consumer group over a Kafka topic set; each partition is a shard (``<topic>:<partition>``)."""

    secret_fields: ClassVar[Mapping[str, str | None]] = {name: f"{name}_file" for name in sorted(_SECRET_FIELDS)}

    bootstrap_servers: str = Field(description="Comma-separated host:port list (librdkafka bootstrap.servers).")
    topics: list[str] = Field(description="The topics whose partitions form the stream's shards.")
    properties: dict[str, str] = Field(
        default_factory=dict, description="Other librdkafka properties, passed through untouched (no secrets)."
    )
    security_protocol: str | None = Field(default=None, description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.")
    sasl_mechanism: str | None = Field(default=None, description="PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER.")
    sasl_username: str | None = None
    sasl_password: str | None = Field(default=None, repr=False, description="Use EnvVar; never a literal.")
    sasl_password_file: str | None = Field(default=None, description="A mounted file holding the SASL password.")
    oauthbearer_client_id: str | None = None
    oauthbearer_client_secret: str | None = Field(default=None, repr=False, description="Use EnvVar.")
    oauthbearer_client_secret_file: str | None = None
    oauthbearer_token_endpoint_url: str | None = None
    oauthbearer_scope: str | None = None
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: str | None = Field(default=None, repr=False, description="Use EnvVar.")
    ssl_key_password_file: str | None = None
    secret_path: str | None = Field(default=None, description="Directory where secret files are mounted.")
    adopt_group_offsets: bool = Field(
        default=False,
        description="Take over a Kafka consumer group of the same name that another application owns (its "
        "consumers stopped): start from its offsets and advance them. Off: such a group is refused.",
    )
    spark_reader: str = Field(
        default=SPARK_READER_DEFAULT,
        description="How a run reads its ranges: spark-kafka (Spark's own Kafka source, spark-sql-kafka-0-10, "
        "on the session's classpath), python (the streamgroup-kafka Python data source, confluent-kafka in the "
        "Spark tasks), or auto (spark-kafka where the connector is there and the settings translate to the Java "
        "client, else python).",
    )

    @model_validator(mode="after")
    def _check_kafka_fields(self) -> KafkaStreamGroup:
        if self.spark_reader not in SPARK_READERS:
            raise ValueError(f"spark_reader: must be one of {', '.join(SPARK_READERS)}, got {self.spark_reader!r}")
        at_load = self._values_at_load(n for n in _KAFKA_FIELDS if n not in _SECRET_FIELDS)
        if at_load is not None:  # otherwise validated when the EnvVar is resolved, in the tick or run
            self._connection_config(KafkaStreamConfig, at_load)
        return self

    def stream_config(self) -> KafkaStreamConfig:
        return self._connection_config(KafkaStreamConfig)

    def backend(self) -> StreamBackend:
        from dagster_streamgroup.streams.kafka import KafkaBackend

        config = self.stream_config()
        return _cached(_backends, config.model_dump_json(), repr(config.client_config()), lambda: KafkaBackend(config))

    def subject_topics(self) -> list[str]:
        return list(self.topics)

    def read_ranges(
        self, spark: SparkSession, ranges: Mapping[str, tuple[int, int]], *, decode: Mapping[str, str] | None = None
    ) -> DataFrame:
        from dagster_streamgroup.dagster.typed import default_decode_options
        from dagster_streamgroup.spark.kafka_read import read_kafka_ranges_by

        return read_kafka_ranges_by(
            self.spark_reader,
            spark,
            self.stream_config(),
            dict(ranges),
            split_records=self.spark_split_records,
            pack_records=self.spark_pack_records,
            decode=decode if decode is not None else default_decode_options(self),
        )

    def records_by_shard(self, df: DataFrame) -> dict[str, int]:
        rows = df.groupBy("topic", "partition").count().collect()
        return {f"{row['topic']}:{row['partition']}": int(row["count"]) for row in rows}

    def shard_condition(self, shard: str) -> Column:
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        from dagster_streamgroup.streams.kafka import parse_shard

        topic, partition = parse_shard(shard)
        return (F.col("topic") == F.lit(topic)) & (F.col("partition") == F.lit(partition))


_V3IO_FIELDS = tuple(V3ioStreamConfig.model_fields)
STORE_NEXT_TO_STREAM = "v3io"
"""``store_url="v3io"``: keep the group state as a KV item next to the stream, on the stream's own connection."""


class V3ioStreamGroup(StreamGroupResource):
    """A consumer group over an Iguazio v3io stream; each stream shard is a shard (``"0"``, ``"1"``, ...).

    Offsets are v3io sequence numbers; the group's progress is mirrored into each shard's
    ``__<group>_committed_sequence_number`` attribute (last processed), as v3io-go consumers keep it."""

    secret_fields: ClassVar[Mapping[str, str | None]] = {"access_key": "access_key_file"}

    endpoint: str = Field(description="The v3io web-API endpoint, e.g. http://v3io-webapi:8081.")
    container: str = Field(description="The container that holds the stream.")
    stream_path: str = Field(description="The stream's path inside the container.")
    access_key: str | None = Field(
        default=None, repr=False, description="Use EnvVar; default: the V3IO_ACCESS_KEY environment variable."
    )
    access_key_file: str | None = Field(default=None, description="A mounted file holding the access key.")
    records_per_request: int = Field(default=1000, description="GetRecords limit per request.")

    @model_validator(mode="after")
    def _check_v3io_fields(self) -> V3ioStreamGroup:
        try:
            check_group(self.group)
        except ValueError as exc:
            raise StreamGroupConfigError(str(exc)) from None
        at_load = self._values_at_load(n for n in _V3IO_FIELDS if n != "access_key")
        if at_load is not None:  # otherwise validated when the EnvVar is resolved, in the tick or run
            self._connection_config(V3ioStreamConfig, at_load)
        return self

    def stream_config(self) -> V3ioStreamConfig:
        return self._connection_config(V3ioStreamConfig)

    def backend(self) -> StreamBackend:
        from dagster_streamgroup.streams.v3io import V3ioBackend

        config = self.stream_config()
        return _cached(_backends, config.model_dump_json(), config.resolve_access_key(), lambda: V3ioBackend(config))

    def _check_store_url(self, url: str, field: str = "store_url") -> None:
        if url != STORE_NEXT_TO_STREAM:
            super()._check_store_url(url, field)

    def member(self, member_id: str) -> GroupMember:
        """The member, once the stream's own group of this name is known not to be a v3io-go/Nuclio one.

        Checked at every tick and run, whatever the store: such a group may appear beside a group of ours
        that already runs, and its shard attributes are where our offsets are mirrored."""
        from dagster_streamgroup.streams.v3io import V3ioBackend

        backend = self.backend()
        if isinstance(backend, V3ioBackend):
            backend.check_group_is_ours(self.group, before=f"member {member_id} acts")
        return super().member(member_id)

    def store(self) -> StateStore:
        if self.resolved_store_url() != STORE_NEXT_TO_STREAM:
            return super().store()
        from dagster_streamgroup.stores.v3io import V3ioStateStore

        config = self.stream_config()
        connection = V3ioConnection(
            endpoint=config.endpoint,
            container=config.container,
            access_key=config.access_key,
            access_key_file=config.access_key_file,
        )
        return _cached(
            _stores,
            "v3io-state:" + config.model_dump_json(),
            config.resolve_access_key(),  # as resolved now: a rotated key file gets a new client
            lambda: V3ioStateStore(connection),
        )

    OFFSET_COLUMN: ClassVar[str] = "sequence_number"

    def subject_topics(self) -> list[str]:
        return [self.stream_path.strip("/").rsplit("/", 1)[-1]]

    def read_ranges(
        self, spark: SparkSession, ranges: Mapping[str, tuple[int, int]], *, decode: Mapping[str, str] | None = None
    ) -> DataFrame:
        from dagster_streamgroup.dagster.typed import default_decode_options
        from dagster_streamgroup.spark.v3io_source import read_v3io_ranges

        return read_v3io_ranges(
            spark,
            self.stream_config(),
            dict(ranges),
            max_records_per_partition=self.spark_split_records,
            min_records_per_partition=self.spark_pack_records,
            decode=decode if decode is not None else default_decode_options(self),
        )

    def records_by_shard(self, df: DataFrame) -> dict[str, int]:
        rows = df.groupBy("shard").count().collect()
        return {str(row["shard"]): int(row["count"]) for row in rows}

    def shard_condition(self, shard: str) -> Column:
        from pyspark.sql import functions as F  # noqa: N812 (the PySpark idiom)

        return F.col("shard").cast("string") == F.lit(shard)
