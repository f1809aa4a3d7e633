"""A newcomer's first minutes: a ``dg`` project made as docs/dagster.md says, against the example, in one run.

``python -m bench.newcomer [--records 5000] [--partitions 4] [--sides example,dg] [--timeout 900] [--keep]``

One local broker; for each side a topic of its own holding ``--records`` clickstream events (the example's
producer) before the side starts, so a backlog waits. Sides, one after another (never side by side: they would
share the two cores):

- ``example``: the example project (``definitions.py``, ``jobs/``, ``sensors/``) under ``dagster dev`` with its
  ``dagster.yaml`` in a fresh ``DAGSTER_HOME``, at its defaults (3 members, local Spark ``local[2]``) but for the
  stream's topic and group and a temporary output folder;
- ``dg``: a fresh virtualenv with this checkout and its ``[local]`` extra (which brings ``dg``), a project from
  ``create-dagster project``, the group added by ``dg scaffold defs dagster_streamgroup.KafkaStreamGroupComponent``
  (which writes the project's ``dagster.yaml``: the run economy), ``default_status: RUNNING`` set as the docs say,
  ``dg check defs``, then ``dg dev`` with ``DAGSTER_HOME`` unset (3 members, ``local[*]``);
- ``dg-default``: the same project with the scaffolded ``dagster.yaml`` deleted: Dagster's own instance defaults,
  what a ``dg`` project got before the scaffold wrote it.

Per side, from the command's start (``dagster dev`` / ``dg dev``): ``first_materialization_s`` (the first
materialization's timestamp) and ``drained_s`` (every record materialized and every run ended), and each first-wave
run's start (created -> RUN_START, ``first_wave_run_start_*``: these runs also start the launcher's server). Then a
second backlog of ``--records`` is produced and drained the same way: ``run_start_p50_s`` / ``_max_s`` are its runs'
starts (the launch a deployment pays from then on: a new process, or a fork or a reused worker), and
``second_wave_drained_s`` its drain. The example runs with ``CLICKSTREAM_CARRY_ON_S=0`` (a run per wave, the
component's default) so both sides start runs for the second wave. Then each ``dg`` side's figures over the
example's (``ratio_*``: the issue's target is first materialization and run start each within 1.5x), printed,
never asserted; the last line is one JSON object with everything.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev, WebserverClient, wait_for
from dagster_streamgroup.local.dg_project import KAFKA_COMPONENT, DgDev, create_project, set_attributes
from dagster_streamgroup.local.kafka_broker import running_broker
from dagster_streamgroup.local.kafka_data import create_topics
from jobs.clickstream_events import produce_burst, producers

UV = ROOT / ".tools" / "uv" / "bin" / "uv"
SIDES = ("example", "dg", "dg-default")
EXAMPLE_ASSET = "page_views_per_minute"
DG_ASSET = "clicks"
TARGET_RATIO = 1.5
ENDED = ("SUCCESS", "FAILURE", "CANCELED")


def produce(bootstrap: str, topic: str, partitions: int, records: int, *, create: bool = True) -> int:
    """The example's clickstream events, keyed by user; returns how many records were added."""
    if create:
        create_topics(bootstrap, {topic: partitions})
    bulk, trailer = producers({"bootstrap.servers": bootstrap})
    produce_burst(bulk, trailer, topic, partitions, records, random.Random(7))
    return records + partitions  # produce_burst ends each partition with one single-record batch


