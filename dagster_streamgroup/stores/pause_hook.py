"""Test hook, off unless ``$STREAMGROUP_CHAOS_PAUSE_FILE`` is set: hold one state write between its load and its
``save_if``, so a test (the chaos run's ``store_writer_pause``, ``bench.chaos``) can let other writers move the
state on (and the logged SQL store fold it) under a writer that still holds an old version, and see that
writer's stale ``save_if`` refused.

No production process sets the variable. When it is set and names a file that exists, the first writer (of any
process) to rename that file to ``<file>.held.<pid>`` holds its write until the driver deletes the renamed file
(or ``HOLD_LIMIT_S`` passed, so a driver that died never stalls a writer for long), then appends one JSON line
to ``<file>.log``: the key, the token it loaded and whether its ``save_if`` was accepted. Any error of the hook
itself is ignored: it never fails a write."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

PAUSE_FILE_ENV = "STREAMGROUP_CHAOS_PAUSE_FILE"
HOLD_LIMIT_S = 60.0


def hold(key: str, token: str | None) -> Path | None:
    """Hold this write if the pause file exists and this writer claims it first; the claim, or None."""
    named = os.environ.get(PAUSE_FILE_ENV)
    if not named:
        return None
    claim = Path(f"{named}.held.{os.getpid()}")
    try:
        os.rename(named, claim)  # atomic: one writer among every process claims the pause
        claim.write_text(json.dumps({"pid": os.getpid(), "key": key, "token": token}))
    except OSError:
        return None
    deadline = time.monotonic() + HOLD_LIMIT_S
    while claim.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return claim


def report(claim: Path, key: str, token: str | None, saved: bool) -> None:
    """Record how the held write's ``save_if`` ended, for the test that held it."""
    line = json.dumps({"pid": os.getpid(), "key": key, "token": token, "saved": saved, "at": time.time()})
    try:
        claim.unlink(missing_ok=True)
        with open(f"{os.environ.get(PAUSE_FILE_ENV, claim)}.log", "a") as log:
            log.write(line + "\n")
    except OSError:
        pass
