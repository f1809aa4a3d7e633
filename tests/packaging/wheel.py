"""The wheel as a user gets it: built, checked, installed into a fresh virtualenv on a given Python, then used.

    .venv/bin/python -m tests.packaging.wheel [--python 3.12[,3.13]] [--resolution highest[,lowest-direct]]
        [--dagster VERSION] [--skip-missing] [--no-project] [--no-unit] [--keep]

``bash scripts/test_wheel.sh`` runs what CI runs (Python 3.12, the highest versions the ranges allow) and the
opt-in matrix (``--all``). Once per call: ``uv build --wheel``, its contents checked (the package and its
``py.typed``; no tests, benchmarks or example; the extras as extras), and the local Apache Kafka broker started
from this checkout's virtualenv (its fetched jars). Then for each (Python, resolution):

1. a fresh virtualenv with that Python (pyenv's or on PATH; never downloaded) and the wheel with its runtime
   dependencies only, resolved by ``uv pip install --resolution`` (``highest``: the newest releases the ranges
   allow, so the newest matching Dagster and dagster-pyspark patch releases; ``lowest-direct``: the floors of
   the ranges); ``--dagster VERSION`` overrides Dagster's release (to see the patches switch off on a release
   they were not verified on); nothing of the extras is installed, and ``streamgroup local v3io`` says which
   extra to install;
2. a new Dagster project made by ``create-dagster project`` of the same Dagster release, with a stream asset
   added (``tests/packaging/project_defs.py`` as ``defs/clicks.py``), installed into that virtualenv and
   validated by ``dagster definitions validate``;
3. the smoke test (``tests/packaging/smoke.py``, run by that virtualenv's Python outside the checkout): the new
   project's stream asset and the example's definitions (``definitions.py``, ``jobs/``, ``sensors/``, with the
   example's ``dagster.yaml`` as the instance) each ticked by a member sensor and materialized with Spark
   against the broker, every record read once and committed; the patches of Dagster's internals on for a
   verified Dagster release, otherwise off with one warning naming the release;
4. the unit tests (``tests/unit``, copied out of the checkout, those of the benchmarks left out: ``bench`` is
   not in the wheel) against the installed package, with the test tools' pinned releases added.

A Python this machine lacks fails the call, unless ``--skip-missing``: then its dependencies are only resolved
for it (both ends, manylinux x86-64, every package but PySpark as a wheel), which shows they install without a
compiler, and the summary names it. Prints one line per step and a summary; exits non-zero if anything failed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagster_streamgroup.dagster.devserver import wait_for
from dagster_streamgroup.local.kafka_broker import running_broker
from dagster_streamgroup.patches import VERIFIED_DAGSTER_VERSIONS

ROOT = Path(__file__).resolve().parents[2]
UV = ROOT / ".tools" / "uv" / "bin" / "uv"
PACKAGE = "dagster_streamgroup"
PROJECT = "streams_demo"
CI_PYTHON = "3.12"
"""The extra Python CI runs the wheel on (the project's own runs the whole suite)."""
SUPPORTED_PYTHONS = ("3.11", "3.12", "3.13", "3.14")
"""``requires-python``: PySpark 4.3 needs 3.11; Dagster 1.13 goes to 3.14."""
RESOLUTIONS = ("highest", "lowest-direct")
EXTRA_ONLY = ("uvicorn", "psycopg", "dagster_webserver", "dagster_postgres", "fastavro", "polars")
"""Modules only the extras bring: none may be in a runtime-only install."""
REPORTED = (
    "dagster",
    "dagster-pyspark",
    "pyspark",
    "pandas",
    "numpy",
    "pyarrow",
    "confluent-kafka",
    "sqlalchemy",
    "pydantic",
    "v3io",
)
TEST_TOOLS = ("pytest", "pytest-timeout", "hypothesis")
STEP_TIMEOUT_S = 600.0


class StepError(RuntimeError):
    """A step failed; the message says which and why (with the tail of its output)."""


CHECKOUT_ONLY_UNIT_TESTS = {"test_doc_links.py"}
"""Unit tests of the checkout, not of the package: the README's and docs/' links."""


def wheel_problems(wheel: Path) -> list[str]:
    """What is wrong with the wheel's contents and metadata (nothing: an empty list)."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata_name = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        metadata = archive.read(metadata_name).decode() if metadata_name else ""
        entry_points_name = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
        entry_points = archive.read(entry_points_name).decode() if entry_points_name else ""
    problems = [
        f"{required} is missing"
        for required in (f"{PACKAGE}/__init__.py", f"{PACKAGE}/py.typed", f"{PACKAGE}/patches/__init__.py")
        if required not in names
    ]
    problems += [
        f"{name} is not part of the package"
        for name in names
        if not name.startswith((f"{PACKAGE}/", f"{PACKAGE}-")) or "__pycache__" in name
    ]
    if not metadata:
        problems.append("no METADATA")
    if "Requires-Python: <3.15,>=3.11" not in metadata:
        problems.append("Requires-Python is not >=3.11,<3.15")
    for extra in ("local", "postgres", "formats"):
        if f"Provides-Extra: {extra}" not in metadata:
            problems.append(f"no extra {extra!r}")
    unconditional = [
        line.removeprefix("Requires-Dist: ").strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    extras_only = ("dagster-webserver", "dagster-dg-cli", "dagster-postgres", "psycopg", "uvicorn", "cryptography")
    for only_extra in (*extras_only, "starlette"):
        problems += [f"{req} is a runtime dependency" for req in unconditional if re.match(rf"{only_extra}\b", req)]
    pinned = [req for req in unconditional if "==" in req]
    problems += [f"{req} is pinned, not a range" for req in pinned]
    if "streamgroup = dagster_streamgroup.cli:main" not in entry_points:
        problems.append("no `streamgroup` console script")
    return problems


def find_python(version: str) -> str | None:
    """An interpreter of ``version`` on this machine: pyenv's, else ``pythonX.Y`` on PATH (never a download)."""
    pyenv = shutil.which("pyenv")
    if pyenv:
        done = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
        root = Path(done.stdout.strip()) if done.returncode == 0 else None
        if root is not None:
            found = sorted(root.glob(f"versions/{version}.*/bin/python{version}"))
            if found:
                return str(found[-1])
    found_on_path = shutil.which(f"python{version}")
    return found_on_path


def dev_pins(names: Sequence[str]) -> list[str]:
    """The dev group's pins of ``names`` from pyproject.toml (the releases the project's own suite runs on)."""
    group = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]["dev"]
    pins = [req for req in group if isinstance(req, str) and re.split(r"[=<>\[ ]", req, maxsplit=1)[0] in names]
    assert len(pins) == len(names), f"the dev group pins {pins}, expected {list(names)}"
    return pins


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what points at the checkout's virtualenv or Python path."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONHOME"}
    }
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env.update(extra)
    return env


