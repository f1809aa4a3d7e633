"""What a Dagster run costs to start: the same trivial run under Dagster's default launcher and under
``ForkServerRunLauncher``, each in one real ``dagster dev``.

``python -m bench.launch [--runs 20] [--launchers default fork] [--timeout 1200]``

For each launcher: a fresh instance with the example's ``dagster.yaml`` (its coordinator queues these runs, which
are not member runs, as the QueuedRunCoordinator does: dequeue every second; run monitoring), its ``run_launcher``
set to the launcher measured, and the code location of ``bench/launch_definitions.py`` (a trivial asset whose
module and run import what the example's code location and a stream run import). One warm-up run (reported as
``first_*``: it starts the code server's caches, and the fork server), then ``--runs`` runs one after another, each
submitted over GraphQL as the UI does. Per run, from the event log: created -> RUN_START (``launch_s``), split into
queued (created -> STARTING: the coordinator's dequeue), launch (STARTING -> the worker's "Started process" event)
and worker start (-> RUN_START), and RUN_START -> RUN_SUCCESS (``start_to_success_s``); from ``/proc``: the CPU
seconds spent by the code server and the run process (``run_cpu_s``: the code server's tree, and the fork server's
tree, which hold the run processes once they are reaped; read before the run and after its process is reaped), and
beside it the daemon's and the webserver's. Medians are printed per launcher; the last line is one JSON object with
both and their ratios. Targets of the run-economy issue (printed, never asserted): launch_p50_s <= 1.0, run_cpu_s
<= 0.5.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dagster as dg
import yaml

from dagster_streamgroup.dagster.devserver import ROOT, DagsterDev
from dagster_streamgroup.local import procfs

LOCATION = "bench_launch"
JOB = "trivial_job"
DEFINITIONS = ROOT / "bench" / "launch_definitions.py"
LAUNCHERS: dict[str, dict[str, str] | None] = {
    "default": None,
    "fork": {"module": "dagster_streamgroup.launcher", "class": "ForkServerRunLauncher"},
}
LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
PHASES = (
    "queued_s",
    "starting_to_process_s",
    "worker_start_s",
    "start_to_step_s",
    "step_s",
    "step_to_success_s",
    "exit_s",
)
ROLES = (
    (b"dagster_streamgroup.launcher.forkserver", "fork_server"),
    (b"api grpc", "code_server"),
    (b"code-server start", "code_server"),
    (b"dagster._daemon", "daemon"),
    (b"dagster_webserver", "webserver"),
)
STARTED = re.compile(r"Started process for run \(pid: (\d+)\)")


def instance_settings(launcher: str) -> str:
    """The example's instance settings with ``launcher`` as the run launcher."""
    settings = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    settings.pop("run_launcher", None)
    if LAUNCHERS[launcher] is not None:
        settings["run_launcher"] = LAUNCHERS[launcher]
    return yaml.safe_dump(settings)


def cpu_by_role(root: int) -> dict[str, float]:
    """CPU seconds of each part of ``dagster dev``'s tree, with the children each part has waited for (the
    run processes, once reaped, are in the code server's or the fork server's figure)."""
    totals: dict[str, float] = {}
    for pid in procfs.process_tree(root):
        line = b" ".join(procfs.cmdline(pid))
        role = next((name for marker, name in ROLES if marker in line), None)
        if role is not None:
            totals[role] = totals.get(role, 0.0) + procfs.cpu_seconds(pid)
    return totals


def wait(what: str, check: Callable[[], Any], timeout_s: float, interval_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval_s)
    raise TimeoutError(f"{what}: not within {timeout_s:g} s")


def timeline(instance: dg.DagsterInstance, run_id: str) -> dict[str, float]:
    record = instance.get_run_record_by_id(run_id)
    assert record is not None
    at: dict[str, float] = {"created": record.create_timestamp.timestamp()}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None:
            continue
        name = event.event_type_value
        if name == "ENGINE_EVENT" and STARTED.search(event.message or ""):
            name = "PROCESS_STARTED"
        elif name == "ENGINE_EVENT" and (event.message or "").startswith("Process for run exited"):
            name = "PROCESS_EXITED"
        at.setdefault(name, entry.timestamp)
    return {
        "launch_s": at["PIPELINE_START"] - at["created"],
        "start_to_success_s": at["PIPELINE_SUCCESS"] - at["PIPELINE_START"],
        "queued_s": at["PIPELINE_STARTING"] - at["created"],
        "starting_to_process_s": at["PROCESS_STARTED"] - at["PIPELINE_STARTING"],
        "worker_start_s": at["PIPELINE_START"] - at["PROCESS_STARTED"],
        "start_to_step_s": at["STEP_START"] - at["PIPELINE_START"],
        "step_s": at["STEP_SUCCESS"] - at["STEP_START"],
        "step_to_success_s": at["PIPELINE_SUCCESS"] - at["STEP_SUCCESS"],
        "exit_s": at["PROCESS_EXITED"] - at["PIPELINE_SUCCESS"],
    }


def worker_pid(instance: dg.DagsterInstance, run_id: str) -> int:
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        match = STARTED.search(entry.dagster_event.message or "") if entry.dagster_event else None
        if match:
            return int(match.group(1))
    raise RuntimeError(f"run {run_id} has no 'Started process' event")


