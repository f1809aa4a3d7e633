"""A code server's life in one process: member ticks evaluated in a worker thread (as gRPC's thread pool evaluates
them) build the group resource and open the instance, both kept for the process; then the process ends normally
and ``tick_context.release`` (atexit, main thread) tears them down. Whatever that prints goes to stderr, which the
test reads. The instance folder is the first argument."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from dagster_streamgroup.dagster import KafkaStreamGroup, tick_context

definitions = dg.Definitions(
    resources={"streamgroup": KafkaStreamGroup(group="probe", bootstrap_servers="127.0.0.1:9", topics=["t"])}
)
instance = dg.DagsterInstance.local_temp(sys.argv[1])


def tick() -> str:
    context = dg.build_sensor_context(
        instance_ref=instance.get_ref(), sensor_name="probe_member_0", repository_name="r", definitions=definitions
    )
    built = tick_context.group_resource(context, "streamgroup")
    assert tick_context.tick_instance(context) is not None
    return f"{type(built).__name__} in {threading.current_thread().name}"


with ThreadPoolExecutor(max_workers=1) as pool:  # the worker thread ends before the process does, as gRPC's
    print(pool.submit(tick).result(), flush=True)
