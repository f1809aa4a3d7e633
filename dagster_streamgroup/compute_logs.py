"""Dagster's local compute logs, mirrored to the run process's own output by a thread instead of processes.

``LocalComputeLogManager`` captures a step's stdout and stderr by pointing the process's file descriptors at two
files (what the UI shows) and mirrors each file back to the original output with a ``tail -F`` process and a
Python process that watches it for orphaning: four processes per step, about 20 ms of CPU and 45 ms of wall
time in a process the size of a run worker (docs/launcher.md). Here one thread per step follows both files and
writes what they gain to copies of the original descriptors; it ends with the step, after a last read, and dies
with the process, so nothing can be orphaned. Files, paths, configuration and the UI are Dagster's: this is its
class with the mirror replaced. In ``dagster.yaml``::

    compute_logs:
      module: dagster_streamgroup.compute_logs
      class: ThreadMirroredComputeLogManager
      config:
        base_dir: ...   # as LocalComputeLogManager's; by default $DAGSTER_HOME/storage, as Dagster's default

Without ``DAGSTER_HOME`` (``dg dev`` and ``dagster dev`` then keep a temporary instance in the working directory,
and read a ``dagster.yaml`` found there), the default is the ``storage`` folder of the instance it is built for,
as Dagster's own default is.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from dagster import Field, Float, StringSource
from dagster._config.config_schema import UserConfigSchema
from dagster._core.errors import DagsterInvariantViolationError
from dagster._core.execution.compute_logs import redirect_to_file
from dagster._core.instance.ref import compute_logs_directory
from dagster._core.storage.compute_log_manager import CapturedLogContext, ComputeIOType
from dagster._core.storage.local_compute_log_manager import IO_TYPE_EXTENSION, LocalComputeLogManager
from dagster._serdes import ConfigurableClassData
from dagster._utils import ensure_file, touch_file

POLL_S = 0.1
"""How soon the mirror looks again after it copied output: a step that prints is followed closely."""
IDLE_POLL_S = 1.0
"""How often it looks at the most while nothing new comes (as ``tail -F`` does): a long quiet step, a Spark job
waited on, costs ten wakeups of this thread in ten seconds, not a hundred. The wait doubles from ``POLL_S``
each time a look finds nothing."""


class ThreadMirroredComputeLogManager(LocalComputeLogManager):
    """``LocalComputeLogManager`` whose mirror of a step's output is a thread, not ``tail`` processes."""

    @classmethod
    def config_type(cls) -> UserConfigSchema:
        return {"base_dir": Field(StringSource, is_required=False), "polling_timeout": Field(Float, is_required=False)}

    @classmethod
    def from_config_value(
        cls, inst_data: ConfigurableClassData | None, config_value: Any
    ) -> ThreadMirroredComputeLogManager:
        """``base_dir`` defaults to where Dagster's own default puts compute logs: ``$DAGSTER_HOME/storage``."""
        values = dict(config_value)
        if not values.get("base_dir"):
            home = os.environ.get("DAGSTER_HOME")
            values["base_dir"] = compute_logs_directory(home) if home else ""  # "": the instance's, once known
        return cls(inst_data=inst_data, **values)

    def register_instance(self, instance: Any) -> None:
        """A temporary instance's folder is known only here: the compute logs go to its ``storage``, where
        Dagster's own default puts them."""
        super().register_instance(instance)
        if not self._base_dir:
            self._base_dir = compute_logs_directory(instance.root_directory)

    def _require_base_dir(self) -> None:
        if not self._base_dir:
            raise DagsterInvariantViolationError(
                "compute_logs.config.base_dir: not set, DAGSTER_HOME is not set, and no instance was registered"
            )

    @contextmanager
    def capture_logs(self, log_key: Sequence[str]) -> Iterator[CapturedLogContext]:
        self._require_base_dir()
        out = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDOUT])
        err = self.get_captured_local_path(log_key, IO_TYPE_EXTENSION[ComputeIOType.STDERR])
        with Mirror() as mirror, captured(sys.stdout, out, mirror), captured(sys.stderr, err, mirror):
            yield CapturedLogContext(log_key)
        touch_file(self.complete_artifact_path(log_key))  # type: ignore[no-untyped-call]


class Mirror:
    """One thread copying what files gain to descriptors, until each file is finished."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._followed: dict[str, tuple[IO[bytes], int]] = {}
        self._thread = threading.Thread(target=self._run, name="compute-log-mirror", daemon=True)

    def __enter__(self) -> Mirror:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for path in list(self._followed):
            self.finish(path)

    def follow(self, path: str, target_fd: int) -> None:
        """Copy ``path`` (from its start, as ``tail -c +0``) to ``target_fd``, which the mirror then owns."""
        with self._lock:
            self._followed[path] = (open(path, "rb"), target_fd)  # noqa: SIM115 (closed by finish)

    def finish(self, path: str) -> None:
        """A last copy of ``path``, then stop following it and close its target."""
        with self._lock:
            followed = self._followed.pop(path, None)
            if followed is None:
                return
            source, target = followed
            _copy(source, target)
            source.close()
            os.close(target)

    def _run(self) -> None:
        wait_s = POLL_S
        while not self._stop.wait(wait_s):
            with self._lock:
                copied = sum(_copy(source, target) for source, target in self._followed.values())
            wait_s = POLL_S if copied else min(2 * wait_s, IDLE_POLL_S)


def _copy(source: IO[bytes], target: int) -> int:
    """What ``source`` gained, written to ``target``; the bytes read."""
    data = source.read()
    read = len(data)
    while data:
        try:
            written = os.write(target, data)
        except OSError:  # the output went away (a closed terminal): the captured file still has everything
            return read
        data = data[written:]
    return read


@contextmanager
def captured(stream: IO[str], path: str, mirror: Mirror) -> Iterator[None]:
    """``stream``'s descriptor pointed at ``path`` (Dagster's own redirect), and the file mirrored to what the
    descriptor pointed at before."""
    ensure_file(path)
    try:
        original = os.dup(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no descriptor (a test runner's stream): capture only
        with redirect_to_file(stream, path):
            yield
        return
    mirror.follow(path, original)
    try:
        with redirect_to_file(stream, path):
            yield
    finally:
        mirror.finish(path)
