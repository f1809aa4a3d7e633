"""Dagster's own freshness on a component's stream asset: the group materializes through the component (its
member sensor's tick, a run of its asset on the local broker with local Spark), every member sensor is stopped
over GraphQL, and Dagster's freshness daemon marks the asset WARN, then FAIL, as GraphQL reports.

The daemon runs in this process, one iteration at a time, with Dagster's clock moved past each window
(``freeze_time``): the windows are a minute at the least (Dagster's floor), and waiting them out would make the
test minutes long. The definitions are loaded in process from a project laid out as ``dg`` expects, as a code
server loads them."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster._core.definitions.freshness import FreshnessState
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import freeze_time
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.freshness import FreshnessDaemon
from dagster_graphql.test.utils import execute_dagster_graphql

from dagster_streamgroup.dagster import freshness_windows
from dagster_streamgroup.local.kafka_data import produce_sample
from tests.dagster.helpers import group_name, materialize_request
from tests.dagster.test_component_dg import DgProject, new_project
from tests.fixtures.kafka import TopicFactory

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

LOCATION = "clicks_location"
ASSET = "clicks"

STREAM_PY = '''
import dagster as dg


def process(context: dg.AssetExecutionContext, df) -> dict[str, object]:
    """Clicks per range."""
    return {"rows": dg.MetadataValue.int(df.count())}
'''

SENSORS = """query($s: RepositorySelector!) { sensorsOrError(repositorySelector: $s) {
  ... on Sensors { results { name jobOriginId sensorState { selectorId status } } } } }"""
STOP = """mutation($o: String!, $s: String!) { stopSensor(jobOriginId: $o, jobSelectorId: $s) {
  __typename ... on StopSensorMutationResult { instigationState { status } } } }"""
FRESHNESS = """query($k: AssetKeyInput!) { assetNodeOrError(assetKey: $k) { ... on AssetNode {
  internalFreshnessPolicy { ... on TimeWindowFreshnessPolicy { failWindowSeconds warnWindowSeconds } }
  freshnessStatusInfo { freshnessStatus freshnessStatusMetadata { lastMaterializedTimestamp } } } } }"""


def write_group(project: DgProject, bootstrap: str, topic: str, group: str, state_db: Path) -> None:
    folder = project.defs / ASSET
    folder.mkdir()
    (folder / "stream.py").write_text(STREAM_PY)
    (folder / "defs.yaml").write_text(
        textwrap.dedent(
            f"""\
            type: dagster_streamgroup.KafkaStreamGroupComponent

            attributes:
              function: .stream:process
              asset:
                name: {ASSET}
              members: 2
              default_status: RUNNING
              freshness: true
              freshness_margin_s: 0
              group: {group}
              bootstrap_servers: {bootstrap}
              topics: [{topic}]
              store_url: sqlite:///{state_db}
              heartbeat_interval_s: 5
              session_timeout_s: 30
              join_grace_s: 0
              min_backlog: 1
              max_wait_s: 1
              spark:
                master: local[1]
            """
        )
    )


@pytest.fixture
def project_on_path(tmp_path: Path) -> Iterator[DgProject]:
    """The project importable as its code server has it (its ``src`` first on the path), then forgotten."""
    project = new_project(tmp_path / "project")
    sys.path.insert(0, str(project.src))
    try:
        yield project
    finally:
        sys.path.remove(str(project.src))
        for name in [n for n in sys.modules if n == project.name or n.startswith(project.name + ".")]:
            del sys.modules[name]


def graphql(context: WorkspaceProcessContext, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    result = execute_dagster_graphql(context.create_request_context(), query, variables)
    assert not result.errors, result.errors
    assert isinstance(result.data, dict)
    return result.data


def freshness(context: WorkspaceProcessContext) -> dict[str, Any]:
    """One pass of Dagster's freshness daemon, then the asset's freshness as the UI reads it."""
    list(FreshnessDaemon().run_iteration(context))
    node = graphql(context, FRESHNESS, {"k": {"path": [ASSET]}})["assetNodeOrError"]
    assert isinstance(node, dict)
    return node


def test_a_stopped_group_goes_warn_then_fail_in_dagsters_freshness(
    kafka_bootstrap: str, kafka_topics: TopicFactory, project_on_path: DgProject, tmp_path: Path
) -> None:
    project = project_on_path
    topic = kafka_topics(partitions=2)
    produce_sample(kafka_bootstrap, topic, 2, 100)
    group = group_name()
    write_group(project, kafka_bootstrap, topic, group, tmp_path / "state.db")
    defs = importlib.import_module(f"{project.name}.definitions").defs()
    assert isinstance(defs, dg.Definitions)
    asset = defs.get_assets_def(ASSET)
    resources = dict(defs.resources or {})
    warn, fail = freshness_windows(max_wait_s=1, heartbeat_interval_s=5, margin_s=0)

    with dg.instance_for_test() as instance:
        # The group materializes: a member's tick claims both shards and requests their ranges; the run commits.
        sensor = next(s for s in defs.sensors or [] if s.name == f"{group}_member_0")
        assert isinstance(sensor, dg.SensorDefinition)
        # The group resource as a code server's tick finds it: in the code location.
        tick = sensor(dg.build_sensor_context(instance=instance, sensor_name=sensor.name, definitions=defs))
        assert isinstance(tick, dg.SensorResult)
        [request] = tick.run_requests or []
        assert materialize_request(asset, instance, request, resources).success
        latest = instance.get_latest_materialization_event(asset.key)
        assert latest is not None
        materialized_at = latest.timestamp

        origin = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(module_name=f"{project.name}.definitions", working_directory=str(project.src)),
            location_name=LOCATION,
        )
        with WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin)) as context:
            node = freshness(context)
            assert node["internalFreshnessPolicy"] == {
                "failWindowSeconds": int(fail.total_seconds()),
                "warnWindowSeconds": int(warn.total_seconds()),
            }
            assert node["freshnessStatusInfo"]["freshnessStatus"] == "HEALTHY"

            # Every member sensor stopped, as an operator does it in the UI.
            selector = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}
            sensors = graphql(context, SENSORS, {"s": selector})["sensorsOrError"]["results"]
            assert sorted(s["name"] for s in sensors) == [f"{group}_member_0", f"{group}_member_1"]
            assert {s["sensorState"]["status"] for s in sensors} == {"RUNNING"}
            for s in sensors:
                stopped = graphql(context, STOP, {"o": s["jobOriginId"], "s": s["sensorState"]["selectorId"]})
                assert stopped["stopSensor"]["instigationState"]["status"] == "STOPPED", stopped
            sensors = graphql(context, SENSORS, {"s": selector})["sensorsOrError"]["results"]
            assert {s["sensorState"]["status"] for s in sensors} == {"STOPPED"}

            states = []
            for after, expected in ((warn, "WARNING"), (fail, "DEGRADED")):
                with freeze_time(materialized_at + after.total_seconds() + 1):
                    node = freshness(context)
                info = node["freshnessStatusInfo"]
                assert info["freshnessStatus"] == expected, info
                assert info["freshnessStatusMetadata"]["lastMaterializedTimestamp"] == pytest.approx(materialized_at)
                record = instance.get_freshness_state_records([asset.key])[asset.key]
                states.append(record.freshness_state)
            assert states == [FreshnessState.WARN, FreshnessState.FAIL]
