"""``scripts/example.sh`` hands each secret it generates only to the processes that use it: the Dagster instance
database's password (``DAGSTER_STORAGE=postgres``) to the PostgreSQL helper and ``dagster dev``, the v3io access
key (``STREAM=v3io``) to the v3io server, the producer and ``dagster dev``; neither is on any command line.

The example runs as a user runs it (``bash scripts/example.sh``, local Spark so no Connect server is started),
in a directory of its own (``EXAMPLE_HOME``); once ``dagster dev``'s daemon runs, the environment of every process
the script started is read (``/proc/PID/environ``), and the command line of every process on the machine was
sampled all along. Then Ctrl-C (SIGINT) stops it, as in a terminal."""

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
    "dagster dev": b"dagster\0dev",
    "the daemon": b"dagster._daemon",  # dagster dev's child: the deployment is up
}
MAY_HOLD = {
    "pg_password": ("the PostgreSQL helper", "dagster dev"),
    "v3io_key": ("the v3io server", "the producer", "dagster dev"),
}
"""Who may hold each secret in its environment; ``dagster dev``'s children (daemon, webserver, code server) are
counted as ``dagster dev``."""


def _which(pid: int, tree: dict[int, int]) -> str | None:
    """What started process ``pid`` is, or belongs to (a child of ``dagster dev`` is ``dagster dev``)."""
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
    dagster_dev = [read for name, read in environments.values() if name == "dagster dev"]
    assert dagster_dev and all("DAGSTER_PG_PASSWORD" in read for read in dagster_dev), "dagster dev needs it"
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
    assert {"the v3io server", "the producer", "dagster dev"} <= users, held  # the search finds what is there
    print(f"{len(environments)} environments read, {len(sampler.lines)} command lines in {sampler.samples} samples")
