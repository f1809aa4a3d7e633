"""The directory a code location's runs run in, and code files that cannot be found from this launcher.

Dagster's default launcher has the code server start each run, so a run works in the server's directory: a
location served with a relative ``-f definitions.py``, or code that opens relative paths, relies on that. The
server's directory is not in a run's origin, but the code pointer's ``working_directory`` is, and Dagster sets
it to the directory the server was started in unless ``-d`` names another. So forked and spawned run workers run
there, and a relative code file that is not found there (a server started elsewhere with ``-d``) is left to the
code server to start.
"""

from __future__ import annotations

import os

from dagster._core.code_pointer import FileCodePointer
from dagster._core.origin import RepositoryPythonOrigin


def code_directory(origin: RepositoryPythonOrigin) -> str | None:
    """The code pointer's working directory, where it is a directory on this host."""
    directory = getattr(origin.code_pointer, "working_directory", None)
    if isinstance(directory, str) and directory and os.path.isdir(directory):
        return os.path.abspath(directory)
    return None


def unreachable_code_file(origin: RepositoryPythonOrigin) -> str | None:
    """Why a run worker started here could not find the location's code file, or None if it can."""
    pointer = origin.code_pointer
    if not isinstance(pointer, FileCodePointer) or os.path.isabs(pointer.python_file):
        return None
    base = code_directory(origin) or os.getcwd()
    if os.path.isfile(os.path.join(base, pointer.python_file)):
        return None
    return (
        f"its code file {pointer.python_file!r} is a relative path that is not in the code location's working "
        f"directory {base}"
    )
