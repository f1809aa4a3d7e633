"""The stream group components in process: the YAML attributes are the resources' fields, a defs folder builds
what ``stream_definitions`` builds, secrets stay ``dagster.EnvVar`` names, errors name the YAML field, and the
opt-in freshness policy follows the group's latency settings. The ``dg`` CLI itself: test_component_dg.py."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.freshness import TimeWindowFreshnessPolicy
from dagster.components.testing import DefsFolderSandbox, create_defs_folder_sandbox
from pydantic import BaseModel

from dagster_streamgroup.dagster import (
    KafkaStreamGroup,
    KafkaStreamGroupComponent,
    StreamSparkResource,
    V3ioStreamGroup,
    V3ioStreamGroupComponent,
    freshness_windows,
    sink_replaces_by_coordinates,
    stream_asset,
    stream_definitions,
    stream_freshness_policy,
)
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.checks import LAG_CHECK, PARKED_CHECK
from dagster_streamgroup.dagster.component import (
    KAFKA_ATTRIBUTES,
    V3IO_ATTRIBUTES,
    ComponentConfigError,
    EnvRef,
    StreamGroupComponent,
)
from dagster_streamgroup.dagster.devserver import ROOT
from dagster_streamgroup.sinks import DeltaSink
from tests.secrets.leaks import Evidence, find_secrets

COMPONENT_ATTRIBUTES = {
    "function", "members", "default_status", "asset", "freshness", "freshness_margin_s", "resource_key",
    "spark_resource_key", "in_process_executor", "spark", "sink",
}  # fmt: skip
KAFKA_TYPE = "dagster_streamgroup.KafkaStreamGroupComponent"
V3IO_TYPE = "dagster_streamgroup.V3ioStreamGroupComponent"

STREAM_PY = '''
import dagster as dg


def process(context: dg.AssetExecutionContext, df: object) -> dict[str, object]:
    """Clicks, per range."""
    return {"seen": 1}
'''


@pytest.fixture
def sandbox() -> Iterator[DefsFolderSandbox]:
    with create_defs_folder_sandbox() as box:
        yield box


def write_component(sandbox: DefsFolderSandbox, name: str, attributes: str, type_name: str = KAFKA_TYPE) -> Path:
    """A component folder as a user writes it: defs.yaml and the function's module beside it."""
    folder = sandbox.defs_folder_path / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stream.py").write_text(STREAM_PY)
    body = textwrap.indent(textwrap.dedent(attributes).strip(), "  ")
    (folder / "defs.yaml").write_text(f"type: {type_name}\n\nattributes:\n{body}\n")
    return folder


def load(sandbox: DefsFolderSandbox, folder: Path) -> tuple[StreamGroupComponent, dg.Definitions]:
    with sandbox.load_component_and_build_defs(defs_path=folder) as (component, defs):
        assert isinstance(component, StreamGroupComponent)
        return component, defs


def load_error(sandbox: DefsFolderSandbox, folder: Path) -> str:
    """The component's own error, as Dagster shows it under the component tree's (its cause)."""
    with pytest.raises(Exception) as caught:
        load(sandbox, folder)
    error: BaseException | None = caught.value
    while error is not None and not isinstance(error, ComponentConfigError):
        error = error.__cause__
    assert error is not None, caught.value
    return str(error)


KAFKA = """
function: .stream:process
group: clicks
bootstrap_servers: 127.0.0.1:9092
topics: [clicks]
heartbeat_interval_s: 5
"""