def measure(
    client: WebserverClient, asset: str, started_at: float, total: int, timeout_s: float, again: Callable[[], int]
) -> dict[str, Any]:
    """Wait until ``total`` records are materialized and every run ended (the first wave: each member's first runs,
    which also start the run launcher's server); then ``again()`` produces a second backlog and it is waited for
    the same way (the second wave: the runs a deployment starts from then on). The side's figures, in seconds
    from ``started_at`` for the first wave."""

    def drained(target: int) -> Callable[[], list[dict[str, Any]] | None]:
        def check() -> list[dict[str, Any]] | None:
            runs = client.runs()
            materialized = client.materializations(asset)
            done = sum(int(m.get("records") or 0) for m in materialized) >= target
            return runs if done and all(r["status"] in ENDED for r in runs) else None

        return check

    first_runs = wait_for(f"{total} records materialized", drained(total), timeout_s)
    drained_s = time.time() - started_at
    figures = summarize(first_runs, first_materialization(client, asset) - started_at, drained_s)
    produced_at = time.time()
    added = again()
    seen = {r["runId"] for r in first_runs}
    all_runs = wait_for(f"{total + added} records materialized", drained(total + added), timeout_s)
    second = summarize([r for r in all_runs if r["runId"] not in seen], 0.0, time.time() - produced_at)
    figures["first_wave_run_start_p50_s"] = figures.pop("run_start_p50_s")
    figures["first_wave_run_start_max_s"] = figures.pop("run_start_max_s")
    figures.update(
        second_wave_runs=second["runs"],
        second_wave_drained_s=second["drained_s"],
        run_start_p50_s=second["run_start_p50_s"],
        run_start_max_s=second["run_start_max_s"],
        runs_failed=figures["runs_failed"] + second["runs_failed"],
    )
    return figures


def first_materialization(client: WebserverClient, asset: str) -> float:
    """The earliest materialization's time (asked until the webserver answers: a loaded one may fail a call)."""

    def earliest() -> float | None:
        data = client.graphql(
            """query($k: AssetKeyInput!) { assetOrError(assetKey: $k) { ... on Asset {
                 assetMaterializations(limit: 10000) { timestamp } } } }""",
            {"k": {"path": [asset]}},
        )
        stamps = [float(m["timestamp"]) / 1000 for m in data["assetOrError"]["assetMaterializations"]]
        return min(stamps) if stamps else None

    return wait_for("the first materialization's time", earliest, 120.0)


def summarize(runs: Sequence[dict[str, Any]], first_s: float, drained_s: float) -> dict[str, Any]:
    starts = [float(r["startTime"]) - float(r["creationTime"]) for r in runs if r.get("startTime")]
    return {
        "first_materialization_s": round(first_s, 1),
        "drained_s": round(drained_s, 1),
        "runs": len(runs),
        "runs_failed": sum(1 for r in runs if r["status"] == "FAILURE"),
        "run_start_p50_s": round(statistics.median(starts), 2) if starts else None,
        "run_start_max_s": round(max(starts), 2) if starts else None,
    }