def run(
    what: str, command: Sequence[str | Path], *, cwd: Path, env: Mapping[str, str], timeout_s: float = STEP_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            [str(c) for c in command],
            cwd=cwd,
            env=dict(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise StepError(f"{what}: not done within {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        lines = [line for line in (done.stdout + done.stderr).splitlines() if not line.startswith("%")]  # librdkafka
        tail = "\n".join(lines[-40:])
        raise StepError(f"{what}: exit {done.returncode}\n{tail}")
    return done


@dataclass
class Outcome:
    python: str
    resolution: str
    versions: dict[str, str] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)
    error: str | None = None
    resolved_only: bool = False
    """The Python is missing here: the dependencies were resolved for it, nothing was installed or run."""


def installed_versions(venv: Path, env: Mapping[str, str], work: Path) -> dict[str, str]:
    done = run("uv pip freeze", [UV, "pip", "freeze", "--python", venv / "bin" / "python"], cwd=work, env=env)
    pins = dict(line.split("==", 1) for line in done.stdout.splitlines() if "==" in line)
    return {name: pins.get(name, "-") for name in REPORTED}


def runtime_requirements(wheel: Path) -> list[str]:
    """The wheel's own dependencies (its ``Requires-Dist`` outside the extras). Given to the installer as direct
    requirements beside the wheel, so ``lowest-direct`` takes the floors of their ranges: for the wheel alone
    they would be transitive, and only the wheel itself would be "lowest"."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(name).decode()
    return [
        line.removeprefix("Requires-Dist: ").strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]


def make_venv(
    work: Path, python: str, resolution: str, wheel: Path, dagster: str | None, env: Mapping[str, str]
) -> Path:
    venv = work / "venv"
    run("uv venv", [UV, "venv", "--python", python, venv], cwd=work, env=env)
    requirements = work / "requirements.txt"
    requirements.write_text("".join(f"{req}\n" for req in runtime_requirements(wheel)))
    command: list[str | Path] = [UV, "pip", "install", "--python", venv / "bin" / "python"]
    command += ["--resolution", resolution, "--compile-bytecode", wheel, "-r", requirements]
    if dagster is not None:
        overrides = work / "overrides.txt"
        overrides.write_text(f"dagster=={dagster}\n")
        command += ["--override", overrides]
    run(f"uv pip install --resolution {resolution} the wheel", command, cwd=work, env=env)
    return venv


def resolve_only(work: Path, python: str, resolution: str, wheel: Path, env: Mapping[str, str]) -> dict[str, str]:
    """For a Python this machine lacks: the wheel's dependencies resolved for it (manylinux x86-64), with every
    package but PySpark (pure Python, published as a source archive only) as a wheel, so nothing would need a
    compiler there. Returns the reported packages' versions."""
    requirements = work / f"requirements-{python}.txt"
    requirements.write_text("".join(f"{req}\n" for req in runtime_requirements(wheel)))
    command: list[str | Path] = [UV, "pip", "compile", "--no-config", "--python-version", python]
    command += ["--python-platform", "x86_64-manylinux_2_28", "--resolution", resolution]
    command += ["--only-binary", ":all:", "--no-binary", "pyspark", requirements]
    done = run(f"resolving for Python {python}", command, cwd=work, env=env)
    pins = dict(line.split("==", 1) for line in done.stdout.splitlines() if "==" in line and not line.startswith("#"))
    return {name: pins.get(name, "-").strip() for name in REPORTED}


def check_runtime_only(venv: Path, work: Path, env: Mapping[str, str]) -> None:
    """Nothing of the extras is installed, and a command that needs one names it."""
    probe = f"import importlib.util as u; print([m for m in {EXTRA_ONLY!r} if u.find_spec(m)])"
    found = run("the extras' modules", [venv / "bin" / "python", "-c", probe], cwd=work, env=env).stdout.strip()
    if found != "[]":
        raise StepError(f"a runtime-only install has modules of the extras: {found}")
    done = subprocess.run(
        [str(venv / "bin" / "streamgroup"), "local", "v3io", "--data", str(work / "v3io")],
        cwd=work,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode == 0 or "pip install 'dagster-streamgroup[local]'" not in done.stdout + done.stderr:
        raise StepError(f"`streamgroup local v3io` without [local] did not name the extra: {done.stderr[-1000:]}")


def new_project(work: Path, venv: Path, dagster: str, env: Mapping[str, str]) -> Path:
    """``create-dagster project`` of the installed Dagster's release, a stream asset added, installed, validated."""
    python = venv / "bin" / "python"
    tool: list[str | Path] = [UV, "tool", "run", "--python", python, "--from", f"create-dagster=={dagster}"]
    tool.append("create-dagster")
    run(f"create-dagster=={dagster} project", [*tool, "project", PROJECT, "--no-uv-sync"], cwd=work, env=env)
    project = work / PROJECT
    shutil.copy(ROOT / "tests" / "packaging" / "project_defs.py", project / "src" / PROJECT / "defs" / "clicks.py")
    run(
        "installing the project",
        [UV, "pip", "install", "--python", python, "--no-deps", "-e", project],
        cwd=work,
        env=env,
    )
    validate: list[str | Path] = [venv / "bin" / "dagster", "definitions", "validate", "-m", f"{PROJECT}.definitions"]
    run("dagster definitions validate", validate, cwd=project, env=env, timeout_s=300)
    return project


def copy_example(work: Path) -> tuple[Path, Path]:
    """The example's definitions and its instance settings, outside the checkout: (definitions.py, DAGSTER_HOME)."""
    example, home = work / "example", work / "home"
    example.mkdir()
    home.mkdir()
    shutil.copy(ROOT / "definitions.py", example / "definitions.py")
    for package in ("jobs", "sensors"):
        shutil.copytree(ROOT / package, example / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "dagster.yaml", home / "dagster.yaml")
    return example / "definitions.py", home


def smoke(
    work: Path, venv: Path, bootstrap: str, targets: Sequence[str], home: Path, env: Mapping[str, str], tag: str
) -> dict[str, Any]:
    script = work / "smoke.py"
    shutil.copy(ROOT / "tests" / "packaging" / "smoke.py", script)
    python = venv / "bin" / "python"
    smoke_env = {
        **env,
        "DAGSTER_HOME": str(home),
        "PYSPARK_PYTHON": str(python),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "CLICKSTREAM_BOOTSTRAP": bootstrap,
        "CLICKSTREAM_TOPIC": f"example_{tag}",
        "CLICKSTREAM_GROUP": f"example_{tag}",
        "CLICKSTREAM_MEMBERS": "1",
        "CLICKSTREAM_PARTITIONS": "2",
        "CLICKSTREAM_MIN_BACKLOG": "1",
        "CLICKSTREAM_MAX_WAIT_S": "0",
        "CLICKSTREAM_SPARK_MASTER": "local[1]",
        "CLICKSTREAM_OUTPUT": str(work / "output"),
        "CLICKS_BOOTSTRAP": bootstrap,
        "CLICKS_TOPIC": f"clicks_{tag}",
    }
    command: list[str | Path] = [python, script, "--bootstrap", bootstrap]
    for target in targets:
        command += ["--target", target]
    done = run("the smoke test", command, cwd=work, env=smoke_env)
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(report["package"]).startswith(str(venv)):
        raise StepError(f"the smoke test imported {report['package']}, not the installed wheel")
    expected_parts = {
        "run_coordinator": "MemberRunCoordinator",
        "run_launcher": "ForkServerRunLauncher",
        "compute_log_manager": "ThreadMirroredComputeLogManager",
    }
    if report["instance"] != expected_parts:
        raise StepError(f"the example's instance loaded {report['instance']}, expected {expected_parts}")
    version = report["dagster"]
    warnings = done.stderr.count(f"Dagster {version} is not one of the releases")
    if version in VERIFIED_DAGSTER_VERSIONS:
        if not report["patches_enabled"] or report["schema_check_scripts"] != "ParsedScripts" or warnings:
            raise StepError(f"Dagster {version} is verified but the patches are off: {report}")
    elif report["patches_enabled"] or warnings != 1:
        raise StepError(f"Dagster {version} is not verified: patches on or not one warning ({warnings}): {report}")
    return report


NEWCOMER = "newcomer"
"""The dg project of the newcomer's path (beside PROJECT, made by the same create-dagster)."""
NEWCOMER_RECORDS = 300
DG_TIMEOUT_S = 480.0
CONSOLE_NOISE = (
    "Traceback",
    "SparkDeclarativePipelineScaffolder",  # dagster-spark's preview warning, which our dependencies bring
    "Using Spark's default log4j profile",
    "NativeCodeLoader",
    "[Stage ",  # Spark's console progress bars
    "ProgrammingError",
)
"""What a clean ``dg dev`` console, from start to a clean stop, does not show."""


def dg_newcomer(
    work: Path, venv: Path, wheel: Path, resolution: str, dagster: str, bootstrap: str, env: Mapping[str, str], tag: str
) -> str:
    """The path docs/dagster.md gives a newcomer: the wheel with ``[local]`` (which brings ``dg``), a project from
    ``create-dagster``, the group scaffolded (which writes the project's dagster.yaml: the run economy), ``dg check
    defs``, ``dg dev`` on a free port with DAGSTER_HOME unset until every record is committed and materialized (by
    runs forked by the fork-server launcher the scaffold configured), ``streamgroup status`` in the project (its
    members and committed offsets, no lag), then Ctrl-C: a clean exit, and a console without tracebacks or Spark's
    start-up noise. Returns a summary line."""
    from dagster_streamgroup.local.dg_project import KAFKA_COMPONENT, DgDev, create_project, set_attributes
    from dagster_streamgroup.local.kafka_data import create_topics, produce_sample

    python = venv / "bin" / "python"
    install: list[str | Path] = [UV, "pip", "install", "--python", python, "--resolution", resolution]
    run("installing the wheel's [local] extra (dg)", [*install, f"{wheel}[local]"], cwd=work, env=env)
    project = create_project(work, NEWCOMER, python, dagster, UV)
    group, topic = f"newcomer_{tag}", f"newcomer_{tag}"
    params = json.dumps({"group": group, "bootstrap_servers": bootstrap, "topics": [topic]})
    scaffolded = project.dg("scaffold", "defs", KAFKA_COMPONENT, "clicks", "--json-params", params)
    settings = project.root / "dagster.yaml"
    if f"Wrote {settings}" not in scaffolded or not settings.is_file():
        raise StepError(f"dg scaffold did not write the project's dagster.yaml:\n{scaffolded[-2000:]}")
    if ".streamgroup/" not in (project.root / ".gitignore").read_text().splitlines():
        raise StepError("dg scaffold did not add .streamgroup/ to the project's .gitignore")
    defs_yaml = project.defs / "clicks" / "defs.yaml"
    set_attributes(defs_yaml, {"default_status": "RUNNING", "members": "1", "master": "local[1]"})
    checked = project.dg("check", "defs")
    noisy = [n for n in ("SparkDeclarativePipelineScaffolder", "GETPID", "Traceback") if n in checked]
    if "All definitions loaded successfully." not in checked or noisy:
        raise StepError(f"dg check defs (noise: {noisy}):\n{checked[-3000:]}")

    create_topics(bootstrap, {topic: 2})
    ends = produce_sample(bootstrap, topic, 2, NEWCOMER_RECORDS)
    total = sum(ends.values())
    log = work / "dg-dev.log"
    with DgDev(project, log) as dev:
        dev.start()

        def done() -> list[dict[str, Any]] | None:
            materialized = dev.materializations("clicks")
            committed = sum(int(m.get("records") or 0) for m in materialized)
            return materialized if committed >= total else None

        try:
            materialized = wait_for(f"{total} records committed and materialized", done, DG_TIMEOUT_S)
        except TimeoutError as exc:
            raise StepError(f"dg dev: {exc}\n{log.read_text(errors='replace')[-3000:]}") from None
        runs = dev.runs()
        status = project.run(project.bin / "streamgroup", "status", "--group", group)
        exit_code = dev.stop()
    console = log.read_text(errors="replace")
    problems = [f"{noise!r} in its console" for noise in CONSOLE_NOISE if noise in console]
    if exit_code != 0:
        problems.append(f"dg dev exited with {exit_code} on SIGINT")
    failed = [r["runId"] for r in runs if r["status"] != "SUCCESS"]
    spawned = [
        r["runId"] for r in runs if json.loads(r["tags"].get("streamgroup/run_worker", "{}")).get("via") != "fork"
    ]
    if failed or spawned:
        problems.append(f"runs not SUCCESS: {failed}; not forked by the fork-server launcher: {spawned}")
    state = project.root / ".streamgroup" / "streamgroup-state.db"
    expected = [f"state: sqlite:///{state}", f"{group}_member_0", "total lag: 0 records"]
    expected += [f"{topic}:{partition}" for partition in ends]
    problems += [f"status lacks {text!r}" for text in expected if text not in status]
    rows = status_rows(status)
    problems += [
        f"status shows {topic}:{p} as {rows.get(f'{topic}:{p}')}, not committed = high = {end}, lag 0"
        for p, end in ends.items()
        if rows.get(f"{topic}:{p}", {}).get("committed") != str(end) or rows[f"{topic}:{p}"].get("lag") != "0"
    ]
    if problems:
        raise StepError("; ".join(problems) + f"\nstatus:\n{status}\nconsole tail:\n{console[-3000:]}")
    first = min(float(r["endTime"]) for r in runs if r["endTime"]) - (dev.started_at or 0.0)
    starts = sorted(float(r["startTime"]) - float(r["creationTime"]) for r in runs if r["startTime"])
    return (
        f"{len(materialized)} materializations of {total} records in {len(runs)} runs, the first done {first:.0f} s "
        f"after dg dev started, runs started {starts[len(starts) // 2]:.1f} s after creation (median); "
        "status showed the members and committed offsets; a clean stop"
    )


def status_rows(status: str) -> dict[str, dict[str, str]]:
    """The shards table of ``streamgroup status``: each shard's cells by column name."""
    lines = [line.replace("┃", "│") for line in status.splitlines() if "│" in line or "┃" in line]
    header = next((line for line in lines if "committed" in line and "shard" in line), None)
    if header is None:
        return {}
    names = [cell.strip() for cell in header.split("│")]
    rows = {}
    for line in lines[lines.index(header) + 1 :]:
        cells = [cell.strip() for cell in line.split("│")]
        if len(cells) == len(names):
            row = dict(zip(names, cells, strict=True))
            rows[row["shard"]] = row
    return rows


def unit_tests(work: Path, venv: Path, env: Mapping[str, str]) -> str:
    """The unit tests against the installed package (a copy outside the checkout), with the pinned test tools."""
    python = venv / "bin" / "python"
    run(
        "installing the test tools",
        [UV, "pip", "install", "--python", python, *dev_pins(TEST_TOOLS)],
        cwd=work,
        env=env,
    )
    tests = work / "unit" / "tests"
    (tests / "unit").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "__init__.py", tests / "__init__.py")
    shutil.copy(ROOT / "tests" / "hypothesis_profiles.py", tests / "hypothesis_profiles.py")
    (tests / "conftest.py").write_text("from tests import hypothesis_profiles  # noqa: F401\n")
    for source in sorted((ROOT / "tests" / "unit").glob("*.py")):
        if source.name in CHECKOUT_ONLY_UNIT_TESTS:
            continue
        if not re.search(r"^\s*(from|import) bench\b", source.read_text(), re.MULTILINE):
            shutil.copy(source, tests / "unit" / source.name)
    command: list[str | Path] = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "300"]
    command += ["-W", "ignore::pytest.PytestUnknownMarkWarning", "tests/unit"]
    done = run("the unit tests", command, cwd=work / "unit", env=env)
    return done.stdout.strip().splitlines()[-1]


@contextmanager
def work_dir(keep: bool, prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        if keep:
            print(f"wheel: kept {path}", flush=True)
        else:
            shutil.rmtree(path, ignore_errors=True)


def check_one(outcome: Outcome, interpreter: str, wheel: Path, bootstrap: str, args: argparse.Namespace) -> None:
    python, resolution = outcome.python, outcome.resolution
    tag = f"py{python.replace('.', '')}_{resolution.replace('-', '_')}_{int(time.time())}"
    with work_dir(args.keep, f"streamgroup-wheel-{tag}-") as work:
        env = clean_env()

        def step(name: str, started: float) -> None:
            outcome.steps.append(f"{name} {time.monotonic() - started:.0f} s")
            print(f"wheel: [{python} {resolution}] {name} ({time.monotonic() - started:.0f} s)", flush=True)

        started = time.monotonic()
        venv = make_venv(work, interpreter, resolution, wheel, args.dagster, env)
        outcome.versions = installed_versions(venv, env, work)
        step(f"installed {', '.join(f'{k} {v}' for k, v in outcome.versions.items())}", started)
        started = time.monotonic()
        check_runtime_only(venv, work, env)
        if args.dagster is None:  # an override is a conflict on purpose (dagster-pyspark pins its dagster)
            run("uv pip check", [UV, "pip", "check", "--python", venv / "bin" / "python"], cwd=work, env=env)
        step("runtime dependencies only; `streamgroup local v3io` names [local]", started)
        targets = []
        if not args.no_project:
            started = time.monotonic()
            new_project(work, venv, outcome.versions["dagster"], env)
            targets.append(f"module:{PROJECT}.definitions")
            step(f"create-dagster=={outcome.versions['dagster']} project with a stream asset, validated", started)
        started = time.monotonic()
        definitions, home = copy_example(work)
        targets.append(f"file:{definitions}")
        report = smoke(work, venv, bootstrap, targets, home, env, tag)
        records = ", ".join(f"{r['target'].split(':')[1].rsplit('/', 1)[-1]} {r['records']}" for r in report["results"])
        patches_state = "on" if report["patches_enabled"] else "off (one warning)"
        step(f"smoke: materialized and committed ({records} records); patches {patches_state}", started)
        if not args.no_unit:
            started = time.monotonic()
            step(f"unit tests: {unit_tests(work, venv, env)}", started)
        if not args.no_dg:
            started = time.monotonic()
            summary = dg_newcomer(work, venv, wheel, resolution, outcome.versions["dagster"], bootstrap, env, tag)
            step(f"dg: create-dagster project, dg scaffold defs, dg check defs, dg dev: {summary}", started)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=CI_PYTHON, help=f"comma-separated (default {CI_PYTHON})")
    parser.add_argument("--resolution", default="highest", help=f"comma-separated of {', '.join(RESOLUTIONS)}")
    parser.add_argument("--dagster", default=None, help="override Dagster's release (e.g. one not verified)")
    parser.add_argument("--skip-missing", action="store_true", help="only resolve for a missing Python")
    parser.add_argument("--no-project", action="store_true", help="leave out the create-dagster project")
    parser.add_argument("--no-unit", action="store_true", help="leave out the unit tests")
    parser.add_argument("--no-dg", action="store_true", help="leave out the dg project under dg dev")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    args = parser.parse_args(argv)
    pythons = [p.strip() for p in args.python.split(",") if p.strip()]
    resolutions = [r.strip() for r in args.resolution.split(",") if r.strip()]
    unknown = [p for p in pythons if p not in SUPPORTED_PYTHONS] + [r for r in resolutions if r not in RESOLUTIONS]
    if unknown:
        parser.error(f"not supported: {', '.join(unknown)}")
    found = {p: find_python(p) for p in pythons}
    lacking = [p for p, path in found.items() if path is None]
    if lacking and not args.skip_missing:
        print(
            f"wheel: this machine lacks Python {', '.join(lacking)} (pyenv install, or --skip-missing)", file=sys.stderr
        )
        return 1
    if lacking:
        print(f"wheel: this machine lacks Python {', '.join(lacking)}: resolved for it only", flush=True)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    with work_dir(args.keep, "streamgroup-wheel-build-") as build:
        run("uv build --wheel", [UV, "build", "--wheel", "--out-dir", build, ROOT], cwd=build, env=clean_env())
        wheel = next(build.glob("*.whl"))
        problems = wheel_problems(wheel)
        if problems:
            print("wheel: " + "; ".join(problems), file=sys.stderr)
            return 1
        print(f"wheel: built and checked {wheel.name} ({time.monotonic() - started:.0f} s)", flush=True)
        for python in lacking:
            for resolution in resolutions:
                outcome = Outcome(python, resolution, resolved_only=True)
                outcomes.append(outcome)
                try:
                    outcome.versions = resolve_only(build, python, resolution, wheel, clean_env())
                except StepError as exc:
                    outcome.error = str(exc)
                    print(f"wheel: [{python} {resolution}] FAILED: {exc}", file=sys.stderr, flush=True)
        available = [p for p in pythons if found[p] is not None]
        with running_broker() if available else nullcontext() as broker:
            for python in available:
                for resolution in resolutions:
                    outcome = Outcome(python, resolution)
                    outcomes.append(outcome)
                    interpreter = found[python]
                    assert interpreter is not None and broker is not None
                    try:
                        check_one(outcome, interpreter, wheel, broker.bootstrap, args)
                    except StepError as exc:
                        outcome.error = str(exc)
                        print(f"wheel: [{python} {resolution}] FAILED: {exc}", file=sys.stderr, flush=True)
    print(f"wheel: summary ({time.monotonic() - started:.0f} s)")
    for outcome in outcomes:
        status = "FAILED" if outcome.error else "passed"
        if outcome.resolved_only:
            status += " (Python missing here: resolved with wheels only, not installed or run)"
        versions = ", ".join(f"{k} {v}" for k, v in outcome.versions.items())
        print(f"  Python {outcome.python}, {outcome.resolution}: {status}; {versions}")
    return 1 if any(o.error for o in outcomes) or not outcomes else 0


if __name__ == "__main__":
    sys.exit(main())
