"""A small code location for the launcher tests: a quick asset, and one that waits for a file.

Its assets report facts about the process that runs them (PID, parent, seeds, sockets, the code version), so
the tests can check what the launcher promises from inside a real run.
"""

import json
import os
import random
import sys
import time
from pathlib import Path

import behaviour
import dagster as dg
import numpy
from dagster._core.storage import sql
from dagster._core.storage.event_log.sqlite import sqlite_event_log

WAIT_LIMIT_S = 600.0


def _facts() -> dict[str, dg.MetadataValue]:
    fds = []
    for entry in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:
            continue
        if target.startswith("socket:"):
            fds.append(target)
    return {
        "pid": dg.MetadataValue.int(os.getpid()),
        "ppid": dg.MetadataValue.int(os.getppid()),
        "version": dg.MetadataValue.text(behaviour.VERSION),
        "random": dg.MetadataValue.float(random.random()),
        "numpy_random": dg.MetadataValue.float(float(numpy.random.random())),
        "sockets": dg.MetadataValue.text(json.dumps(sorted(fds))),
        "modules": dg.MetadataValue.int(len(sys.modules)),
        "schema_check_scripts": dg.MetadataValue.text(sql.ScriptDirectory.__name__),
        "event_log_engines": dg.MetadataValue.text(sqlite_event_log.create_engine.__module__),
        # IPython is not installed here: "searched" when each import looks for it, "settled" when the process
        # already knows it is absent.
        "ipython": dg.MetadataValue.text(
            "installed" if sys.modules.get("IPython") else "settled" if "IPython" in sys.modules else "searched"
        ),
    }


@dg.asset
def quick() -> dg.MaterializeResult:
    print(f"quick ran in process {os.getpid()}")  # captured into the run's compute logs
    return dg.MaterializeResult(metadata=_facts())


@dg.asset
def waits(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """Runs until the file named by the run's ``release`` tag exists (tests use it to hold a run open)."""
    return _wait_for_release(context)


def _wait_for_release(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    release = Path(context.run.tags["release"])
    facts = _facts()
    Path(f"{release}.started").write_text(str(os.getpid()))
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} did not appear within {WAIT_LIMIT_S:g} s")
        time.sleep(0.1)
    return dg.MaterializeResult(metadata=facts)


@dg.asset
def opens_store(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """Opens the state store named by the run's ``store_url`` tag through a group resource, as a stream run
    does, and reports how many store and stream clients the process had cached before."""
    from dagster_streamgroup.dagster import resources

    cached_before = len(resources._stores) + len(resources._backends)
    group = resources.KafkaStreamGroup(
        group="reuse", bootstrap_servers="127.0.0.1:9", topics=["t"], store_url=context.run.tags["store_url"]
    )
    store = group.store()
    return dg.MaterializeResult(
        metadata={**_facts(), "cached_before": dg.MetadataValue.int(cached_before), "store": str(id(store))}
    )


TEST_POOL = "streamgroup-test-pool"


@dg.asset(pool=TEST_POOL)
def pooled_quick() -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata=_facts())


@dg.asset(pool=TEST_POOL)
def pooled_waits(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    """``waits`` in the test pool: holds the pool's slot until released."""
    return _wait_for_release(context)


defs = dg.Definitions(
    assets=[quick, waits, opens_store, pooled_quick, pooled_waits],
    jobs=[
        dg.define_asset_job("quick_job", [quick]),
        dg.define_asset_job("wait_job", [waits]),
        dg.define_asset_job("store_job", [opens_store]),
        dg.define_asset_job("pooled_quick_job", [pooled_quick]),
        dg.define_asset_job("pooled_wait_job", [pooled_waits]),
    ],
    executor=dg.in_process_executor,
)
