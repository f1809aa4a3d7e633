"""What a deployment shows and stores, gathered for the secrets search: over GraphQL (what the UI shows), from
the instance's own storages (what Dagster keeps), and from the group state's database."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sqlite3
import urllib.error
import urllib.request
import zlib
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg
import zstandard
from dagster._core.instance.ref import InstanceRef
from dagster._serdes import serialize_value
from psycopg import sql

from dagster_streamgroup.dagster.devserver import DagsterDev
from dagster_streamgroup.dagster.resources import StreamGroupResource
from dagster_streamgroup.protocol.codec import encode_state
from dagster_streamgroup.protocol.state import GroupState
from tests.secrets.leaks import Evidence

ERROR = """fragment E on PythonError { message className stack
  causes { message className stack } errorChain { isExplicitLink error { message className stack } } }"""
METADATA = """fragment M on MetadataEntry { __typename label description
  ... on TextMetadataEntry { text } ... on JsonMetadataEntry { jsonString } ... on PathMetadataEntry { path }
  ... on NotebookMetadataEntry { path } ... on UrlMetadataEntry { url } ... on MarkdownMetadataEntry { mdStr }
  ... on IntMetadataEntry { intRepr } ... on FloatMetadataEntry { floatRepr } ... on BoolMetadataEntry { boolValue }
  ... on PythonArtifactMetadataEntry { module name } ... on PoolMetadataEntry { pool } }"""
RUNS = """{ runsOrError(limit: 100000) { __typename ... on Runs { results { runId jobName status runConfigYaml
  tags { key value } } } } }"""
RUN_LOGS = f"""query($id: ID!, $cursor: String) {{ logsForRun(runId: $id, afterCursor: $cursor) {{ __typename
  ... on EventConnection {{ cursor hasMore events {{ __typename
    ... on MessageEvent {{ message level eventType }}
    ... on ErrorEvent {{ error {{ ...E }} }}
    ... on DisplayableEvent {{ label description metadataEntries {{ ...M }} }}
  }} }}
  ... on PythonError {{ ...E }} }} }}
{ERROR}
{METADATA}"""
SENSORS = f"""query($r: RepositorySelector!) {{ sensorsOrError(repositorySelector: $r) {{ __typename
  ... on Sensors {{ results {{ name sensorState {{ status ticks(limit: 1000) {{ status skipReason runIds runKeys
    cursor error {{ ...E }} logEvents {{ events {{ message level }} }} }} }} }} }}
  ... on PythonError {{ ...E }} }} }}
{ERROR}"""
WORKSPACE = f"""{{ workspaceOrError {{ __typename ... on Workspace {{ locationEntries {{ name loadStatus
  locationOrLoadError {{ __typename ... on RepositoryLocation {{ name repositories {{ name }} }}
    ... on PythonError {{ ...E }} }} }} }} ... on PythonError {{ ...E }} }} }}
{ERROR}"""
RESOURCES = """query($r: RepositorySelector!) { allTopLevelResourceDetailsOrError(repositorySelector: $r) { __typename
  ... on ResourceDetailsList { results { name description resourceType configuredValues { key value type }
  configFields { name description defaultValueAsJson } } } } }"""
ASSET_EVENTS = f"""query($k: AssetKeyInput!) {{ assetOrError(assetKey: $k) {{ __typename ... on Asset {{
  assetMaterializations(limit: 10000) {{ partition runId label description metadataEntries {{ ...M }} }}
  assetObservations(limit: 10000) {{ partition runId label description metadataEntries {{ ...M }} }} }} }} }}
{METADATA}"""


def _query(dev: DagsterDev, evidence: Evidence, query: str, variables: dict[str, Any] | None = None) -> Any:
    """A GraphQL answer; a server error's body is kept as evidence too (it is what a client would be shown)."""
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    request = urllib.request.Request(f"{dev.url}/graphql", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            payload = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        text = exc.read().decode("utf-8", "replace")
        evidence.add("graphql: an error answer", text)
        raise RuntimeError(f"GraphQL answered {exc.code}: {text[:3000]}") from None
    if payload.get("errors"):
        evidence.add("graphql: an error answer", json.dumps(payload))
        raise RuntimeError(f"GraphQL errors: {payload['errors']}")
    return payload["data"]


def graphql_evidence(dev: DagsterDev, evidence: Evidence, assets: list[str]) -> dict[str, Any]:
    """Runs (tags, config), every event of every run (messages, errors, metadata), each code location's load
    error, the sensor ticks (errors, skip reasons, logs) and resources' configured values of every location
    that loaded, and the assets' materializations and observations, as the webserver serves them; the counts
    of what was read, and the locations that did not load."""
    runs = _query(dev, evidence, RUNS)["runsOrError"]["results"]
    evidence.add("graphql: runs (tags, run config)", json.dumps(runs))
    events = 0
    for run in runs:
        cursor = None
        while True:
            page = _query(dev, evidence, RUN_LOGS, {"id": run["runId"], "cursor": cursor})["logsForRun"]
            evidence.add(f"graphql: events of run {run['runId']}", json.dumps(page))
            if page["__typename"] != "EventConnection":
                break
            events += len(page["events"])
            if not page["hasMore"]:
                break
            cursor = page["cursor"]
    workspace = _query(dev, evidence, WORKSPACE)["workspaceOrError"]
    evidence.add("graphql: code locations (the UI's deployment page, load errors)", json.dumps(workspace))
    entries = workspace.get("locationEntries", [])
    loaded = [e["name"] for e in entries if (e["locationOrLoadError"] or {}).get("__typename") == "RepositoryLocation"]
    ticks, resources_read = 0, 0
    for location in loaded:
        selector = {"repositoryLocationName": location, "repositoryName": "__repository__"}
        sensors = _query(dev, evidence, SENSORS, {"r": selector})["sensorsOrError"]
        evidence.add(f"graphql: sensor ticks of {location}", json.dumps(sensors))
        ticks += sum(len(s["sensorState"]["ticks"]) for s in sensors.get("results", []))
        resources = _query(dev, evidence, RESOURCES, {"r": selector})["allTopLevelResourceDetailsOrError"]
        evidence.add(f"graphql: resources of {location} (the UI's Resources page)", json.dumps(resources))
        resources_read += len(resources.get("results", []))
    asset_events = 0
    for asset in assets:
        found = _query(dev, evidence, ASSET_EVENTS, {"k": {"path": [asset]}})["assetOrError"]
        evidence.add(f"graphql: asset {asset}", json.dumps(found))
        asset_events += len(found.get("assetMaterializations", [])) + len(found.get("assetObservations", []))
    return {
        "runs": len(runs),
        "run_events": events,
        "sensor_ticks": ticks,
        "resources": resources_read,
        "asset_events": asset_events,
        "locations": len(entries),
        "locations not loaded": sorted(e["name"] for e in entries if e["name"] not in loaded),
    }


def instance_evidence(home: Path, evidence: Evidence) -> dict[str, int]:
    """The instance's storages read through Dagster itself: each run (tags, config, status) and every event
    log entry of every run, serialized as Dagster stores them."""
    counts = {"runs": 0, "event_log_entries": 0}
    with dg.DagsterInstance.from_ref(InstanceRef.from_dir(str(home))) as instance:
        for record in instance.get_run_records():
            counts["runs"] += 1
            evidence.add("event log storage: runs", serialize_value(record.dagster_run))
            entries = instance.all_logs(record.dagster_run.run_id)
            counts["event_log_entries"] += len(entries)
            evidence.add(f"event log storage: run {record.dagster_run.run_id}", serialize_value(entries))
    return counts


def database_evidence(admin_url: str, database: str, evidence: Evidence) -> dict[str, int]:
    """Every row of every table in ``database`` (the group state's), as text."""
    from sqlalchemy.engine import make_url

    url = make_url(admin_url)
    conninfo = psycopg.conninfo.make_conninfo(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=database, connect_timeout=10
    )
    rows = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            ).fetchall()
        ]
        for table in tables:
            found: list[Any] = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table))).fetchall()
            rows += len(found)
            evidence.add(f"group state database: table {table}", repr(found))
    return {"tables": len(tables), "rows": rows}


