"""What a member tick takes from Dagster, built once per code-server process instead of at every evaluation.

Dagster builds a sensor's required resources and opens its instance from the instance reference again for each
evaluation, and drops both when it returns. For a member sensor that ticks every few seconds that was about half
of the code server's CPU (docs/benchmarks.md: building the group resource, three pydantic constructions of
some forty fields, and rehydrating the instance's storages), every tick, for the same answer: a code server's
environment, definitions and ``dagster.yaml`` do not change while it runs (a reload starts a new one). So the
member sensors require no resource of Dagster: the group resource is looked up in the code location
(``RepositoryDefinition.get_top_level_resources``) and built once, and the instance is opened once per
instance reference; Dagster's daemon keeps one instance across its sensor threads the same way.

A sensor called directly (a unit test's ``build_sensor_context(resources=..., instance=...)``) gets what its
context was built with, as before.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections import OrderedDict
from typing import Any

import dagster as dg

KEPT_RESOURCES = 8
"""Built resources kept per process, the least recently used dropped first: one per group of the code location in
a deployment; the bound only matters to a process that loads many definitions (a test session)."""
KEPT_INSTANCES = 2
"""Instances kept per process: a code server's ticks all come with one instance reference."""

_lock = threading.Lock()
_resources: OrderedDict[int, tuple[Any, Any, contextlib.ExitStack]] = OrderedDict()
"""Built resources by the id of their definition: (the definition, kept so its id is not reused; the built
resource; what tears it down when dropped)."""
_instances: OrderedDict[str, dg.DagsterInstance] = OrderedDict()
"""Instances by their serialized reference."""


def group_resource(context: dg.SensorEvaluationContext, key: str) -> Any:
    """The resource ``key`` of the sensor's code location, built on the first tick of this process."""
    given = context.resource_defs or {}
    repository = context.repository_def
    definition = repository.get_top_level_resources().get(key) if repository is not None else None
    if key in given or definition is None:
        return getattr(context.resources, key)  # built by Dagster for this call (or a clear error if missing)
    with _lock:
        kept = _resources.get(id(definition))
        if kept is not None and kept[0] is definition:
            _resources.move_to_end(id(definition))
            return kept[1]
    # Built with the tick's own instance (kept for the process as the resource is): without one, Dagster makes an
    # ephemeral instance whose in-memory SQLite storage holds a connection of this thread (a gRPC worker) until
    # the resource is torn down at exit, in the main thread, where closing it fails with a traceback.
    instance = tick_instance(context)
    with _lock:
        kept = _resources.get(id(definition))
        if kept is not None and kept[0] is definition:
            _resources.move_to_end(id(definition))
            return kept[1]
        while len(_resources) >= KEPT_RESOURCES:
            _drop(next(iter(_resources)))
        stack = contextlib.ExitStack()
        built = stack.enter_context(dg.build_resources({key: definition}, instance=instance))
        _resources[id(definition)] = (definition, getattr(built, key), stack)
        return getattr(built, key)


def tick_instance(context: dg.SensorEvaluationContext) -> dg.DagsterInstance | None:
    """The sensor's instance, opened on the first tick of this process; None for a context built without one
    (a unit test calling the sensor directly)."""
    ref = context.instance_ref
    if ref is None:
        try:
            return context.instance  # built with an instance object
        except dg.DagsterInvariantViolationError:
            return None
    key = dg.serialize_value(ref)
    with _lock:
        instance = _instances.get(key)
        if instance is not None:
            _instances.move_to_end(key)
            return instance
    opened = dg.DagsterInstance.from_ref(ref)  # not under the lock: a slow database holds back no other group
    with _lock:
        instance = _instances.setdefault(key, opened)
        _instances.move_to_end(key)
        while len(_instances) > KEPT_INSTANCES:
            _instances.popitem(last=False)  # not disposed: a tick may still use it; closed when collected
    if instance is not opened:
        opened.dispose()  # another tick opened it first
    return instance


def _drop(definition_id: int) -> None:
    _definition, _built, stack = _resources.pop(definition_id)
    with contextlib.suppress(Exception):  # a teardown that fails must not keep the others open
        stack.close()


@atexit.register
def release() -> None:
    """Tears the kept resources down and disposes the kept instances (at exit: before the interpreter takes
    the modules their teardown needs)."""
    with _lock:
        while _resources:
            _drop(next(iter(_resources)))
        while _instances:
            with contextlib.suppress(Exception):
                _instances.popitem()[1].dispose()
