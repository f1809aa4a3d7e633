"""The ``Definitions`` of a code location, found as Dagster's own tools find them, for the ``streamgroup`` CLI.

A ``--definitions`` file (``dagster dev -f``'s way: the example's ``definitions.py``), or a ``dg`` project
(``create-dagster``'s layout: ``[tool.dg.project] root_module``, whose ``definitions`` module holds a
``@dg.definitions`` function that loads the ``defs/`` folder), as ``dg`` finds it from the working directory.
A module's definitions are what Dagster's loader takes: one ``@dg.definitions`` function, else one ``Definitions``
object. When nothing is found, the error lists every place tried and why each failed.
"""

from __future__ import annotations

import importlib
import runpy
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dagster as dg
from dagster.components.definitions import LazyDefinitions

from dagster_streamgroup.dagster.project import DgProject, DgProjectError, find_dg_project

DEFAULT_FILE = Path("definitions.py")


class DefinitionsNotFoundError(Exception):
    """No code location's ``Definitions`` could be loaded; the message lists what was tried."""


@dataclass(frozen=True)
class LoadedDefinitions:
    definitions: dg.Definitions
    source: str
    """Where they came from, for messages: a file, or a project's module."""
    project: DgProject | None
    """The ``dg`` project they belong to, if any (its root anchors the group state's default file)."""


def load_definitions(path: Path | None = None) -> LoadedDefinitions:
    """``path``: a definitions file or a ``dg`` project's folder; None: the ``dg`` project holding the working
    directory, else ``./definitions.py``."""
    if path is not None:
        return _load_given(path)
    tried: list[str] = []
    try:
        project = find_dg_project()
    except DgProjectError as exc:
        project = None
        tried.append(str(exc))
    if project is not None:
        try:
            return _load_project(project)
        except DefinitionsNotFoundError as exc:
            tried.append(str(exc))
    elif not tried:
        tried.append(f"a dg project: none holds {Path.cwd()} (no dg.toml, nor pyproject.toml with [tool.dg], above it)")
    if DEFAULT_FILE.is_file():
        try:
            return _load_file(DEFAULT_FILE)
        except DefinitionsNotFoundError as exc:
            tried.append(str(exc))
    else:
        tried.append(f"{DEFAULT_FILE.resolve()}: does not exist")
    raise DefinitionsNotFoundError(_tried_message(tried))


def _tried_message(tried: list[str]) -> str:
    lines = "\n".join(f"  - {t}" for t in tried)
    return (
        f"--definitions: no Definitions found; tried:\n{lines}\n"
        "Run it in a dg project's folder (as `dg dev`), or give --definitions PATH: a definitions file, or a dg "
        "project's folder."
    )


def _load_given(path: Path) -> LoadedDefinitions:
    if path.is_dir():
        try:
            project = find_dg_project(path)
        except DgProjectError as exc:
            raise DefinitionsNotFoundError(_tried_message([str(exc)])) from None
        if project is None or project.root != path.resolve():
            reason = f"{path}: a folder, and not a dg project's root (no dg.toml, nor pyproject.toml with [tool.dg])"
            raise DefinitionsNotFoundError(_tried_message([reason]))
        try:
            return _load_project(project)
        except DefinitionsNotFoundError as exc:
            raise DefinitionsNotFoundError(_tried_message([str(exc)])) from None
    if not path.is_file():
        raise DefinitionsNotFoundError(_tried_message([f"{path}: does not exist"]))
    try:
        project = find_dg_project(path.parent)
    except DgProjectError:
        project = None
    try:
        if project is not None and _module_file(project, project.definitions_module) == path.resolve():
            return _load_project(project)  # a dg project's definitions module imports its defs as a package
        return _load_file(path)
    except DefinitionsNotFoundError as exc:
        raise DefinitionsNotFoundError(_tried_message([str(exc)])) from None


def _module_file(project: DgProject, module: str) -> Path:
    base = project.source_dir.joinpath(*module.split("."))
    package = base / "__init__.py"
    return (package if package.is_file() else base.with_suffix(".py")).resolve()


def _load_project(project: DgProject) -> LoadedDefinitions:
    """As ``dg`` loads it: the project's source folder importable, its definitions module imported."""
    where = f"the dg project at {project.root} ({project.config_file.name}), module {project.definitions_module}"
    source = str(project.source_dir)
    if source not in sys.path:
        sys.path.insert(0, source)
    try:
        module = importlib.import_module(project.definitions_module)
    except Exception as exc:  # the user's code: whatever it raises is reported, with its kind
        raise DefinitionsNotFoundError(f"{where}: importing it failed ({type(exc).__name__}: {exc})") from None
    definitions = _definitions_in(vars(module), where)
    return LoadedDefinitions(definitions, f"{project.definitions_module} ({project.root})", project)


def _load_file(path: Path) -> LoadedDefinitions:
    # As `dagster dev -f` does: the file's own directory is importable, for the project's packages beside it.
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)
    try:
        namespace = runpy.run_path(str(path), run_name="__streamgroup_cli__")
    except Exception as exc:  # the user's code
        raise DefinitionsNotFoundError(f"{path}: running it failed ({type(exc).__name__}: {exc})") from None
    return LoadedDefinitions(_definitions_in(namespace, str(path)), str(path), None)


def _definitions_in(namespace: dict[str, Any], where: str) -> dg.Definitions:
    """Dagster's rule: one ``@dg.definitions`` function (called), else one ``Definitions`` object."""
    values = list(namespace.values())
    lazy = [v for v in values if isinstance(v, LazyDefinitions)]
    objects = [v for v in values if isinstance(v, dg.Definitions)]
    if len(lazy) > 1 or (not lazy and len(objects) > 1):
        kind = "@dg.definitions functions" if len(lazy) > 1 else "Definitions objects"
        raise DefinitionsNotFoundError(f"{where}: {len(lazy) if lazy else len(objects)} {kind}, Dagster loads one")
    if lazy:
        try:
            loaded = lazy[0]()
        except Exception as exc:  # the user's code
            raise DefinitionsNotFoundError(
                f"{where}: its @dg.definitions function failed ({type(exc).__name__}: {exc})"
            ) from None
        if not isinstance(loaded, dg.Definitions):
            raise DefinitionsNotFoundError(f"{where}: its @dg.definitions function returned {type(loaded).__name__}")
        return loaded
    if not objects:
        raise DefinitionsNotFoundError(f"{where}: neither a @dg.definitions function nor a Definitions object")
    return objects[0]


__all__ = ["DefinitionsNotFoundError", "LoadedDefinitions", "load_definitions"]