def test_yaml_attributes_are_the_group_resources_fields() -> None:
    for component, resource in (
        (KafkaStreamGroupComponent, KafkaStreamGroup),
        (V3ioStreamGroupComponent, V3ioStreamGroup),
    ):
        model = component.model()
        assert set(model.model_fields) == COMPONENT_ATTRIBUTES | set(resource.model_fields)
        spark = model.model_fields["spark"].annotation
        assert isinstance(spark, type) and issubclass(spark, BaseModel)
        assert set(spark.model_fields) == set(StreamSparkResource.model_fields)
        schema = model.model_json_schema()
        for name in ("group", "heartbeat_interval_s", "max_wait_s"):  # the resource's own descriptions
            assert schema["properties"][name]["description"] == resource.model_fields[name].description
    kafka = KafkaStreamGroupComponent.model().model_json_schema()["properties"]
    assert {"$ref": "#/$defs/EnvRef"} in kafka["sasl_password"]["anyOf"]
    assert {"$ref": "#/$defs/EnvRef"} in kafka["bootstrap_servers"]["anyOf"]
    assert "anyOf" not in kafka["group"], "the group is needed when the definitions are built: no EnvVar"
    assert {"bootstrap_servers", "sasl_username", "ssl_ca_location", "store_url"} <= KAFKA_ATTRIBUTES.env_fields
    assert {"group", "run_mode", "seek"}.isdisjoint(KAFKA_ATTRIBUTES.env_fields)
    assert {"endpoint", "container", "stream_path", "access_key_file", "store_url"} <= V3IO_ATTRIBUTES.env_fields


def test_a_scaffolded_component_builds_what_stream_definitions_builds(sandbox: DefsFolderSandbox) -> None:
    folder = sandbox.scaffold_component(KafkaStreamGroupComponent, defs_path="clicks")
    assert (folder / "defs.yaml").read_text().startswith("type: dagster_streamgroup.dagster.component.")
    assert "def process(" in (folder / "stream.py").read_text()
    component, defs = load(sandbox, folder)
    assert isinstance(component.streamgroup, KafkaStreamGroup)

    by_python = stream_definitions(
        stream_asset(group="clicks", name="clicks")(component.function),
        KafkaStreamGroup(group="clicks", bootstrap_servers="127.0.0.1:9092", topics=["clicks"]),
        members=3,
    )
    asset = defs.get_assets_def("clicks")
    python_asset = by_python.get_assets_def("clicks")
    assert asset.partitions_def == python_asset.partitions_def == dg.DynamicPartitionsDefinition(name="clicks_shards")
    assert {k.name for k in asset.check_keys} == {LAG_CHECK, PARKED_CHECK}
    assert asset.metadata_by_key[asset.key][sgt.TAG_GROUP] == "clicks"
    assert asset.specs_by_key[asset.key].freshness_policy is None, "opt-in"
    sensors = {s.name: s for s in defs.sensors or []}
    python_sensors = {s.name: s for s in by_python.sensors or []}
    assert sorted(sensors) == sorted(python_sensors) == ["clicks_member_0", "clicks_member_1", "clicks_member_2"]
    for name, sensor in sensors.items():
        assert isinstance(sensor, dg.SensorDefinition)
        assert sensor.minimum_interval_seconds == python_sensors[name].minimum_interval_seconds == 5
        assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
        assert not sensor.required_resource_keys, "the tick builds its group resource once per code server"
        assert "'streamgroup_clicks'" in (sensor.description or "")
    resources = defs.resources or {}
    assert set(resources) == {"streamgroup_clicks", "pyspark_clicks"}
    assert resources["streamgroup_clicks"] == by_python.resources["streamgroup"]  # type: ignore[index]
    assert isinstance(resources["pyspark_clicks"], StreamSparkResource)
    assert defs.executor is dg.in_process_executor