def ratios(side: dict[str, Any], example: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for key in ("first_materialization_s", "run_start_p50_s", "drained_s"):
        ours, theirs = side.get(key), example.get(key)
        out[f"ratio_{key}"] = round(ours / theirs, 2) if ours is not None and theirs else None
    return out


def run_example(
    work: Path, bootstrap: str, tag: str, records: int, partitions: int, timeout_s: float
) -> dict[str, Any]:
    topic = f"newcomer_example_{tag}"
    total = produce(bootstrap, topic, partitions, records)
    env = {
        "CLICKSTREAM_BOOTSTRAP": bootstrap,
        "CLICKSTREAM_TOPIC": topic,
        "CLICKSTREAM_GROUP": topic,
        "CLICKSTREAM_OUTPUT": str(work / "example-output"),
        "CLICKSTREAM_CARRY_ON_S": "0",  # a run per wave, as the component's default: run starts are measured
        "PYSPARK_PYTHON": str(ROOT / ".venv" / "bin" / "python"),
    }
    with DagsterDev(work / "example-home", env, work / "example-dagster-dev.log") as dev:
        started_at = time.time()
        dev.start(timeout_s)
        again = functools.partial(produce, bootstrap, topic, partitions, records, create=False)
        return measure(dev, EXAMPLE_ASSET, started_at, total, timeout_s, again)


def dg_venv(work: Path) -> Path:
    """A virtualenv as a user makes one: this checkout with its [local] extra (dg comes with it)."""
    venv = work / "venv"
    python = Path(sys.executable).resolve()
    subprocess_run([UV, "venv", "--python", python, venv], work)
    subprocess_run([UV, "pip", "install", "--python", venv / "bin" / "python", f"{ROOT}[local]"], work)
    return venv / "bin" / "python"


def subprocess_run(command: Sequence[str | Path], cwd: Path) -> None:
    import subprocess

    done = subprocess.run([str(c) for c in command], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(str(c) for c in command)}: exit {done.returncode}\n{done.stderr[-3000:]}")


def run_dg(
    work: Path,
    python: Path,
    bootstrap: str,
    tag: str,
    records: int,
    partitions: int,
    timeout_s: float,
    *,
    economy: bool,
) -> dict[str, Any]:
    from importlib import metadata

    name = "newcomer" if economy else "newcomer_default"
    project = create_project(work, name, python, metadata.version("dagster"), UV)
    topic = f"{name}_{tag}"
    params = json.dumps({"group": topic, "bootstrap_servers": bootstrap, "topics": [topic]})
    said = project.dg("scaffold", "defs", KAFKA_COMPONENT, "clicks", "--json-params", params)
    if not economy:
        (project.root / "dagster.yaml").unlink()
    set_attributes(project.defs / "clicks" / "defs.yaml", {"default_status": "RUNNING"})
    project.dg("check", "defs")
    total = produce(bootstrap, topic, partitions, records)
    with DgDev(project, work / f"{name}-dg-dev.log") as dev:
        dev.start(timeout_s)
        assert dev.started_at is not None
        again = functools.partial(produce, bootstrap, topic, partitions, records, create=False)
        figures = measure(dev, DG_ASSET, dev.started_at, total, timeout_s, again)
        figures["stop_exit_code"] = dev.stop()
    figures["scaffold_wrote_dagster_yaml"] = f"Wrote {project.root / 'dagster.yaml'}" in said
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--sides", default="example,dg", help=f"comma-separated of {', '.join(SIDES)}")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds each side may take")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, projects)")
    args = parser.parse_args(argv)
    sides = [s.strip() for s in args.sides.split(",") if s.strip()]
    if not sides or any(s not in SIDES for s in sides):
        parser.error(f"--sides: of {', '.join(SIDES)}")
    work = Path(tempfile.mkdtemp(prefix="streamgroup-newcomer-"))
    tag = f"{int(time.time())}"
    results: dict[str, dict[str, Any]] = {}
    try:
        with running_broker() as broker:
            python: Path | None = None
            for side in sides:
                started = time.monotonic()
                print(f"newcomer: {side} ...", flush=True)
                if side == "example":
                    results[side] = run_example(
                        work, broker.bootstrap, tag, args.records, args.partitions, args.timeout
                    )
                else:
                    python = python or dg_venv(work)
                    results[side] = run_dg(
                        work,
                        python,
                        broker.bootstrap,
                        tag,
                        args.records,
                        args.partitions,
                        args.timeout,
                        economy=side == "dg",
                    )
                print(f"newcomer: {side}: {results[side]} ({time.monotonic() - started:.0f} s)", flush=True)
    finally:
        if args.keep:
            print(f"newcomer: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if "example" in results:
        for side in ("dg", "dg-default"):
            if side in results:
                results[side].update(ratios(results[side], results["example"]))
                met = [
                    results[side][k] is not None and results[side][k] <= TARGET_RATIO
                    for k in ("ratio_first_materialization_s", "ratio_run_start_p50_s")
                ]
                print(f"newcomer: {side} against the example: {ratios(results[side], results['example'])}; "
                      f"target each <= {TARGET_RATIO}: {'met' if all(met) else 'not met'}")  # fmt: skip
    print(json.dumps({"records": args.records, "partitions": args.partitions, **results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