class Bench:
    def __init__(self, launcher: str, tmp: Path) -> None:
        home = tmp / "home"
        workspace = tmp / "workspace.yaml"
        workspace.write_text(
            yaml.safe_dump(
                {
                    "load_from": [
                        {
                            "python_file": {
                                "relative_path": str(DEFINITIONS),
                                "working_directory": str(ROOT),
                                "location_name": LOCATION,
                            }
                        }
                    ]
                }
            )
        )
        self.dev = DagsterDev(home, {}, tmp / "dagster-dev.log", storage="sqlite", workspace=workspace)
        (home / "dagster.yaml").write_text(instance_settings(launcher))
        self.instance = dg.DagsterInstance.from_config(str(home))

    def run_once(self, timeout_s: float) -> dict[str, float]:
        assert self.dev.proc is not None
        before = cpu_by_role(self.dev.proc.pid)
        params = {
            "selector": {"repositoryLocationName": LOCATION, "repositoryName": "__repository__", "jobName": JOB},
            "runConfigData": {},
        }
        result = self.dev.graphql(LAUNCH, {"p": params})["launchRun"]
        if result["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launching {JOB}: {result}")
        run_id = result["run"]["runId"]

        def finished() -> dg.DagsterRun | None:
            run = self.instance.get_run_by_id(run_id)
            return run if run is not None and run.is_finished else None

        run = wait(f"run {run_id}", finished, timeout_s)
        if run.status != dg.DagsterRunStatus.SUCCESS:
            raise RuntimeError(f"run {run_id} ended {run.status.value}")
        pid = worker_pid(self.instance, run_id)
        wait(f"the run process {pid} to be reaped", lambda: not os.path.exists(f"/proc/{pid}"), 30)
        after = cpu_by_role(self.dev.proc.pid)
        cpu = {f"{role}_cpu_s": after.get(role, 0.0) - before.get(role, 0.0) for role in {*before, *after}}
        cpu["run_cpu_s"] = cpu.get("code_server_cpu_s", 0.0) + cpu.get("fork_server_cpu_s", 0.0)
        return {**timeline(self.instance, run_id), **cpu}

    def close(self) -> None:
        self.dev.close()
        self.instance.dispose()


def median(samples: Sequence[dict[str, float]], key: str) -> float:
    return round(statistics.median(s.get(key, 0.0) for s in samples), 3)


def measure(launcher: str, runs: int, deadline: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-launch-{launcher}-") as tmp:
        bench = Bench(launcher, Path(tmp))
        try:
            started = time.monotonic()
            bench.dev.start()
            startup_s = time.monotonic() - started
            first = bench.run_once(max(1.0, deadline - time.monotonic()))
            samples = []
            for _ in range(runs):
                samples.append(bench.run_once(max(1.0, deadline - time.monotonic())))
        finally:
            bench.close()
    keys = ["launch_s", "start_to_success_s", "run_cpu_s", *PHASES]
    keys += ["code_server_cpu_s", "fork_server_cpu_s", "daemon_cpu_s", "webserver_cpu_s"]
    summary: dict[str, Any] = {
        "launch_p50_s": median(samples, "launch_s"),
        "start_to_success_p50_s": median(samples, "start_to_success_s"),
        "run_cpu_s": median(samples, "run_cpu_s"),
        "phases_p50_s": {key: median(samples, key) for key in keys if key not in ("launch_s", "run_cpu_s")},
        "first_launch_s": round(first["launch_s"], 3),
        "first_run_cpu_s": round(first["run_cpu_s"], 3),
        "dagster_dev_startup_s": round(startup_s, 1),
        "runs": len(samples),
    }
    return summary


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b > 0 else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs measured per launcher (after one warm-up)")
    parser.add_argument("--launchers", nargs="+", choices=sorted(LAUNCHERS), default=["default", "fork"])
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds for the whole benchmark")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs: must be at least 1")
    deadline = time.monotonic() + args.timeout
    load_before = os.getloadavg()[0]
    results: dict[str, Any] = {}
    for launcher in args.launchers:
        result = measure(launcher, args.runs, deadline)
        results[launcher] = result
        print(
            f"{launcher:>8}: launch_p50_s {result['launch_p50_s']:.3f}  start_to_success_p50_s "
            f"{result['start_to_success_p50_s']:.3f}  run_cpu_s {result['run_cpu_s']:.3f}  "
            f"(first run: launch {result['first_launch_s']:.2f} s, cpu {result['first_run_cpu_s']:.2f} s)",
            flush=True,
        )
        print(f"          phases p50: {json.dumps(result['phases_p50_s'])}", flush=True)
    dequeue = yaml.safe_load((ROOT / "dagster.yaml").read_text())["run_coordinator"]["config"].get(
        "dequeue_interval_seconds"
    )
    summary: dict[str, Any] = {
        "runs": args.runs,
        "dequeue_interval_seconds": dequeue,
        **results,
        "load_avg_1m": [round(load_before, 2)],
    }
    summary["load_avg_1m"].append(round(os.getloadavg()[0], 2))
    if "default" in results and "fork" in results:
        d, f = results["default"], results["fork"]
        summary["ratio_launch_p50"] = _ratio(d["launch_p50_s"], f["launch_p50_s"])
        summary["ratio_start_to_success_p50"] = _ratio(d["start_to_success_p50_s"], f["start_to_success_p50_s"])
        summary["ratio_run_cpu"] = _ratio(d["run_cpu_s"], f["run_cpu_s"])
    if "fork" in results:
        print(
            f"targets: launch_p50_s {results['fork']['launch_p50_s']:.3f} (<= 1.0), "
            f"run_cpu_s {results['fork']['run_cpu_s']:.3f} (<= 0.5)"
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
