"""The consumer group as a Dagster component: one ``defs.yaml`` instead of the Python in ``definitions.py``.

``KafkaStreamGroupComponent`` and ``V3ioStreamGroupComponent`` build what ``stream_definitions`` builds (the
stream asset with its checks, the member sensors, the group and Spark resources, the in-process executor) from
YAML attributes: the group resource's own fields at the top level, the user's function by module path, the
members, and the Spark settings under ``spark``. The attributes' model is derived from the resource classes
themselves, so a field added to a resource is a YAML attribute with no change here, and ``dg check yaml``
validates every attribute with the resource's own types and descriptions.

Secrets stay secrets. Dagster's ``{{ env.NAME }}`` template is rendered to the plain value when the definitions
load, and a resource keeps its configured values in the code location's snapshot (what the UI's Resources page
shows and what every run stores). So a secret field accepts only ``{env: NAME}``, which becomes
``dagster.EnvVar("NAME")``: the snapshot keeps the variable's name, and the value is read where the resource is
used (a sensor tick, a run). Every connection field accepts ``{env: NAME}`` too; a literal or a template in a
secret field is refused at load, naming the field.
"""

import importlib
import importlib.util
import re
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self, Union, get_args, get_origin

import dagster as dg
from dagster.components.core.context import RESOLUTION_CONTEXT_STASH_KEY, ComponentDeclLoadContext
from dagster.components.resolved.errors import ResolutionException
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model, model_validator
from pydantic.fields import FieldInfo

from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.assets import StreamFn, backfill_asset_of, stream_asset, stream_freshness_policy
from dagster_streamgroup.dagster.instance_settings import ensure_instance_settings
from dagster_streamgroup.dagster.resources import (
    DAEMON_LOOP_S,
    STATE_DIR,
    STORE_NEXT_TO_STREAM,
    KafkaStreamGroup,
    StreamGroupResource,
    V3ioStreamGroup,
    describe_validation_error,
)
from dagster_streamgroup.dagster.sensors import check_tick_interval, member_sensors
from dagster_streamgroup.dagster.spark_session import StreamSparkResource
from dagster_streamgroup.redact import read
from dagster_streamgroup.sinks import RangeSink, Sink
from dagster_streamgroup.streams.kafka_config import KafkaStreamConfig
from dagster_streamgroup.streams.v3io_config import V3ioStreamConfig

ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


class EnvRef(dg.Model):
    """``{env: NAME}``: the value of environment variable ``NAME``, read where the resource is used.

    It becomes ``dagster.EnvVar("NAME")``, so the definitions (and the UI, and every run's stored snapshot) hold
    the variable's name only, unlike ``{{ env.NAME }}``, which Dagster renders into the plain value at load."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"title": "Environment variable"})

    env: str = Field(pattern=ENV_NAME_PATTERN, description="The environment variable's name.")


class StreamAssetAttributes(dg.Model):
    """How the stream asset is named and shown; its partitions, checks and run config are the group's."""

    name: str | None = Field(default=None, description="The asset's name (default: the function's name).")
    key_prefix: str | list[str] | None = Field(default=None, description="Prefix of the asset key.")
    group_name: str | None = Field(default=None, description="The Dagster asset group (not the consumer group).")
    description: str | None = Field(default=None, description="Default: the function's docstring.")
    kinds: list[str] | None = Field(default=None, description="Kinds shown in the UI (default: spark).")
    owners: list[str] | None = Field(default=None, description="Owners: emails, or team:NAME.")
    tags: dict[str, str] | None = Field(default=None, description="Asset tags.")
    value_schema: str | int | None = Field(
        default=None,
        description="Typed records (value_format): the reader schema of the DataFrame's value for a whole run: "
        "latest (the subject's latest version at the run's start, the default), a version number, or a schema "
        "(Avro or JSON Schema as JSON text).",
    )
    key_schema: str | int | None = Field(default=None, description="The same for the key (key_format).")


class ComponentConfigError(ResolutionException):
    """An attribute of a stream group component is invalid; the message names it, with its file and line."""


# The YAML model of a resource class, derived from its fields.


def _str_typed(annotation: Any) -> bool:
    """``str`` or ``str | None``: the fields a ``dagster.EnvVar`` can stand for."""
    if annotation is str:
        return True
    args = [a for a in get_args(annotation) if a is not type(None)]
    return get_origin(annotation) in (Union, types.UnionType) and args == [str]