def test_env_refs_become_env_vars_and_templates_render(
    sandbox: DefsFolderSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SG_TOPIC", "views")
    monkeypatch.setenv("SG_MEMBERS", "2")
    folder = write_component(
        sandbox,
        "views",
        """
        function: .stream:process
        members: "{{ env.SG_MEMBERS }}"
        group: views
        bootstrap_servers: {env: SG_BOOTSTRAP}
        topics: ["{{ env.SG_TOPIC }}"]
        security_protocol: SASL_SSL
        sasl_mechanism: SCRAM-SHA-512
        sasl_username: svc
        sasl_password: {env: SG_PASSWORD}
        store_url: {env: SG_STORE_URL}
        spark:
          remote: {env: SG_CONNECT}
        """,
    )
    component, defs = load(sandbox, folder)
    group = component.streamgroup
    assert isinstance(group, KafkaStreamGroup)
    assert isinstance(group.sasl_password, dg.EnvVar) and group.sasl_password.env_var_name == "SG_PASSWORD"
    assert isinstance(group.bootstrap_servers, dg.EnvVar) and group.bootstrap_servers.env_var_name == "SG_BOOTSTRAP"
    assert isinstance(group.store_url, dg.EnvVar)
    assert isinstance(component.spark.remote, dg.EnvVar)
    assert group.topics == ["views"] and component.members == 2
    assert len(list(defs.sensors or [])) == 2
    assert component.function.__doc__ == "Clicks, per range."


@pytest.mark.parametrize("how", ["literal", "template"])
@pytest.mark.parametrize(
    ("type_name", "attributes", "field"),
    [
        (KAFKA_TYPE, KAFKA + "security_protocol: SASL_SSL\nsasl_mechanism: PLAIN\nsasl_username: u\n", "sasl_password"),
        (V3IO_TYPE, "function: .stream:process\ngroup: g\nendpoint: http://127.0.0.1:8081\ncontainer: c\n"
         "stream_path: s\n", "access_key"),
    ],
)  # fmt: skip
def test_a_secret_is_only_an_env_ref(
    sandbox: DefsFolderSandbox, monkeypatch: pytest.MonkeyPatch, type_name: str, attributes: str, field: str, how: str
) -> None:
    """A literal secret, or Dagster's ``{{ env.NAME }}`` (rendered into the plain value at load), is refused with
    the field and the way to give it, and the value never appears in the error."""
    secret = secrets.token_urlsafe(18)
    monkeypatch.setenv("SG_SECRET", secret)
    given = secret if how == "literal" else "'{{ env.SG_SECRET }}'"
    folder = write_component(sandbox, "clicks", f"{attributes}{field}: {given}\n", type_name)
    error = load_error(sandbox, folder)
    assert re.search(rf"defs.yaml:\d+ - attributes\.{field}: a secret is given as \{{env: NAME\}}", error), error
    assert secret not in error and "SG_SECRET" not in error


@pytest.mark.parametrize(
    ("attribute", "shown"),
    [
        ("store_url: postgresql://u:{pw}@127.0.0.1/db", "attributes.store_url: this URL holds a secret"),
        # psycopg reads a password in the query too: the guard used to look only at the user info, and let it in
        ("store_url: postgresql://u@127.0.0.1/db?password={pw}", "attributes.store_url: this URL holds a secret"),
        ("store_url: postgresql://u@127.0.0.1/db?sslpassword={pw}", "attributes.store_url: this URL holds a secret"),
        ("store_url: 'host=127.0.0.1 dbname=db password={pw}'", "attributes.store_url: password=*** dbname=db"),
        ("store_url: postgresql:/u:{pw}@127.0.0.1/db", "attributes.store_url: postgresql:*** is not a state store"),
        ("spark: {{remote: 'sc://127.0.0.1:15002/;token={pw}'}}", "attributes.spark.remote: this URL holds a secret"),
    ],
    ids=["user info", "password parameter", "sslpassword parameter", "keyword DSN", "a slash short", "Connect token"],
)
def test_a_connection_string_holding_a_secret_is_an_env_ref(
    sandbox: DefsFolderSandbox, attribute: str, shown: str
) -> None:
    """Refused at load in every form, and never quoted: a literal holding a secret would be kept in the
    snapshot; a malformed one is refused by the store's own check, which shows only what ``redact`` shows."""
    password = secrets.token_urlsafe(18)
    folder = write_component(sandbox, "clicks", f"{KAFKA}{attribute.format(pw=password)}\n")
    error = load_error(sandbox, folder)
    assert shown in error, error
    assert password not in error and password[:8] not in error and password[-8:] not in error


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bootstrap_servers": "nohost"}, r":6 - attributes\.bootstrap_servers: 'nohost' is not host:port"),
        ({"members": "0"}, r":\d+ - attributes\.members: Input should be greater than or equal to 1"),
        (
            {"function": ".stream:nope"},
            r":4 - attributes\.function: module '.*\.clicks\.stream' has no function 'nope'",
        ),
        ({"function": "process"}, r":4 - attributes\.function: 'process' is not module:function"),
        ({"function": "no_such_module:process"}, r"attributes\.function: cannot import 'no_such_module'"),
        ({"heartbeat_interval_s": "10", "session_timeout_s": "12"}, r":\d+ - attributes\.session_timeout_s: "),
        ({"heartbeat_interval_s": "1"}, r":\d+ - attributes\.heartbeat_interval_s: 1 s is below 5 s: Dagster's daemon"),
        ({"heartbeat_interval_s": "4"}, r"attributes\.heartbeat_interval_s: 4 s is below 5 s"),
        ({"tick_wait_s": "9"}, r"attributes\.tick_wait_s: must be between 0 and 3.5 s"),
        ({"run_mode": "everything"}, r"attributes\.run_mode: Input should be 'member' or 'shard'"),
        ({"spark": "{remote: http://x:1}"}, r"attributes\.spark\.remote: must be a Spark Connect URL"),
    ],
)
def test_errors_name_the_yaml_field_and_its_line(
    sandbox: DefsFolderSandbox, change: dict[str, str], message: str
) -> None:
    lines = dict(line.split(": ", 1) for line in KAFKA.strip().splitlines())
    lines.update(change)
    folder = write_component(sandbox, "clicks", "\n".join(f"{k}: {v}" for k, v in lines.items()))
    error = load_error(sandbox, folder)
    assert re.search(message, error), error


