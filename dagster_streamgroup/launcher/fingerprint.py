"""What a fork server has loaded, so a changed file or an installed package retires it.

A fork server's children run the code it imported at its start. The default launcher's run process imports
the code on disk at launch instead, so a server whose files changed since must not fork again. The fingerprint
holds a stamp of every module file outside the installed environment (the code location and editable
installs) and of each site-packages directory (which changes when a package is installed, upgraded or
removed). Checking it is a ``stat`` per file: well under a millisecond for a few hundred files.
"""

from __future__ import annotations

import os
import site
import sys
from collections.abc import Iterable
from types import ModuleType

from pydantic import BaseModel, ConfigDict


class FileStamp(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    mtime_ns: int
    size: int
    inode: int


class Fingerprint(BaseModel):
    model_config = ConfigDict(frozen=True)

    stamps: tuple[FileStamp, ...] = ()

    def changed(self) -> list[str]:
        """The paths whose file changed, appeared or disappeared since the stamps were taken."""
        return [s.path for s in self.stamps if stamp(s.path) != s]

    def distrusting(self, modified_since_ns: int) -> Fingerprint:
        """Files modified after ``modified_since_ns`` may have changed between their import and their stamp:
        their stamps are voided, so they count as changed."""
        return Fingerprint(
            stamps=tuple(
                s if s.mtime_ns < modified_since_ns else FileStamp(path=s.path, mtime_ns=-2, size=-2, inode=-2)
                for s in self.stamps
            )
        )


def stamp(path: str) -> FileStamp:
    try:
        st = os.stat(path)
    except OSError:
        return FileStamp(path=path, mtime_ns=-1, size=-1, inode=-1)
    return FileStamp(path=path, mtime_ns=st.st_mtime_ns, size=st.st_size, inode=st.st_ino)


def installed_roots() -> tuple[str, ...]:
    """Directories of the interpreter and installed packages: their files change only by an install."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()}
    user_site = site.getusersitepackages()
    if isinstance(user_site, str):
        roots.add(user_site)
    return tuple(sorted(os.path.join(os.path.realpath(r), "") for r in roots if r))


def source_files(modules: Iterable[ModuleType], roots: tuple[str, ...]) -> list[str]:
    """Files of ``modules`` that lie outside ``roots``: the user's code and editable installs."""
    files = set()
    for module in modules:
        path = getattr(module, "__file__", None)
        if not isinstance(path, str):
            continue
        real = os.path.realpath(path)
        if not real.startswith(roots):
            files.add(real)
    return sorted(files)


def take(modules: Iterable[ModuleType], extra_files: Iterable[str] = ()) -> Fingerprint:
    """Stamp the loaded user code, ``extra_files`` (a file that failed to import is in no module yet), and
    each site-packages directory."""
    paths = set(source_files(modules, installed_roots()))
    paths.update(os.path.realpath(p) for p in extra_files)
    paths.update(os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p))
    return Fingerprint(stamps=tuple(stamp(p) for p in sorted(paths)))
