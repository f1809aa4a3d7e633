"""A ``dg`` project as ``dg`` itself finds it: the nearest folder with a ``dg.toml``, or a ``pyproject.toml`` with a
``[tool.dg]`` table, whose ``directory_type`` is ``project``.

The CLI loads such a project's definitions as ``dg`` does (its ``[tool.dg.project] root_module`` and that
module's ``definitions`` module, or ``code_location_target_module``), and the group state's default SQLite file is
anchored to its root, so members under ``dg dev`` and a ``streamgroup status`` run from any folder of the
project read the same file. Reading the project's configuration imports nothing.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_TARGET_MODULE = "definitions"
"""``dg``'s default code location target: ``<root_module>.definitions``."""


class DgProjectError(ValueError):
    """The project's ``dg`` configuration cannot be read; the message names the file and the key."""


@dataclass(frozen=True)
class DgProject:
    """The parts of a ``dg`` project the CLI and the state's default location need."""

    root: Path
    config_file: Path
    root_module: str
    definitions_module: str

    @property
    def source_dir(self) -> Path:
        """Where ``root_module`` is importable from: ``src/`` in ``create-dagster``'s layout, else the root."""
        src = self.root / "src"
        return src if (src / self.root_module.split(".")[0]).is_dir() else self.root


def _dg_table(path: Path) -> Mapping[str, Any] | None:
    """The ``dg`` settings of ``path`` (a ``dg.toml``'s top level, a ``pyproject.toml``'s ``[tool.dg]``)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DgProjectError(f"{path}: not readable TOML ({exc})") from None
    if path.name == "dg.toml":
        return data
    table = data.get("tool", {}).get("dg")
    return table if isinstance(table, Mapping) else None


def find_dg_project(start: Path | None = None) -> DgProject | None:
    """The ``dg`` project holding ``start`` (default: the working directory), or None outside one.

    As in ``dg``, a ``dg.toml`` takes precedence over the ``pyproject.toml`` beside it, and the nearest
    configured folder decides: inside a workspace but outside its projects there is no project."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        for name in ("dg.toml", "pyproject.toml"):
            candidate = folder / name
            if not candidate.is_file():
                continue
            table = _dg_table(candidate)
            if table is None:
                continue
            if table.get("directory_type") != "project":
                return None
            return _project(folder, candidate, table)
    return None


def _project(root: Path, config_file: Path, table: Mapping[str, Any]) -> DgProject:
    where = "[project]" if config_file.name == "dg.toml" else "[tool.dg.project]"
    project = table.get("project")
    root_module = project.get("root_module") if isinstance(project, Mapping) else None
    if not isinstance(root_module, str) or not root_module:
        raise DgProjectError(f"{config_file}: {where} root_module is not set (the project's Python package)")
    target = project.get("code_location_target_module") if isinstance(project, Mapping) else None
    if target is not None and not isinstance(target, str):
        raise DgProjectError(f"{config_file}: {where} code_location_target_module is not a module name")
    return DgProject(
        root=root,
        config_file=config_file,
        root_module=root_module,
        definitions_module=target or f"{root_module}.{DEFAULT_TARGET_MODULE}",
    )


__all__ = ["DgProject", "DgProjectError", "find_dg_project"]
