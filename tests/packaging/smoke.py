"""The smoke test run inside a fresh virtualenv that holds the wheel and its runtime dependencies only.

``python smoke.py --bootstrap HOST:PORT --target file:/x/definitions.py --target module:proj.definitions``

For each target (a definitions file, or a module whose ``defs`` is a ``Definitions`` or a ``@dg.definitions``
function) it finds the stream asset and its member sensors, writes a sample of click events to the group's
topic on the given broker, ticks one member sensor the way Dagster's daemon does until it requests a run,
materializes each requested run in-process with Spark (``local[1]``), ticks again, and checks that every record
was read once, committed as the group's Kafka offsets, and that nothing is left to launch. It also loads the
instance of ``$DAGSTER_HOME`` (its run coordinator, launcher and compute-log manager: the example's
``dagster.yaml``), and reports whether the patches of Dagster's internals are on. The last line is one JSON
object the caller checks.

It imports only the installed packages (this file is copied out of the checkout before it runs), so it shows
what a user's environment sees, not the checkout.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

import dagster_streamgroup
from dagster_streamgroup import patches
from dagster_streamgroup.dagster import tags as sgt
from dagster_streamgroup.dagster.resources import KafkaStreamGroup
from dagster_streamgroup.dagster.sensors import stream_target

PARTITIONS = 2
EVENTS = 300
TICK_TIMEOUT_S = 90.0
PAGES = ("/", "/search", "/product", "/cart")


def load(target: str) -> dg.Definitions:
    kind, _, spec = target.partition(":")
    if kind == "file":
        path = Path(spec).resolve()
        sys.path.insert(0, str(path.parent))
        module = importlib.import_module(path.stem)
    elif kind == "module":
        module = importlib.import_module(spec)
    else:
        raise SystemExit(f"--target: file:PATH or module:NAME, got {target!r}")
    defs = module.defs
    loaded = defs if isinstance(defs, dg.Definitions) else defs()
    assert isinstance(loaded, dg.Definitions), type(loaded)
    return loaded


def stream_parts(defs: dg.Definitions) -> tuple[dg.AssetsDefinition, dg.SensorDefinition, str]:
    """The stream asset, its first member sensor, and the key of its group resource."""
    assets = [
        a for a in defs.assets or [] if isinstance(a, dg.AssetsDefinition) and sgt.TAG_GROUP in a.metadata_by_key[a.key]
    ]
    assert len(assets) == 1, f"one stream asset expected, found {[a.key for a in assets]}"
    target = stream_target(assets[0])
    sensors = [s for s in defs.sensors or [] if isinstance(s, dg.SensorDefinition) and s.tags.get(sgt.TAG_GROUP)]
    assert sensors, "no member sensor"
    return assets[0], sorted(sensors, key=lambda s: s.name)[0], target.resource_key


def produce(bootstrap: str, topic: str, count: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=PARTITIONS, replication_factor=1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap})
    rng = random.Random(7)
    now_ms = int(time.time() * 1000)
    for i in range(count):
        user = f"u{rng.randrange(50)}"
        body = {"user": user, "page": rng.choice(PAGES), "ts": now_ms + i, "referrer": "direct"}
        producer.produce(topic, json.dumps(body).encode(), user.encode())
    assert producer.flush(30) == 0, "not every event was delivered"


def committed(bootstrap: str, group: str, topic: str) -> int:
    """The sum of the group's committed Kafka offsets over the topic's partitions (the group mirrors its commits)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    finally:
        consumer.close()
    return sum(max(tp.offset, 0) for tp in offsets)


def tick(
    sensor: dg.SensorDefinition, instance: dg.DagsterInstance, defs: dg.Definitions, key: str, cursor: str | None
) -> tuple[list[dg.RunRequest], str | None]:
    context = dg.build_sensor_context(
        instance=instance,
        sensor_name=sensor.name,
        cursor=cursor,
        resources={key: (defs.resources or {})[key]},
        definitions=defs,
    )
    result = sensor(context)
    assert isinstance(result, dg.SensorResult), result
    return list(result.run_requests or []), result.cursor if result.cursor is not None else cursor


def smoke(target: str, bootstrap: str, instance: dg.DagsterInstance) -> dict[str, Any]:
    started = time.monotonic()
    defs = load(target)
    asset, sensor, key = stream_parts(defs)
    group = (defs.resources or {})[key]
    assert isinstance(group, KafkaStreamGroup), type(group)
    topic = group.topics[0]
    produce(bootstrap, topic, EVENTS)
    cursor: str | None = None
    requests: list[dg.RunRequest] = []
    deadline = time.monotonic() + TICK_TIMEOUT_S
    while not requests:
        assert time.monotonic() < deadline, f"{sensor.name} requested no run within {TICK_TIMEOUT_S:.0f} s"
        requests, cursor = tick(sensor, instance, defs, key, cursor)
        if not requests:
            time.sleep(1.0)
    records = 0
    for request in requests:
        tags = {**(request.tags or {}), "dagster/run_key": request.run_key or ""}
        result = dg.materialize(
            [asset],
            instance=instance,
            run_config=request.run_config,
            tags=tags,
            resources=dict(defs.resources or {}),
            raise_on_error=False,
        )
        assert result.success, f"the run of {request.run_key} failed"
        for materialization in result.asset_materializations_for_node(result.job_def.nodes[0].name):
            records += int(materialization.metadata["records"].value)  # type: ignore[arg-type]
    left, cursor = tick(sensor, instance, defs, key, cursor)
    assert not left, f"after the commit a tick still requested {[r.run_key for r in left]}"
    in_kafka = committed(bootstrap, group.group, topic)
    assert records == EVENTS == in_kafka, f"read {records}, committed {in_kafka} in Kafka, of {EVENTS} events"
    return {"target": target, "runs": len(requests), "records": records, "seconds": round(time.monotonic() - started)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--target", action="append", required=True)
    args = parser.parse_args()
    instance = dg.DagsterInstance.get()
    parts = {
        "run_coordinator": type(instance.run_coordinator).__name__,
        "run_launcher": type(instance.run_launcher).__name__,
        "compute_log_manager": type(instance.compute_log_manager).__name__,
    }
    results = [smoke(target, args.bootstrap, instance) for target in args.target]
    schema_check_scripts = None
    if patches.enabled():  # the private module may be gone on another release: only looked at on a verified one
        from dagster._core.storage import sql

        installed: type = sql.ScriptDirectory  # type: ignore[attr-defined]
        schema_check_scripts = installed.__name__  # ParsedScripts once the member sensors installed it
    report = {
        "package": dagster_streamgroup.__file__,
        "dagster": patches.dagster_version(),
        "patches_enabled": patches.enabled(),
        "schema_check_scripts": schema_check_scripts,
        "instance": parts,
        "results": results,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
