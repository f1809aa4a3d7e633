"""The components through the real ``dg`` CLI (dagster-dg-cli, pinned in the dev group) in a temporary project:
listed through the ``dagster_dg_cli.registry_modules`` entry point, scaffolded into a working ``defs.yaml`` and
function stub, validated by ``dg check`` with errors that name the YAML field, listed by ``dg list defs``, and
served by a real ``dagster dev``.

The project is what ``create-dagster project`` lays out (pyproject.toml with ``[tool.dg]``, ``src/<name>/defs``,
a ``definitions.py`` that loads the defs folder), with this checkout's virtualenv standing in for the project's
own: its ``src`` is on ``PYTHONPATH`` as an editable install would put it."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev

DG = str(ROOT / ".venv/bin/dg")
KAFKA_TYPE = "dagster_streamgroup.KafkaStreamGroupComponent"
V3IO_TYPE = "dagster_streamgroup.V3ioStreamGroupComponent"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class DgProject:
    root: Path
    name: str

    @property
    def src(self) -> Path:
        return self.root / "src"

    @property
    def defs(self) -> Path:
        return self.src / self.name / "defs"

    @property
    def home(self) -> Path:
        return self.root / "dagster_home"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DAGSTER_", "VIRTUAL_ENV"))}
        return {**env, "DAGSTER_HOME": str(self.home), "PYTHONPATH": str(self.src), "NO_COLOR": "1", "COLUMNS": "200"}

    def dg(self, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [DG, *args], cwd=self.root, env=self.env(), capture_output=True, text=True, timeout=timeout_s, check=False
        )

    def ok(self, *args: str) -> str:
        done = self.dg(*args)
        assert done.returncode == 0, f"dg {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout


def new_project(root: Path, name: str = "clicks_project") -> DgProject:
    """A Dagster project as ``create-dagster project`` lays it out, without its virtualenv."""
    project = DgProject(root, name)
    (project.defs).mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""\
            [project]
            name = "{name.replace("_", "-")}"
            version = "0.1.0"
            requires-python = ">=3.11,<3.12"
            dependencies = ["dagster-streamgroup"]

            [build-system]
            requires = ["hatchling"]
            build-backend = "hatchling.build"

            [tool.dg]
            directory_type = "project"

            [tool.dg.project]
            root_module = "{name}"
            registry_modules = ["{name}.components.*"]

            [tool.dg.cli.telemetry]
            enabled = false
            """
        )
    )
    (project.src / name / "__init__.py").write_text("")
    (project.defs / "__init__.py").write_text("")
    (project.src / name / "definitions.py").write_text(
        textwrap.dedent(
            """\
            from pathlib import Path

            import dagster as dg


            @dg.definitions
            def defs() -> dg.Definitions:
                return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)
            """
        )
    )
    project.home.mkdir()
    (project.home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return project


@pytest.fixture
def project(tmp_path: Path) -> DgProject:
    return new_project(tmp_path / "project")


def test_dg_lists_both_components(project: DgProject) -> None:
    listed = json.loads(project.ok("list", "components", "--json"))
    items = listed["items"] if isinstance(listed, dict) else listed
    keys = {item["key"] for item in items}
    assert {KAFKA_TYPE, V3IO_TYPE} <= keys, keys
    summary = next(item["summary"] for item in items if item["key"] == KAFKA_TYPE)
    assert "Kafka topic set" in summary


def test_dg_scaffolds_a_kafka_group_that_checks_and_loads(project: DgProject) -> None:
    scaffolded = project.ok("scaffold", "defs", KAFKA_TYPE, "clicks")
    # DAGSTER_HOME is set here: dg dev reads its dagster.yaml, which is named with what it lacks, and left alone.
    assert f"{project.home / 'dagster.yaml'} is left as it is; it lacks" in scaffolded, scaffolded
    assert "run_launcher.class: 'ForkServerRunLauncher'" in scaffolded
    assert (project.home / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"
    folder = project.defs / "clicks"
    defs_yaml = (folder / "defs.yaml").read_text()
    assert defs_yaml.startswith(f"type: {KAFKA_TYPE}\n")
    for line in ("function: .stream:process", "group: clicks", "topics: [clicks]", "heartbeat_interval_s: 5"):
        assert f"  {line}\n" in defs_yaml, line
    assert "def process(context: dg.AssetExecutionContext, df: DataFrame)" in (folder / "stream.py").read_text()

    done = project.dg("check", "defs")
    checked = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert "All component YAML validated successfully." in checked
    assert "All definitions loaded successfully." in checked
    # dagster-spark's preview component comes with our dependencies; its warning is not the user's concern.
    assert "SparkDeclarativePipelineScaffolder" not in done.stdout + done.stderr

    listed = json.loads(project.ok("list", "defs", "--json"))
    assert [a["asset_key"] for a in listed["assets"]] == ["clicks", "clicks_backfill"]
    assert listed["assets"][0]["kinds"] == ["spark"]
    assert sorted(c["name"] for c in listed["asset_checks"]) == ["lag_below_limit", "no_parked_ranges"]
    assert sorted(s["name"] for s in listed["sensors"]) == [f"clicks_member_{i}" for i in range(3)]
    assert {r["name"]: r["type"].rsplit(".", 1)[1] for r in listed["resources"]} == {
        "streamgroup_clicks": "KafkaStreamGroup",
        "pyspark_clicks": "StreamSparkResource",
    }
    assert all(s["source"].endswith("defs/clicks/defs.yaml:1") for s in listed["sensors"])


def test_dg_scaffolds_a_v3io_group_from_params(project: DgProject) -> None:
    params = json.dumps({"group": "views", "container": "users", "stream_path": "streams/views"})
    project.ok("scaffold", "defs", V3IO_TYPE, "page_views", "--json-params", params)
    defs_yaml = (project.defs / "page_views" / "defs.yaml").read_text()
    for line in (
        "group: views",
        "container: users",
        "stream_path: streams/views",
        "access_key: {env: V3IO_ACCESS_KEY}",
    ):
        assert f"  {line}\n" in defs_yaml, line
    checked = project.ok("check", "defs")  # the key is read where it is used, not at load
    assert "All definitions loaded successfully." in checked


def test_dg_scaffold_checks_its_params_as_the_yaml_is(project: DgProject) -> None:
    """An unknown key (``topic`` for ``topics``) or a bad value is refused by ``dg scaffold`` itself, naming it,
    and nothing is written."""
    for params, message in (
        ({"topic": "clicks"}, "Extra inputs are not permitted"),
        ({"bootstrap_servers": "nohost"}, "bootstrap_servers: 'nohost' is not host:port"),
    ):
        done = project.dg("scaffold", "defs", KAFKA_TYPE, "clicks", "--json-params", json.dumps(params))
        output = done.stdout + done.stderr
        assert done.returncode != 0 and message in output, output
        assert not (project.defs / "clicks" / "defs.yaml").exists()
    project.ok("scaffold", "defs", KAFKA_TYPE, "clicks", "--json-params", json.dumps({"topics": ["a", "b"]}))
    assert "  topics: [a, b]\n" in (project.defs / "clicks" / "defs.yaml").read_text()


def test_dg_check_names_the_yaml_field(project: DgProject) -> None:
    project.ok("scaffold", "defs", KAFKA_TYPE, "clicks")
    defs_yaml = project.defs / "clicks" / "defs.yaml"
    good = defs_yaml.read_text()

    def line_of(text: str, needle: str) -> int:
        return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)

    # The schema (dg check yaml, before anything loads): an attribute the component does not have.
    defs_yaml.write_text(good.replace("  members: 3", "  membres: 3"))
    done = project.dg("check", "yaml")
    assert done.returncode == 1
    assert re.search(rf"defs.yaml:{line_of(good, 'members: 3')} - {KAFKA_TYPE} attributes\.membres", done.stdout), (
        done.stdout
    )

    # The group resource's own check, when the definitions load (dg check defs).
    bad = good.replace("bootstrap_servers: 127.0.0.1:9092", "bootstrap_servers: nohost")
    defs_yaml.write_text(bad)
    done = project.dg("check", "defs")
    output = done.stdout + done.stderr
    assert done.returncode == 1
    where = f"defs.yaml:{line_of(bad, 'bootstrap_servers')} - attributes.bootstrap_servers"
    assert f"{where}: 'nohost' is not host:port" in output, output

    # A literal secret: refused by name, and the value is nowhere in what dg prints.
    secret = secrets.token_urlsafe(24)
    bad = good.replace("  # sasl_password: {env: KAFKA_PASSWORD}", f"  sasl_password: {secret}")
    bad = bad.replace("  # security_protocol: SASL_SSL", "  security_protocol: SASL_SSL")
    bad = bad.replace("  # sasl_mechanism: SCRAM-SHA-512", "  sasl_mechanism: SCRAM-SHA-512")
    bad = bad.replace("  # sasl_username: svc", "  sasl_username: svc")
    defs_yaml.write_text(bad)
    done = project.dg("check", "defs", "--verbose")
    output = done.stdout + done.stderr
    assert done.returncode == 1
    where = f"defs.yaml:{line_of(bad, 'sasl_password')} - attributes.sasl_password"
    assert f"{where}: a secret is given as {{env: NAME}}" in output, output
    assert secret not in output

    defs_yaml.write_text(bad.replace(f"sasl_password: {secret}", "sasl_password: {env: KAFKA_PASSWORD}"))
    assert "All definitions loaded successfully." in project.ok("check", "defs")


def test_the_scaffolded_project_loads_in_dagster_dev(project: DgProject) -> None:
    """What ``dg check defs`` validated is what a real ``dagster dev`` serves: the asset, its checks, the member
    sensors and the resources, read back over the webserver's GraphQL."""
    project.ok("scaffold", "defs", KAFKA_TYPE, "clicks")
    workspace = project.root / "workspace.yaml"
    workspace.write_text(
        textwrap.dedent(
            f"""\
            load_from:
              - python_module:
                  module_name: {project.name}.definitions
                  working_directory: {project.src}
                  location_name: {project.name}
            """
        )
    )
    dev = DagsterDev(project.home, project.env(), project.root / "dagster-dev.log", workspace=workspace)
    with dev:
        dev.start()
        data = dev.graphql(
            """query($r: RepositorySelector!) {
                 repositoryOrError(repositorySelector: $r) { __typename ... on Repository {
                   assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name } } } }
                   sensors { name sensorState { status } }
                   allTopLevelResourceDetails { name configFields { name } } } } }""",
            {"r": {"repositoryLocationName": project.name, "repositoryName": "__repository__"}},
        )
    repository = data["repositoryOrError"]
    assert repository["__typename"] == "Repository", (repository, dev.log.read_text(errors="replace")[-4000:])
    assert [node["assetKey"]["path"] for node in repository["assetNodes"]] == [["clicks"], ["clicks_backfill"]]
    checks = repository["assetNodes"][0]["assetChecksOrError"]["checks"]
    assert sorted(c["name"] for c in checks) == ["lag_below_limit", "no_parked_ranges"]
    sensors = {s["name"]: s["sensorState"]["status"] for s in repository["sensors"]}
    assert sensors == {f"clicks_member_{i}": "STOPPED" for i in range(3)}  # the scaffold's default_status
    resources = {r["name"]: {f["name"] for f in r["configFields"]} for r in repository["allTopLevelResourceDetails"]}
    assert {"streamgroup_clicks", "pyspark_clicks"} <= set(resources), resources
    assert {"group", "bootstrap_servers", "topics", "sasl_password"} <= resources["streamgroup_clicks"]


def test_dg_check_validates_typed_records_naming_the_yaml_field(project: DgProject) -> None:
    """The typed-records attributes (value_format, the registry block, on_decode_error, the asset's value_schema)
    checked by ``dg check defs``: a bad one named with its line, a literal registry credential refused unechoed."""
    project.ok("scaffold", "defs", KAFKA_TYPE, "orders")
    defs_yaml = project.defs / "orders" / "defs.yaml"
    good = (
        defs_yaml.read_text()
        .replace(
            "  heartbeat_interval_s: 5\n",
            "  heartbeat_interval_s: 5\n  value_format: avro\n  schema_registry_url: http://127.0.0.1:8085/apis/ccompat/v7\n"
            "  on_decode_error: dead_letter\n",
        )
        .replace("    name: orders\n", "    name: orders\n    value_schema: latest\n")
    )
    defs_yaml.write_text(good)
    assert "All definitions loaded successfully." in project.ok("check", "defs")

    def line_of(text: str, needle: str) -> int:
        return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)

    for old, new, field, message in [
        ("  schema_registry_url: http://127.0.0.1:8085/apis/ccompat/v7\n", "", "value_format",
         "'avro' needs schema_registry_url"),
        ("on_decode_error: dead_letter", "on_decode_error: skip", "on_decode_error", ""),
    ]:  # fmt: skip
        bad = good.replace(old, new)
        defs_yaml.write_text(bad)
        done = project.dg("check", "defs")
        output = done.stdout + done.stderr
        assert done.returncode == 1
        assert f"defs.yaml:{line_of(bad, field)} - attributes.{field}: {message}" in output, output

    secret = secrets.token_urlsafe(24)
    bad = good.replace("  on_decode_error", f"  schema_registry_basic_auth_user_info: svc:{secret}\n  on_decode_error")
    defs_yaml.write_text(bad)
    done = project.dg("check", "defs", "--verbose")
    output = done.stdout + done.stderr
    assert done.returncode == 1
    where = f"defs.yaml:{line_of(bad, 'basic_auth_user_info')} - attributes.schema_registry_basic_auth_user_info"
    assert f"{where}: a secret is given as {{env: NAME}}" in output, output
    assert secret not in output