def group_state(resource: StreamGroupResource) -> GroupState:
    """The group's state as its store decodes it; a group without one is a failed test."""
    state, _ = resource.store().load(resource.state_key())
    assert state is not None, f"group {resource.group}: no state"
    return state


def state_evidence(resource: StreamGroupResource, evidence: Evidence) -> int:
    """The group state as its store decodes it (the v3io store keeps large states and log items compressed):
    members, shards, events, parked ranges and dead letters with their failure reasons. Its size in bytes."""
    text = encode_state(group_state(resource))
    evidence.add(f"group state of {resource.group}", text)
    return len(text)


SQLITE_HEADER = b"SQLite format 3\x00"


def sqlite_evidence(root: Path, evidence: Evidence) -> dict[str, Any]:
    """Every row of every SQLite database under ``root``, with compressed values decompressed: Dagster keeps
    job and execution-plan snapshots (resource configuration included) zlib-compressed in ``runs.db``, where a
    byte search of the file cannot see them. The counts, rows by table name among them."""
    counts: dict[str, Any] = {"databases": 0, "rows": 0, "decompressed": 0, "tables": {}}
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = Path(directory) / name
            with path.open("rb") as head:
                if head.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                    continue
            counts["databases"] += 1
            with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
                tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
                for table in tables:
                    escaped = table.replace('"', '""')
                    for row in db.execute(f'SELECT * FROM "{escaped}"'):
                        counts["rows"] += 1
                        counts["tables"][table] = counts["tables"].get(table, 0) + 1
                        for value in row:
                            if isinstance(value, bytes):
                                with contextlib.suppress(zlib.error):
                                    evidence.add(f"{path}: table {table} (decompressed)", zlib.decompress(value))
                                    counts["decompressed"] += 1
    return counts


