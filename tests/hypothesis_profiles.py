"""The suite's verdict depends on the code, not on the draw: property tests run the same examples every time
(``suite``). Searching new ones is a run of its own, `HYPOTHESIS_PROFILE=explore .venv/bin/pytest tests/unit`,
and each failing example it finds is kept in its test as an ``@example``. Loaded by ``tests/conftest.py`` and by
the wheel test's copy of the unit tests."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("suite", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))