def test_two_groups_load_side_by_side(sandbox: DefsFolderSandbox) -> None:
    """Resource keys are project-wide: each component's are named after its group, so groups do not collide."""
    for group in ("clicks", "views"):
        write_component(sandbox, group, KAFKA.replace("group: clicks", f"group: {group}\nasset: {{name: {group}}}"))
    with sandbox.build_all_defs() as defs:
        keys = {"streamgroup_clicks", "pyspark_clicks", "streamgroup_views", "pyspark_views"}
        assert set(defs.resources or {}) == keys
        assert {s.name for s in defs.sensors or []} == {
            f"{g}_member_{i}" for g in ("clicks", "views") for i in range(3)
        }
        assert {a.key.to_user_string() for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition)} == {
            "clicks",
            "views",
            "clicks_backfill",
            "views_backfill",
        }


def _snapshot(defs: dg.Definitions) -> str:
    """What the code location serves the UI (its Resources page) and every run stores with its job snapshot."""
    from dagster._core.remote_representation.external_data import RepositorySnap
    from dagster._serdes import serialize_value

    return serialize_value(RepositorySnap.from_def(defs.get_repository_def()))


def test_the_component_path_keeps_secrets_out_of_the_snapshot(
    sandbox: DefsFolderSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/secrets' snapshot check, on definitions loaded from defs.yaml: the secrets are set in the environment
    as a deployment has them, the snapshot holds their variables' names and none of their values, in any
    encoding the search knows."""
    values = {
        "sasl": secrets.token_urlsafe(24),
        "postgres": secrets.token_urlsafe(24),
        "v3io": secrets.token_urlsafe(24),
    }
    monkeypatch.setenv("SASL_PW", values["sasl"])
    monkeypatch.setenv("STORE_URL", f"postgresql://u:{values['postgres']}@h:5432/db")
    monkeypatch.setenv("V3IO_KEY", values["v3io"])
    write_component(
        sandbox,
        "clicks",
        KAFKA + "security_protocol: SASL_PLAINTEXT\nsasl_mechanism: PLAIN\nsasl_username: svc\n"
        "sasl_password: {env: SASL_PW}\nstore_url: {env: STORE_URL}\n",
    )
    write_component(
        sandbox,
        "views",
        "function: .stream:process\nasset: {name: views}\ngroup: views\nendpoint: http://127.0.0.1:8081\n"
        "container: c\nstream_path: s\n"
        "access_key: {env: V3IO_KEY}\nstore_url: v3io\n",
        V3IO_TYPE,
    )
    with sandbox.build_all_defs() as defs:
        snapshot = _snapshot(defs)
    evidence = Evidence()
    evidence.add("snapshot, component", snapshot)
    assert find_secrets(evidence, values) == []
    assert "SASL_PW" in snapshot and "STORE_URL" in snapshot and "V3IO_KEY" in snapshot


def nothing(context: dg.AssetExecutionContext, df: object) -> None:
    """Processes nothing."""


def windows(policy: dg.FreshnessPolicy | None) -> tuple[timedelta, timedelta]:
    assert isinstance(policy, TimeWindowFreshnessPolicy)
    assert policy.warn_window is not None
    return policy.warn_window.to_timedelta(), policy.fail_window.to_timedelta()


def test_freshness_windows_follow_the_latency_settings() -> None:
    # warn = max_wait_s + 2 sensor ticks + margin; a tick is the heartbeat, and 5 s at the fastest (the daemon)
    assert freshness_windows(15, 5) == (timedelta(seconds=85), timedelta(seconds=170))
    assert freshness_windows(15, 1) == (timedelta(seconds=85), timedelta(seconds=170))
    assert freshness_windows(30, 10, margin_s=30) == (timedelta(seconds=80), timedelta(seconds=160))
    # Dagster's floor: no window under a minute
    assert freshness_windows(1, 1, margin_s=0) == (timedelta(seconds=60), timedelta(seconds=120))
    with pytest.raises(ValueError, match="margin_s"):
        freshness_windows(15, 5, margin_s=-1)
    group = KafkaStreamGroup(
        group="g", bootstrap_servers="h:1", topics=["t"], max_wait_s=40, heartbeat_interval_s=10, session_timeout_s=30
    )
    assert windows(stream_freshness_policy(group, margin_s=30)) == (timedelta(seconds=90), timedelta(seconds=180))


def test_freshness_is_opt_in(sandbox: DefsFolderSandbox) -> None:
    folder = write_component(sandbox, "clicks", KAFKA + "max_wait_s: 20\nfreshness: true\nfreshness_margin_s: 30\n")
    _, defs = load(sandbox, folder)
    asset = defs.get_assets_def("process")
    policy = asset.specs_by_key[asset.key].freshness_policy
    assert windows(policy) == (timedelta(seconds=60), timedelta(seconds=120))
    assert policy is not None
    by_python = stream_asset(group="g", name="by_python", freshness_policy=policy)(nothing)
    assert by_python.specs_by_key[by_python.key].freshness_policy == policy


def test_in_python_the_component_takes_its_own_resource_kind() -> None:
    group = V3ioStreamGroup(group="g", endpoint="http://127.0.0.1:8081", container="c", stream_path="s")
    with pytest.raises(TypeError, match="streamgroup must be a KafkaStreamGroup"):
        KafkaStreamGroupComponent(function=nothing, streamgroup=group)  # type: ignore[arg-type]
    component = V3ioStreamGroupComponent(function=nothing, streamgroup=group, members=1)
    assert [s.name for s in component.definitions().sensors or []] == ["g_member_0"]


def test_env_ref_names_a_variable() -> None:
    assert EnvRef(env="KAFKA_PASSWORD").env == "KAFKA_PASSWORD"
    with pytest.raises(ValueError, match="pattern"):
        EnvRef(env="not a name")


def test_importing_the_package_does_not_import_dagster() -> None:
    """The components are the package's attributes (dg's type names), imported on first use only: Spark's Python
    workers import this package too."""
    code = (
        "import sys, dagster_streamgroup\n"
        "assert 'dagster' not in sys.modules, 'dagster imported'\n"
        "assert 'KafkaStreamGroupComponent' in dir(dagster_streamgroup)\n"
        "assert dagster_streamgroup.KafkaStreamGroupComponent.__name__ == 'KafkaStreamGroupComponent'\n"
        "assert 'dagster' in sys.modules\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=env, timeout=120)


def test_the_docs_yaml_loads(sandbox: DefsFolderSandbox) -> None:
    """docs/dagster.md's defs.yaml, as written there, with its function beside it."""
    doc = (ROOT / "docs" / "dagster.md").read_text()
    found = re.search(r"`src/<project>/defs/clickstream/defs.yaml`[^`]*```yaml\n(.*?)```", doc, re.S)
    assert found is not None
    folder = sandbox.defs_folder_path / "clickstream"
    folder.mkdir()
    (folder / "defs.yaml").write_text(found.group(1))
    (folder / "stream.py").write_text("def process(context, df):\n    return None\n")
    component, defs = load(sandbox, folder)
    assert isinstance(component.streamgroup.sasl_password, dg.EnvVar)  # type: ignore[attr-defined]
    assert [s.name for s in defs.sensors or []] == [f"clickstream_member_{i}" for i in range(3)]
    assert defs.get_assets_def("clickstream").key == dg.AssetKey("clickstream")


