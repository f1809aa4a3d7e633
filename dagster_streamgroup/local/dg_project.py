"""A ``dg`` project as a newcomer makes and runs it, for the wheel's test and ``bench.newcomer``.

``create-dagster project`` (of the installed Dagster's release), the project installed into a given virtualenv,
the group added with ``dg scaffold defs dagster_streamgroup.KafkaStreamGroupComponent``, ``dg check defs``, and
``dg dev`` on a free loopback port with ``DAGSTER_HOME`` unset (its instance a temporary folder in the project,
its settings the project's ``dagster.yaml``). ``dg dev`` runs in a session of its own with SIGINT at its default,
and is stopped as Ctrl-C stops it: SIGINT to its whole process group.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dagster_streamgroup.dagster.devserver import WebserverClient, wait_for
from dagster_streamgroup.local.kafka_broker import free_port

KAFKA_COMPONENT = "dagster_streamgroup.KafkaStreamGroupComponent"
DROPPED_ENV = ("DAGSTER_HOME", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


class DgCommandError(RuntimeError):
    """A command of the project failed; the message has its exit code and the tail of its output."""


@dataclass(frozen=True)
class DgProjectDir:
    """A project ``create-dagster`` made, installed (editable) into the virtualenv of ``python``."""

    root: Path
    name: str
    python: Path

    @property
    def bin(self) -> Path:
        return self.python.parent

    @property
    def defs(self) -> Path:
        return self.root / "src" / self.name / "defs"

    def env(self, **extra: str) -> dict[str, str]:
        """As a user's shell with the project's virtualenv activated, and no ``DAGSTER_HOME``."""
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV and not k.startswith("DAGSTER_")}
        env.update(VIRTUAL_ENV=str(self.bin.parent), PATH=f"{self.bin}{os.pathsep}{env.get('PATH', '')}", NO_COLOR="1")
        env.update(extra)
        return env

    def run(self, *command: str | Path, timeout_s: float = 300.0, cwd: Path | None = None) -> str:
        """Its stdout and stderr, together; raises ``DgCommandError`` when it fails."""
        done = subprocess.run(
            [str(c) for c in command],
            cwd=cwd or self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        output = done.stdout + done.stderr
        if done.returncode != 0:
            tail = "\n".join(output.splitlines()[-40:])
            raise DgCommandError(f"{' '.join(str(c) for c in command)}: exit {done.returncode}\n{tail}")
        return output

    def dg(self, *args: str, timeout_s: float = 300.0) -> str:
        return self.run(self.bin / "dg", *args, timeout_s=timeout_s)


def create_project(parent: Path, name: str, python: Path, dagster_version: str, uv: Path) -> DgProjectDir:
    """``create-dagster project NAME`` of ``dagster_version``, installed editable into ``python``'s virtualenv."""
    project = DgProjectDir(parent / name, name, python)
    tool: list[str | Path] = [uv, "tool", "run", "--python", python, "--from", f"create-dagster=={dagster_version}"]
    tool.append("create-dagster")
    project.run(*tool, "project", name, "--no-uv-sync", cwd=parent)
    project.run(uv, "pip", "install", "--python", python, "--no-deps", "-e", project.root, cwd=parent)
    return project


def set_attributes(defs_yaml: Path, values: Mapping[str, str]) -> None:
    """Edit a scaffolded ``defs.yaml`` as a user does: each ``key: value`` line (at any depth) given a new value."""
    text = defs_yaml.read_text()
    for key, value in values.items():
        text, count = re.subn(rf"(?m)^(\s*){re.escape(key)}: .*$", rf"\g<1>{key}: {value}", text)
        if count != 1:
            raise ValueError(f"{defs_yaml}: {count} lines set {key}, expected one")
    defs_yaml.write_text(text)


class DgDev(WebserverClient):
    """``dg dev`` of a project on a free loopback port, its output in ``log``."""

    def __init__(self, project: DgProjectDir, log: Path, extra_args: Sequence[str] = ()) -> None:
        self.project = project
        self.log = log
        self.port = free_port()
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        """``time.time()`` when the command started (the user pressing Enter)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> DgDev:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 300.0) -> None:
        command = ["env", "--default-signal=INT", str(self.project.bin / "dg"), "dev"]
        command += ["--port", str(self.port), "--host", "127.0.0.1", *self.extra_args]
        self.started_at = time.time()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                command,
                cwd=self.project.root,
                env=self.project.env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wait_for("dg dev's webserver and sensor daemon", self._ready, timeout_s)

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"dg dev exited with {self.proc.returncode}; see {self.log}")
        data = self.graphql("{ instance { daemonHealth { allDaemonStatuses { daemonType healthy required } } } }")
        statuses = data["instance"]["daemonHealth"]["allDaemonStatuses"]
        return any(s["daemonType"] == "SENSOR" and s["healthy"] for s in statuses)

    def stop(self, timeout_s: float = 90.0) -> int | None:
        """Ctrl-C: SIGINT to the process group; its exit code, or None when it had to be killed."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        pgid = proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGINT)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            return None


__all__ = ["KAFKA_COMPONENT", "DgCommandError", "DgDev", "DgProjectDir", "create_project", "set_attributes"]