def spark_ui_evidence(ui: str, evidence: Evidence, *, connect: bool = True) -> dict[str, int]:
    """What a Spark application's UI shows (``ui``: ``http://host:port``): a Connect server's Connect tab (each
    statement's plan text, options included) and the pages it links (``connect``), the SQL and job pages, and the
    REST API's applications, jobs, stages (their descriptions are the statements), SQL executions with plans and
    the environment."""

    def get(path: str) -> str:
        url = path if path.startswith("http") else f"{ui}{path}"
        with urllib.request.urlopen(url.replace("&amp;", "&"), timeout=60) as response:
            text: str = response.read().decode("utf-8", "replace")
        evidence.add(f"spark ui: {path[:120]}", text)
        return text

    apps = json.loads(get("/api/v1/applications"))
    pages = 0
    for app in apps:
        base = f"/api/v1/applications/{app['id']}"
        for path in (f"{base}/jobs", f"{base}/stages?details=true", f"{base}/sql?details=true&planDescription=true",
                     f"{base}/environment"):  # fmt: skip
            get(path)
            pages += 1
    if connect:
        tab = get("/connect/")
        for link in sorted(set(re.findall(r'href="(/connect/[^"#]*)', tab)))[:50]:
            get(link)
            pages += 1
        pages += 1
    for path in ("/jobs/", "/SQL/", "/stages/"):
        get(path)
        pages += 1
    return {"applications": len(apps), "pages": pages + 1}


def event_log_evidence(directory: Path, evidence: Evidence) -> int:
    """Spark's event logs under ``directory``, decompressed (Spark 4 writes them zstd-compressed): every event
    the server recorded, the statements' plans among them (one zstd frame per flush, all read)."""
    count = 0
    for path in sorted(directory.rglob("events_*")):
        data = path.read_bytes()
        if path.suffix == ".zstd":
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True) as frames:
                data = frames.read()
        evidence.add(f"spark event log: {path.name}", data)
        count += 1
    return count