# The scaffold: its parameters checked as the YAML is, and what a dg project gets once.


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ('{"topic": "clicks"}', r"topic\s+Extra inputs are not permitted"),
        ('{"bootstrap_servers": "nohost"}', r"bootstrap_servers: 'nohost' is not host:port"),
        ('{"topics": "clicks"}', r"topics\s+Input should be a valid (list|array)"),
    ],
)
def test_kafka_scaffold_params_are_checked_as_the_yaml_is(params: str, message: str) -> None:
    """As ``dg scaffold defs ... --json-params`` validates them (dagster's component_scaffolding)."""
    from pydantic import TypeAdapter, ValidationError

    from dagster_streamgroup.dagster.component import KafkaScaffoldParams

    with pytest.raises(ValidationError, match=message):
        TypeAdapter(KafkaScaffoldParams).validate_json(params)


def test_scaffold_params_name_the_yaml_attributes() -> None:
    from dagster_streamgroup.dagster.component import KafkaScaffolder, KafkaScaffoldParams, V3ioScaffoldParams

    params = KafkaScaffoldParams.model_validate_json('{"topics": ["a", "b"], "bootstrap_servers": "h:1"}')
    text = KafkaScaffolder().defs_yaml(KAFKA_TYPE, "g", params, "clicks")
    assert "  topics: [a, b]\n" in text and "  bootstrap_servers: h:1\n" in text
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        V3ioScaffoldParams.model_validate({"stream": "x"})
    with pytest.raises(ValueError, match="a v3io consumer-group name may hold only letters, digits and '_'"):
        V3ioScaffoldParams.model_validate({"group": "page-views"})