def _scalar_typed(annotation: Any) -> bool:
    """A number or a flag (optional or not): given in YAML as itself, or as a ``{{ }}`` template (a string)."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    kept = [a for a in args if a is not type(None)]
    return bool(kept) and all(a in (int, float, bool) for a in kept)


@dataclass(frozen=True)
class ResourceAttributes:
    """The YAML attributes of one resource class: its fields, with ``{env: NAME}`` allowed on ``env_fields`` and
    required on ``secret_fields``, and the way back from attribute values to the resource."""

    resource_cls: type[dg.ConfigurableResource[Any]]
    env_fields: frozenset[str]
    secret_fields: frozenset[str] = frozenset()
    secret_alternatives: Mapping[str, str] = field(default_factory=dict)
    """For a secret field, where else its value may come from (a ``*_file`` field), for the error message."""

    @property
    def unquoted_fields(self) -> frozenset[str]:
        """Fields whose YAML line an error never quotes: it may hold the secret being refused."""
        return self.secret_fields | (_CONNECTION_STRINGS & set(self.resource_cls.model_fields))

    def field_definitions(self) -> dict[str, tuple[Any, FieldInfo]]:
        """Each resource field as a model field: the resource's type, default and description, widened to
        ``EnvRef`` where an environment variable may stand for it and to ``str`` where a template may."""
        out: dict[str, tuple[Any, FieldInfo]] = {}
        for name, info in self.resource_cls.model_fields.items():
            annotation: Any = info.annotation
            if name in self.secret_fields:
                annotation = EnvRef | str | None  # a str only to be refused by name, without echoing it
            elif name in self.env_fields:
                annotation = annotation | EnvRef
            elif _scalar_typed(annotation):
                annotation = annotation | str
            description = info.description or ""
            if name in self.secret_fields:
                alternative = self.secret_alternatives.get(name)
                description = (
                    "A secret: {env: NAME} only"
                    + (f" (or {alternative})" if alternative else "")
                    + (", never a literal or a {{ env.NAME }} template (rendered into the plain value at load).")
                )
            elif name in self.env_fields:
                description = f"{description} May be {{env: NAME}}.".strip()
            if info.is_required():
                spec = Field(description=description or None)
            elif info.default_factory is not None:
                spec = Field(default_factory=info.default_factory, description=description or None)
            else:
                spec = Field(default=info.default, description=description or None)
            out[name] = (annotation, spec)
        return out

    def build(self, context: dg.ResolutionContext, values: Mapping[str, Any], path: tuple[str, ...] = ()) -> Any:
        """The resource from the attributes that were set (the others keep the resource's defaults)."""
        kwargs: dict[str, Any] = {}
        # Secrets first: a refused literal secret is reported before an error elsewhere could quote its line.
        for name in sorted(values, key=lambda n: n not in self.unquoted_fields):
            kwargs[name] = self._value(context, path, name, values[name])
        try:
            return self.resource_cls(**kwargs)
        except ValidationError as exc:
            raise located_error(context, path, _field_of(exc, kwargs), describe_validation_error(exc), self) from None
        except ValueError as exc:
            raise located_error(context, path, _named_field(str(exc), kwargs), str(exc), self) from None

    def _value(self, context: dg.ResolutionContext, path: tuple[str, ...], name: str, raw: Any) -> Any:
        if isinstance(raw, EnvRef):
            return dg.EnvVar(raw.env)
        if name in self.secret_fields:
            if raw is None:
                return None
            alternative = self.secret_alternatives.get(name)
            other = f" (or {alternative}, a mounted file)" if alternative else ""
            raise located_error(
                context,
                path,
                name,
                f"{name}: a secret is given as {{env: NAME}}{other}, never as a literal or a {{{{ env.NAME }}}} "
                "template: Dagster renders those into the plain value when the definitions load, and keeps it in "
                "the resource configuration the UI shows and every run stores",
                self,
            )
        value = context.at_path(name).resolve_value(raw)
        if name in _CONNECTION_STRINGS and isinstance(value, str) and value != STORE_NEXT_TO_STREAM:
            # A string that is no URL (a DSN) or cannot be read is refused by the resource's own check, unquoted.
            reading = read(value)
            if reading.well_formed and reading.secrets and "://" in value:
                raise located_error(
                    context,
                    path,
                    name,
                    f"{name}: this URL holds a secret (a password in its user info, or a parameter such as "
                    "password=, sslpassword= or token=): give the whole URL as {env: NAME} (it would otherwise be "
                    "kept in the resource configuration the UI shows and every run stores)",
                    self,
                )
        return value


YAML_MINIMUMS: Mapping[str, tuple[float, str]] = {
    "heartbeat_interval_s": (
        DAEMON_LOOP_S,
        "Dagster's daemon ticks sensors every 5 s at the fastest, so a member's heartbeat is never more often",
    ),
}
"""Bounds the YAML holds that the resource, also built by tests that tick sensors by hand, does not; checked once
a ``{{ }}`` template is rendered, with the field's line (as ``members`` is)."""


def _field_of(exc: ValidationError, fields: Mapping[str, Any]) -> str | None:
    for err in exc.errors(include_input=False, include_url=False):
        if err["loc"] and str(err["loc"][0]) in fields:
            return str(err["loc"][0])
        named = _named_field(err["msg"].removeprefix("Value error, "), fields)
        if named is not None:
            return named
    return None


def _named_field(message: str, fields: Mapping[str, Any]) -> str | None:
    """The field a resource's message is about: the one it starts with (``bootstrap_servers: ...``), else the
    first given field it names (a check across fields names them in its text)."""
    head = message.split(":", 1)[0].strip()
    if head in fields:
        return head
    found = [(m.start(), name) for name in fields if (m := re.search(rf"\b{re.escape(name)}\b", message))]
    return min(found)[1] if found else None


def located_error(
    context: dg.ResolutionContext,
    path: tuple[str, ...],
    name: str | None,
    message: str,
    attributes: ResourceAttributes | None = None,
    *,
    quote: bool = True,
) -> ComponentConfigError:
    """An error that names the YAML attribute and, loaded from a file, its file and line. The YAML around a
    secret field is not quoted: its line may hold the value being refused."""
    keys: list[str | int] = [*context.path, *path, *([name] if name else [])]
    where = ".".join(str(k) for k in keys) or "attributes"
    text = f"{where}: {message.removeprefix(f'{name}: ') if name else message}"
    tree = context.source_position_tree
    if tree is None:
        return ComponentConfigError(text)
    position, _ = tree.lookup_closest_and_path(keys, trace=None)
    text = f"{position.filename}:{position.start.line} - {text}"
    if not quote or (attributes is not None and name in attributes.unquoted_fields):
        return ComponentConfigError(text)
    snippet = tree.source_error(yaml_path=keys, inline_error_message=message, value_error=True).snippet
    return ComponentConfigError(f"{text}\n{snippet}" if snippet else text)


_CONNECTION_STRINGS = frozenset(
    {
        "store_url",
        "remote",
        "schema_registry_url",
        "schema_registry_basic_auth_user_info_file",
        "schema_registry_bearer_token_file",
    }
)
"""Besides the stream connection's own fields, the URLs that may hold a secret (the state store's: a password; a
Spark Connect server's: ``;token=``; the Schema Registry's), and where the registry's credentials are."""
_REGISTRY_SECRETS = {
    "schema_registry_basic_auth_user_info": "schema_registry_basic_auth_user_info_file",
    "schema_registry_bearer_token": "schema_registry_bearer_token_file",
}

KAFKA_ATTRIBUTES = ResourceAttributes(
    KafkaStreamGroup,
    env_fields=frozenset(
        n
        for n, f in KafkaStreamGroup.model_fields.items()
        if _str_typed(f.annotation) and (n in KafkaStreamConfig.model_fields or n in _CONNECTION_STRINGS)
    ),
    secret_fields=frozenset({"sasl_password", "oauthbearer_client_secret", "ssl_key_password", *_REGISTRY_SECRETS}),
    secret_alternatives={
        "sasl_password": "sasl_password_file",
        "oauthbearer_client_secret": "oauthbearer_client_secret_file",
        "ssl_key_password": "ssl_key_password_file",
        **_REGISTRY_SECRETS,
    },
)
V3IO_ATTRIBUTES = ResourceAttributes(
    V3ioStreamGroup,
    env_fields=frozenset(
        n
        for n, f in V3ioStreamGroup.model_fields.items()
        if _str_typed(f.annotation) and (n in V3ioStreamConfig.model_fields or n in _CONNECTION_STRINGS)
    ),
    secret_fields=frozenset({"access_key", *_REGISTRY_SECRETS}),
    secret_alternatives={"access_key": "access_key_file", **_REGISTRY_SECRETS},
)
SPARK_ATTRIBUTES = ResourceAttributes(
    StreamSparkResource,
    env_fields=frozenset({"master", "remote"}),  # a Connect URL may carry a token
)


# The function, by module path.


def load_function(context: dg.ResolutionContext, reference: str) -> StreamFn:
    """``module:function``, or ``.module:function`` relative to the folder of the ``defs.yaml`` (its package),
    as Python's relative imports are."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr.isidentifier():
        raise ValueError(
            f"function: {reference!r} is not module:function (e.g. my_project.streams:process, or .stream:process "
            "for stream.py beside this defs.yaml)"
        )
    if module_name.startswith("."):
        decl_context = context.stash.get(RESOLUTION_CONTEXT_STASH_KEY)
        if not isinstance(decl_context, ComponentDeclLoadContext):
            raise ValueError(
                f"function: {reference!r} is relative, and this component was not loaded from a defs/ folder"
            )
        package = decl_context.defs_relative_module_name(decl_context.path)
        module_name = importlib.util.resolve_name(module_name, package)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"function: cannot import {module_name!r} ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"function: module {module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


# The components.

SensorStatus = Literal["RUNNING", "STOPPED"]
_STATUS = {"RUNNING": dg.DefaultSensorStatus.RUNNING, "STOPPED": dg.DefaultSensorStatus.STOPPED}


@dataclass
class StreamGroupComponent(dg.Component, dg.Resolvable):
    """A consumer group's stream asset (with its checks), member sensors and resources, from one ``defs.yaml``.

    In Python it takes the resources themselves; in YAML, the group resource's fields are attributes at the top
    level beside ``function``, ``members`` and the rest, and the Spark resource's under ``spark``."""

    function: StreamFn
    """Called once per run, as the ``stream_asset`` body is: ``fn(context, df) -> metadata | None``."""
    streamgroup: StreamGroupResource
    spark: StreamSparkResource = field(default_factory=StreamSparkResource)
    members: int = 3
    default_status: dg.DefaultSensorStatus = dg.DefaultSensorStatus.STOPPED
    asset: StreamAssetAttributes = field(default_factory=StreamAssetAttributes)
    freshness: bool = False
    freshness_margin_s: float = 60.0
    resource_key: str | None = None
    spark_resource_key: str | None = None
    in_process_executor: bool = True
    sink: RangeSink | None = None
    """Where the function's rows go (``stream_asset(sink=...)``); the function then returns its DataFrame."""

    resource_type: ClassVar[type[StreamGroupResource]] = StreamGroupResource
    attributes: ClassVar[ResourceAttributes]

    def __post_init__(self) -> None:
        if not isinstance(self.streamgroup, self.resource_type):
            raise TypeError(
                f"{type(self).__name__}: streamgroup must be a {self.resource_type.__name__}, "
                f"got {type(self.streamgroup).__name__}"
            )
        if self.members < 1:
            raise ValueError(f"members: must be >= 1, got {self.members}")

    @classmethod
    def get_spec(cls) -> dg.ComponentTypeSpec:
        """What it produces, for the UI's component picker (declared: it is known only once configured)."""
        return dg.ComponentTypeSpec(produces=["asset", "asset_check", "sensor", "resource"], tags=["streaming"])

    # YAML: the model and the way back.

    @classmethod
    def model(cls) -> type[BaseModel]:
        return _component_model(cls)

    @classmethod
    def resolve_from_model(cls, context: dg.ResolutionContext, model: BaseModel) -> Self:
        given = model.model_fields_set
        attrs = dict(model)  # shallow: nested models (EnvRef, spark, asset) stay models
        resource_values = {n: attrs[n] for n in cls.attributes.resource_cls.model_fields if n in given}
        streamgroup = cls.attributes.build(context, resource_values)
        assert isinstance(streamgroup, StreamGroupResource)
        for name, (minimum, reason) in YAML_MINIMUMS.items():
            if getattr(streamgroup, name) < minimum:
                raise located_error(
                    context, (), name, f"{name}: {getattr(streamgroup, name):g} s is below {minimum:g} s: {reason}"
                )
        try:
            check_tick_interval(streamgroup, streamgroup.heartbeat_interval_s)
        except ValueError as exc:
            raise located_error(context, (), _named_field(str(exc), resource_values), str(exc)) from None

        spark_model = attrs["spark"]
        assert isinstance(spark_model, BaseModel)
        spark = SPARK_ATTRIBUTES.build(
            context,
            {n: getattr(spark_model, n) for n in spark_model.model_fields_set},
            ("spark",),
        )
        assert isinstance(spark, StreamSparkResource)

        def scalar(name: str, kind: Any) -> Any:
            raw = context.at_path(name).resolve_value(attrs[name])
            try:
                return TypeAdapter(kind).validate_python(raw)
            except ValidationError as exc:
                raise located_error(context, (), name, describe_validation_error(exc) or str(exc)) from None

        try:
            function = load_function(context, str(context.at_path("function").resolve_value(attrs["function"])))
        except ValueError as exc:
            raise located_error(context, (), "function", str(exc)) from None
        asset = attrs["asset"]
        assert isinstance(asset, StreamAssetAttributes)
        members = scalar("members", Annotated[int, Field(ge=1)])
        sink = _resolve_sink(context, attrs["sink"])
        try:
            return cls(
                function=function,
                streamgroup=streamgroup,
                spark=spark,
                members=members,
                default_status=_STATUS[attrs["default_status"]],
                asset=StreamAssetAttributes.model_validate(context.at_path("asset").resolve_value(asset.model_dump())),
                freshness=scalar("freshness", bool),
                freshness_margin_s=scalar("freshness_margin_s", Annotated[float, Field(ge=0)]),
                resource_key=attrs["resource_key"],
                spark_resource_key=attrs["spark_resource_key"],
                in_process_executor=scalar("in_process_executor", bool),
                sink=sink,
            )
        except (TypeError, ValueError) as exc:
            raise located_error(context, (), None, str(exc)) from None

    # The definitions.

    @property
    def group_resource_key(self) -> str:
        """``streamgroup_<group>`` unless set: resource keys are project-wide, and a project may hold several groups."""
        return self.resource_key or f"streamgroup_{sgt.dagster_name(self.streamgroup.group)}"

    @property
    def pyspark_resource_key(self) -> str:
        return self.spark_resource_key or f"pyspark_{sgt.dagster_name(self.streamgroup.group)}"

    def freshness_policy(self) -> dg.FreshnessPolicy | None:
        """Opt-in: Dagster judges freshness by the latest materialization of any partition, so an idle stream
        (nothing to read, zero lag) goes stale as surely as a stopped group."""
        if not self.freshness:
            return None
        return stream_freshness_policy(self.streamgroup, margin_s=self.freshness_margin_s)

    def stream_asset(self) -> dg.AssetsDefinition:
        return stream_asset(
            group=self.streamgroup.group,
            name=self.asset.name,
            key_prefix=self.asset.key_prefix,
            resource_key=self.group_resource_key,
            spark_resource_key=self.pyspark_resource_key,
            description=self.asset.description,
            group_name=self.asset.group_name,
            kinds=set(self.asset.kinds) if self.asset.kinds else None,
            freshness_policy=self.freshness_policy(),
            owners=self.asset.owners,
            tags=self.asset.tags,
            value_schema=self.asset.value_schema,
            key_schema=self.asset.key_schema,
            sink=self.sink,
        )(self.function)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return self.definitions()

    def definitions(self) -> dg.Definitions:
        """What ``stream_definitions`` builds, under this component's resource keys."""
        asset = self.stream_asset()
        return dg.Definitions(
            assets=[asset, *filter(None, [backfill_asset_of(asset)])],
            sensors=member_sensors(
                asset,
                members=self.members,
                heartbeat_interval_s=self.streamgroup.heartbeat_interval_s,
                default_status=self.default_status,
            ),
            resources={self.group_resource_key: self.streamgroup, self.pyspark_resource_key: self.spark},
            executor=dg.in_process_executor if self.in_process_executor else None,
        )


_COMPONENT_FIELDS = ("function", "members", "default_status", "asset", "freshness", "freshness_margin_s",
                     "resource_key", "spark_resource_key", "in_process_executor", "spark", "sink")  # fmt: skip


def _resolve_sink(context: dg.ResolutionContext, given: Mapping[str, Any] | None) -> RangeSink | None:
    """The ``sink:`` attribute with its ``{{ }}`` templates rendered, checked as the sink its ``kind`` names."""
    if given is None:
        return None
    raw = context.at_path("sink").resolve_value(dict(given))
    try:
        sink = TypeAdapter(Sink).validate_python(raw)
    except ValidationError as exc:
        # Unquoted: the refused value may be a secret (a producer property, a storage option).
        raise located_error(context, ("sink",), None, describe_validation_error(exc), quote=False) from None
    assert isinstance(sink, RangeSink)
    return sink


@cache
def _spark_model() -> type[BaseModel]:
    model: type[BaseModel] = create_model(
        "SparkAttributes",
        __base__=dg.Model,
        __doc__="The Spark resource of the runs (StreamSparkResource): a local master or a Spark Connect server.",
        **SPARK_ATTRIBUTES.field_definitions(),  # type: ignore[call-overload]
    )
    return model


@cache
def _component_model(cls: type[StreamGroupComponent]) -> type[BaseModel]:
    """The YAML attributes: the component's own, then the group resource's fields at the top level."""
    resource_fields = cls.attributes.field_definitions()
    clash = set(resource_fields) & set(_COMPONENT_FIELDS)
    if clash:  # a resource field named like a component attribute would be shadowed
        raise TypeError(f"{cls.__name__}: resource fields {sorted(clash)} clash with the component's attributes")
    own: dict[str, tuple[Any, Any]] = {
        "function": (
            str,
            Field(
                description="The stream function, module:function (.module:function: relative to this defs.yaml's "
                "folder). Called once per run as the stream_asset body is: fn(context, df) -> metadata | None.",
                examples=[".stream:process", "my_project.streams:process"],
            ),
        ),
        "members": (int | str, Field(default=3, description="Member sensors <group>_member_0..N-1.")),
        "default_status": (
            SensorStatus,
            Field(default="STOPPED", description="RUNNING: the members consume as soon as the code location loads."),
        ),
        "asset": (StreamAssetAttributes, Field(default_factory=StreamAssetAttributes)),
        "freshness": (
            bool | str,
            Field(
                default=False,
                description="Give the asset a Dagster FreshnessPolicy from the group's latency settings (warn at "
                "max_wait_s + 2 ticks + freshness_margin_s, fail at twice that). Off by default: Dagster judges "
                "freshness by the latest materialization of any shard, so an idle stream goes stale too.",
            ),
        ),
        "freshness_margin_s": (
            float | str,
            Field(default=60.0, description="What a run takes to start, read and commit, in the freshness windows."),
        ),
        "resource_key": (
            str | None,
            Field(default=None, description="The group resource's key (default: streamgroup_<group>)."),
        ),
        "spark_resource_key": (
            str | None,
            Field(default=None, description="The Spark resource's key (default: pyspark_<group>)."),
        ),
        "in_process_executor": (
            bool | str,
            Field(
                default=True,
                description="Set Dagster's in-process executor (a stream run is one step); false when the project "
                "sets an executor of its own.",
            ),
        ),
        "spark": (_spark_model(), Field(default_factory=_spark_model())),
        # A mapping checked by _resolve_sink, not the sinks' own models: Dagster's error for a refused YAML value
        # quotes it, and a sink's refused property may be a secret; ours names the attribute and its line only.
        "sink": (
            dict[str, Any] | None,
            Field(
                default=None,
                description="Where the function's rows go, committed before the run's ranges: kind: delta (table, "
                "partition_by, ...), kafka (topic, ...) or parquet_ranges (path). The function then returns its rows "
                "as a DataFrame, keeping their source columns (topic, partition, offset; v3io: shard, "
                "sequence_number). See docs/outputs.md.",
            ),
        ),
    }
    assert tuple(own) == _COMPONENT_FIELDS
    model: type[BaseModel] = create_model(
        f"{cls.__name__}Model",
        __base__=dg.Model,
        __doc__=cls.__doc__,
        **own,  # type: ignore[call-overload]
        **resource_fields,
    )
    return model


# One component per stream kind, each with its own scaffold.


class ScaffoldParams(BaseModel):
    """``dg scaffold defs ... --json-params``: named as the ``defs.yaml`` attributes they become, checked as those
    are (an unknown key is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid")

    group: str | None = Field(default=None, description="The consumer group (default: the folder's name).")

    def resource_values(self) -> dict[str, Any]:
        """The group resource's fields these parameters set (a placeholder group where the folder names it)."""
        return {"group": self.group or "scaffold"}

    @model_validator(mode="after")
    def _checked_as_the_yaml_is(self) -> Self:
        resource = KafkaStreamGroup if isinstance(self, KafkaScaffoldParams) else V3ioStreamGroup
        try:
            resource(**self.resource_values())
        except ValidationError as exc:
            raise ValueError(describe_validation_error(exc)) from None
        return self


class KafkaScaffoldParams(ScaffoldParams):
    bootstrap_servers: str = Field(default="127.0.0.1:9092", description="The Kafka cluster (host:port,...).")
    topics: list[str] | None = Field(default=None, description="The topics (default: one, the folder's name).")

    def resource_values(self) -> dict[str, Any]:
        return {
            **super().resource_values(),
            "bootstrap_servers": self.bootstrap_servers,
            "topics": self.topics or ["t"],
        }


class V3ioScaffoldParams(ScaffoldParams):
    endpoint: str = Field(default="http://127.0.0.1:8081", description="The v3io web API.")
    container: str = Field(default="bigdata", description="The container holding the stream.")
    stream_path: str | None = Field(default=None, description="The stream's path (default: the folder's name).")

    def resource_values(self) -> dict[str, Any]:
        values = {"endpoint": self.endpoint, "container": self.container, "stream_path": self.stream_path or "s"}
        return {**super().resource_values(), **values, "access_key": dg.EnvVar("V3IO_ACCESS_KEY")}


FUNCTION_FILE = "stream.py"
FUNCTION_STUB = '''\
"""The stream function of consumer group {group!r}, named in defs.yaml beside this file."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import dagster as dg

from dagster_streamgroup.dagster import ranges_of

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def process(context: dg.AssetExecutionContext, df: DataFrame) -> dict[str, Any]:
    """The offset ranges of consumer group {group!r}: one run holds a range of each of its member's ready shards."""
    for r in ranges_of(context):  # what df holds, one range per shard
        context.log.info(f"{{r.shard}} [{{r.start}}, {{r.end}})")
    # Write what you compute idempotently per range: a retried or backfilled range replaces its own output.
    return {{"rows": dg.MetadataValue.int(df.count())}}
'''


class StreamGroupScaffolder(dg.Scaffolder[ScaffoldParams]):
    """Writes ``defs.yaml`` (the group's settings, commented) and ``stream.py`` (the function it names)."""

    params_cls: ClassVar[type[ScaffoldParams]] = ScaffoldParams

    @classmethod
    def get_scaffold_params(cls) -> type[ScaffoldParams]:
        return cls.params_cls

    def connection(self, params: ScaffoldParams, name: str) -> list[str]:
        """The stream's attributes, one YAML line each."""
        raise NotImplementedError

    def scaffold(self, request: dg.ScaffoldRequest[ScaffoldParams]) -> None:
        folder = request.target_path.parent if request.append else request.target_path
        name = sgt.dagster_name(folder.name)
        params = self.params_cls.model_validate(request.params.model_dump() if request.params else {})
        group = params.group or name
        if request.scaffold_format == "python":
            dg.scaffold_component(request)  # component.py: a function that returns the component, to fill in
        elif request.append:  # another document in an existing defs.yaml
            with request.target_path.open("a", encoding="utf-8") as out:
                out.write("---\n" + self.defs_yaml(request.type_name, group, params, name))
        else:
            (request.target_path / "defs.yaml").write_text(self.defs_yaml(request.type_name, group, params, name))
        stub = folder / FUNCTION_FILE
        if not stub.exists():
            stub.write_text(FUNCTION_STUB.format(group=group))
        if request.project_root is not None:
            for line in project_setup(request.project_root):
                print(line)

    def defs_yaml(self, type_name: str, group: str, params: ScaffoldParams, name: str) -> str:
        lines = [
            f"type: {type_name}",
            "",
            "attributes:",
            "  # Called once per run with the run's offset ranges as one Spark DataFrame (stream.py, beside this).",
            f"  function: .{Path(FUNCTION_FILE).stem}:process",
            "  asset:",
            "    # default: the function's name",
            f"    name: {name}",
            f"  # The member sensors, {sgt.dagster_name(group)}_member_0..2; RUNNING: they consume as soon as the code",
            "  # location loads.",
            "  members: 3",
            "  default_status: STOPPED",
            "  # The group resource's fields: the consumer group, its policy (heartbeat_interval_s is also the member",
            "  # sensors' interval), the stream.",
            f"  group: {group}",
            "  heartbeat_interval_s: 5",
            *(f"  {line}" for line in self.connection(params, name)),
            "  # The Spark resource of the runs: a master, or remote: sc://HOST:15002 (Spark Connect).",
            "  spark:",
            "    master: local[*]",
            "  # Where the function's rows go, each run's replacing exactly its ranges' rows (docs/outputs.md); the",
            "  # function then returns its DataFrame:",
            "  # sink:",
            "  #   kind: delta",
            f"  #   table: output/{name}",
            "  #   partition_by: [day]",
        ]
        return "\n".join(lines) + "\n"


def project_setup(project_root: Path) -> list[str]:
    """What a ``dg`` project needs once, beside each group's ``defs.yaml``: the instance settings ``dg dev`` reads
    (written when absent, else the missing ones named) and the group state's folder kept out of git."""
    out = [ensure_instance_settings(project_root)]
    ignore = project_root / ".gitignore"
    entry = f"{STATE_DIR}/"
    if ignore.is_file():
        listed = {line.strip() for line in ignore.read_text(encoding="utf-8").splitlines()}
        if not listed & {entry, STATE_DIR, f"/{entry}", f"/{STATE_DIR}"}:
            text = ignore.read_text(encoding="utf-8")
            separator = "" if not text or text.endswith("\n") else "\n"
            ignore.write_text(f"{text}{separator}\n# dagster-streamgroup: the group state while DAGSTER_HOME is unset\n"
                              f"{entry}\n", encoding="utf-8")  # fmt: skip
            out.append(f"Added {entry} to {ignore} (the group state's SQLite file while DAGSTER_HOME is unset).")
    return out


class KafkaScaffolder(StreamGroupScaffolder):
    params_cls = KafkaScaffoldParams

    def connection(self, params: ScaffoldParams, name: str) -> list[str]:
        assert isinstance(params, KafkaScaffoldParams)
        return [
            f"bootstrap_servers: {params.bootstrap_servers}",
            f"topics: [{', '.join(params.topics or [name])}]",
            "# A secret is {env: NAME}, read where it is used; never a literal, never {{ env.NAME }}:",
            "# security_protocol: SASL_SSL",
            "# sasl_mechanism: SCRAM-SHA-512",
            "# sasl_username: svc",
            "# sasl_password: {env: KAFKA_PASSWORD}",
        ]


class V3ioScaffolder(StreamGroupScaffolder):
    params_cls = V3ioScaffoldParams

    def connection(self, params: ScaffoldParams, name: str) -> list[str]:
        assert isinstance(params, V3ioScaffoldParams)
        return [
            f"endpoint: {params.endpoint}",
            f"container: {params.container}",
            f"stream_path: {params.stream_path or name}",
            "# A secret is {env: NAME}, read where it is used; never a literal, never {{ env.NAME }}:",
            "access_key: {env: V3IO_ACCESS_KEY}",
            "# The group state as a KV item next to the stream.",
            "store_url: v3io",
        ]


@dg.scaffold_with(KafkaScaffolder)
@dataclass
class KafkaStreamGroupComponent(StreamGroupComponent):
    """A consumer group over a Kafka topic set: the stream asset, its checks, the member sensors and the
    resources. The attributes are KafkaStreamGroup's fields, plus function, members, spark and the rest."""

    streamgroup: KafkaStreamGroup  # narrowed: the YAML attributes are its fields

    resource_type: ClassVar[type[StreamGroupResource]] = KafkaStreamGroup
    attributes: ClassVar[ResourceAttributes] = KAFKA_ATTRIBUTES


@dg.scaffold_with(V3ioScaffolder)
@dataclass
class V3ioStreamGroupComponent(StreamGroupComponent):
    """A consumer group over an Iguazio v3io stream: the stream asset, its checks, the member sensors and the
    resources. The attributes are V3ioStreamGroup's fields, plus function, members, spark and the rest."""

    streamgroup: V3ioStreamGroup

    resource_type: ClassVar[type[StreamGroupResource]] = V3ioStreamGroup
    attributes: ClassVar[ResourceAttributes] = V3IO_ATTRIBUTES


__all__ = [
    "EnvRef",
    "KafkaStreamGroupComponent",
    "StreamAssetAttributes",
    "StreamGroupComponent",
    "V3ioStreamGroupComponent",
]
