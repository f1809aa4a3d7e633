"""``scripts/example.sh`` hands each secret it generates only to the processes that use it: the Dagster instance
database's password (``DAGSTER_STORAGE=postgres``) to the PostgreSQL helper and ``dg dev``, the v3io access
key (``STREAM=v3io``) to the v3io server, the producer and ``dg dev``; neither is on any command line.

The example runs as a user runs it (``bash scripts/example.sh``, local Spark so no Connect server is started),
in a directory of its own (``EXAMPLE_HOME``); once ``dg dev``'s daemon runs, the environment of every process
the script started is read (``/proc/PID/environ``), and the command line of every process on the machine was
sampled all along. Then Ctrl-C (SIGINT) stops it, as in a terminal. Before that, what it printed until its UI
answered holds no warning, and then it printed where to look: the stream asset's page and the `streamgroup
status` command."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dagster_streamgroup.dagster.devserver import ROOT
from dagster_streamgroup.local.kafka_broker import free_port
from tests.secrets.leaks import Evidence, describe, find_secrets
from tests.secrets.proc import CommandLineSampler, command_line, descendants, environment

STARTED = {
    "the PostgreSQL helper": b"dagster_streamgroup.local.dagster_storage",
    "the v3io server": b"local\0v3io",
    "the producer": b"jobs.clickstream_events",
    "dg dev": b"dg\0dev",
    "the daemon": b"dagster._daemon",  # dg dev's child: the deployment is up
}
UI_UP = "example: the Dagster UI is up"
FIRST_MINUTE_WARNINGS = (
    "SupersessionWarning",  # `dagster dev` is superseded by `dg dev` (Dagster 1.13)
    "Found a dagster instance configuration value",  # a dagster.yaml where the dev server starts, not its home
    "Warning",
    "WARNING",
)
"""What the example prints before its UI is up must hold none of these (the JVM's own notices come later, from
the runs' Spark sessions)."""
MAY_HOLD = {
    "pg_password": ("the PostgreSQL helper", "dg dev"),
    "v3io_key": ("the v3io server", "the producer", "dg dev"),
}
"""Who may hold each secret in its environment; ``dg dev``'s children (daemon, webserver, code server) are
counted as ``dg dev``."""


def _which(pid: int, tree: dict[int, int]) -> str | None:
    """What started process ``pid`` is, or belongs to (a child of ``dg dev`` is ``dg dev``)."""
    while pid in tree:
        line = command_line(pid) or b""
        for name, marker in STARTED.items():
            if marker in line and name != "the daemon":
                return name
        pid = tree[pid]
    return None


def _parents(pids: list[int]) -> dict[int, int]:
    found = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
            found[pid] = int(stat.rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.postgres
@pytest.mark.v3io
@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.timeout(600)
def test_the_example_hands_each_secret_only_to_the_processes_that_use_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {
        **os.environ,
        "EXAMPLE_HOME": str(home),
        "CLICKSTREAM_OUTPUT": str(tmp_path / "output"),
        "PORT": str(free_port()),
        "STREAM": "v3io",
        "SPARK": "local",
        "DAGSTER_STORAGE": "postgres",
        "RATE": "5",
        "CLICKSTREAM_PARTITIONS": "2",
    }
    env.pop("DAGSTER_PG_PASSWORD", None)
    env.pop("V3IO_ACCESS_KEY", None)
    log = tmp_path / "example.log"
    seen: set[int] = set()
    environments: dict[int, tuple[str, dict[str, str]]] = {}
    with CommandLineSampler(interval_s=0.1) as sampler, log.open("wb") as out:
        script = subprocess.Popen(
            ["bash", str(ROOT / "scripts/example.sh")], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 300
            while True:
                pids = descendants(script.pid)
                seen.update(pids)
                lines = {pid: command_line(pid) or b"" for pid in pids}
                missing = [name for name, marker in STARTED.items() if not any(marker in x for x in lines.values())]
                if not missing:
                    break
                assert script.poll() is None, f"the example exited:\n{log.read_text(errors='replace')[-3000:]}"
                assert time.monotonic() < deadline, f"not started within 300 s: {missing}\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
            tree = _parents(pids)
            for pid in pids:
                name = _which(pid, tree) or f"another process ({(command_line(pid) or b'?')[:80]!r})"
                read = environment(pid)
                if (
                    read is not None
                    and (command_line(pid) or b"").split(b"\0", 1)[0].rsplit(b"/", 1)[-1] != b"postgres"
                ):
                    environments[pid] = (name, read)  # a PostgreSQL process's environ holds its process title
            while UI_UP not in log.read_text(errors="replace"):
                assert script.poll() is None, f"the example exited:\n{log.read_text(errors='replace')[-3000:]}"
                assert time.monotonic() < deadline + 120, f"no UI within 420 s:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)
        finally:
            script.send_signal(signal.SIGINT)  # Ctrl-C: the script stops what it started, by PID
            try:
                script.wait(120)
            finally:
                for pid in descendants(script.pid) if script.poll() is None else []:
                    os.kill(pid, signal.SIGKILL)
                if script.poll() is None:
                    script.kill()
                    script.wait(10)
    values = {"v3io_key": (home / "v3io-access-key").read_text().strip()}
    first_minute = log.read_text(errors="replace").split(UI_UP, 1)[0] + UI_UP
    for warning in FIRST_MINUTE_WARNINGS:  # the first screen a newcomer reads holds no warning to decode
        assert warning not in first_minute, f"{warning!r} before the UI was up:\n{first_minute[-3000:]}"
    where = log.read_text(errors="replace").split(UI_UP, 1)[1]
    port = env["PORT"]
    assert f"http://127.0.0.1:{port}/assets/clicks" in where, where[:2000]  # where to look, once the UI is up
    assert f"DAGSTER_HOME={home} V3IO_ACCESS_KEY=$(cat {home}/v3io-access-key) CLICKSTREAM_STREAM=v3io" in where
    assert ".venv/bin/streamgroup status --group clickstream" in where, where[:2000]
    dagster_dev = [read for name, read in environments.values() if name == "dg dev"]
    assert dagster_dev and all("DAGSTER_PG_PASSWORD" in read for read in dagster_dev), "dg dev needs it"
    values["pg_password"] = dagster_dev[0]["DAGSTER_PG_PASSWORD"]

    lines = Evidence()
    sampler.add_to(lines)
    assert not find_secrets(lines, values), describe(find_secrets(lines, values))
    held = {}
    for pid, (name, read) in environments.items():
        evidence = Evidence()
        evidence.add(f"/proc/{pid}/environ of {name}", "\n".join(f"{k}={v}" for k, v in read.items()))
        held[(pid, name)] = {f.secret for f in find_secrets(evidence, values)}
    wrong = {
        where: secrets for where, secrets in held.items() if secrets - {s for s in values if where[1] in MAY_HOLD[s]}
    }
    assert not wrong, f"secrets held by processes that do not use them: {wrong}"
    users = {name for (_pid, name), secrets in held.items() if "v3io_key" in secrets}
    assert {"the v3io server", "the producer", "dg dev"} <= users, held  # the search finds what is there
    print(f"{len(environments)} environments read, {len(sampler.lines)} command lines in {sampler.samples} samples")