def test_a_dg_project_gets_the_instance_settings_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written where ``dg dev`` reads them while DAGSTER_HOME is unset (the project's root), the same settings as
    the example's dagster.yaml; a file already there is left alone and its missing settings named; the group
    state's folder kept out of git once."""
    import yaml  # type: ignore[import-untyped]

    from dagster_streamgroup.dagster.component import project_setup
    from dagster_streamgroup.dagster.instance_settings import INSTANCE_YAML, SETTINGS

    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    root = tmp_path / "demo"
    root.mkdir()
    (root / ".gitignore").write_text("__pycache__/")
    said = "\n".join(project_setup(root))
    assert f"Wrote {root / 'dagster.yaml'}" in said
    written = yaml.safe_load((root / "dagster.yaml").read_text())
    example = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    example.pop("telemetry")  # the example's own choice, not a stream setting
    assert written == example
    assert (root / "dagster.yaml").read_text() == INSTANCE_YAML
    assert (root / ".gitignore").read_text().splitlines()[-1] == ".streamgroup/"

    again = "\n".join(project_setup(root))  # a second group: nothing written twice
    assert f"{root / 'dagster.yaml'} has the stream runs' instance settings." in again
    assert (root / ".gitignore").read_text().count(".streamgroup/") == 1

    (root / "dagster.yaml").write_text("run_launcher:\n  module: dagster.core.launcher\n  class: DefaultRunLauncher\n")
    lacking = "\n".join(project_setup(root))
    assert f"{root / 'dagster.yaml'} is left as it is; it lacks" in lacking
    for setting in SETTINGS:
        assert f"  - {setting.name}: {setting.value!r}: {setting.buys}" in lacking
    assert "DefaultRunLauncher" in (root / "dagster.yaml").read_text()

    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text(INSTANCE_YAML)
    monkeypatch.setenv("DAGSTER_HOME", str(home))  # dg dev then reads $DAGSTER_HOME's file, not the project's
    assert f"{home / 'dagster.yaml'} has the stream runs' instance settings." in "\n".join(project_setup(root))


def test_a_sink_in_yaml_is_the_assets_declared_sink(
    sandbox: DefsFolderSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sink:`` takes any sink by its kind, with templates rendered; a refused setting names its YAML line."""
    monkeypatch.setenv("CLICKS_TABLE", "/data/clicks")
    delta = "sink:\n  kind: delta\n  table: '{{ env.CLICKS_TABLE }}'\n  partition_by: [day]\n"
    component, defs = load(sandbox, write_component(sandbox, "clicks", KAFKA + delta))
    assert component.sink == DeltaSink(table="/data/clicks", partition_by=["day"]), component.sink
    asset = defs.get_assets_def("process")
    assert sink_replaces_by_coordinates(asset)
    kafka = "sink:\n  kind: kafka\n  topic: views\n  producer_properties:\n    acks: 1\n    sasl.password: hunter2\n"
    error = load_error(sandbox, write_component(sandbox, "views", KAFKA + kafka))
    assert re.search(r"defs.yaml:\d+ - attributes\.sink: .*breaks exactly once|holds a secret", error), error
    assert "hunter2" not in error
    unknown = "sink:\n  kind: iceberg\n  table: t\n"
    error = load_error(sandbox, write_component(sandbox, "other", KAFKA + unknown))
    assert "'iceberg' found using 'kind' does not match any of the expected tags: 'delta', 'kafka'" in error


def test_the_outputs_docs_yaml_loads(sandbox: DefsFolderSandbox) -> None:
    """docs/outputs.md's ``sink:`` example, as written there, with its function beside it."""
    doc = (ROOT / "docs" / "outputs.md").read_text()
    found = re.search(r"```yaml\n(attributes:\n.*?)```", doc, re.S)
    assert found is not None
    folder = sandbox.defs_folder_path / "clicks"
    folder.mkdir()
    (folder / "defs.yaml").write_text(f"type: {KAFKA_TYPE}\n\n{found.group(1)}")
    (folder / "stream.py").write_text("def clicks(context, df):\n    return df\n")
    component, defs = load(sandbox, folder)
    assert isinstance(component.sink, DeltaSink) and component.sink.partition_by == ["day"]
    assert component.sink.configuration == {"delta.enableChangeDataFeed": "true"}
    assert sink_replaces_by_coordinates(defs.get_assets_def("clicks"))


def test_the_outputs_docs_python_declares_its_sinks() -> None:
    """docs/outputs.md's Python, as written there: the one call, and the sinks declared on stream assets."""
    doc = (ROOT / "docs" / "outputs.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(blocks) == 2
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, "docs/outputs.md", "exec"), namespace)
    clicks, enriched = namespace["clicks"], namespace["enriched"]
    assert isinstance(clicks, dg.AssetsDefinition) and isinstance(enriched, dg.AssetsDefinition)
    assert sink_replaces_by_coordinates(clicks) and not sink_replaces_by_coordinates(enriched)
