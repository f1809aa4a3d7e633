"""The fallback: a run worker started as a new ``dagster api execute_run`` process, as Dagster's Docker and
Kubernetes launchers start theirs (and as costly as the default launcher's spawned process)."""

from __future__ import annotations

import os
import subprocess
import threading

from dagster._grpc.types import ExecuteRunArgs
from dagster._serdes import serialize_value

from dagster_streamgroup.launcher.workdir import code_directory


class SpawnedWorkers:
    """The processes this launcher spawned, waited for in the background so none is left a zombie."""

    def __init__(self) -> None:
        self.exits: dict[int, int] = {}

    def spawn(self, args: ExecuteRunArgs) -> subprocess.Popen[bytes]:
        """``python -m dagster api execute_run`` with the code location's interpreter (the code server's)."""
        command = [args.job_origin.executable_path, "-m", "dagster", "api", "execute_run"]
        # The serialized arguments (which hold the instance settings) go through the environment, which
        # only this user can read, rather than the command line, which `ps` shows to everyone.
        env = {**os.environ, "DAGSTER_EXECUTE_RUN_ARGS": serialize_value(args)}
        cwd = code_directory(args.job_origin.repository_origin)
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=env, cwd=cwd)
        threading.Thread(target=self._wait, args=(proc,), name=f"wait-run-worker-{proc.pid}", daemon=True).start()
        return proc

    def _wait(self, proc: subprocess.Popen[bytes]) -> None:
        self.exits[proc.pid] = proc.wait()
