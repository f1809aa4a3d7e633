"""Runs a one-step job in process on an instance whose compute log manager is ``argv[1]`` (module.Class), with
compute logs under ``argv[2]``; the step prints to stdout and stderr and counts its process's children. Prints
a JSON line: the children counted, and the step's captured stdout and stderr as the UI reads them."""

from __future__ import annotations

import json
import os
import sys

import dagster as dg


def children() -> int:
    me = str(os.getpid())
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[1] == me:
                    count += 1
        except OSError:
            continue
    return count


@dg.op
def speak() -> int:
    print("to stdout from the step", flush=True)
    print("to stderr from the step", file=sys.stderr, flush=True)
    return children()


@dg.job
def speaking() -> None:
    speak()


def main() -> None:
    module, _, name = sys.argv[1].rpartition(".")
    overrides = {"compute_logs": {"module": module, "class": name, "config": {"base_dir": sys.argv[2]}}}
    with dg.instance_for_test(overrides=overrides) as instance:
        result = speaking.execute_in_process(instance=instance)
        manager = instance.compute_log_manager
        [capture] = instance.get_records_for_run(result.run_id, of_type=dg.DagsterEventType.LOGS_CAPTURED).records
        event = capture.event_log_entry.dagster_event
        assert event is not None
        log_key = [result.run_id, "compute_logs", event.logs_captured_data.file_key]
        data = manager.get_log_data(log_key)
        print(
            json.dumps(
                {
                    "manager": type(manager).__name__,
                    "children": result.output_for_node("speak"),
                    "stdout": (data.stdout or b"").decode(),
                    "stderr": (data.stderr or b"").decode(),
                    "complete": manager.is_capture_complete(log_key),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
