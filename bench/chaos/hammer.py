"""A process that hammers the group state with compare-and-set writes that change nothing but the revision.

``python -m bench.chaos.hammer --seconds S`` (store URL in ``$CHAOS_STORE_URL``, state key in
``$CHAOS_STATE_KEY``: a password never goes on a command line). Every write goes through
``member.update_state``, the members' own CAS loop, so each one conflicts with member ticks, commits and
failure reports the way a busy peer's would. Prints one JSON line: writes, conflicts, gave-up loops, errors.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from dagster_streamgroup.member import ContentionError, update_state
from dagster_streamgroup.protocol import GroupState
from dagster_streamgroup.stores.base import StoreUnavailableError
from dagster_streamgroup.stores.factory import open_store


def no_op(current: GroupState | None, _now: float) -> tuple[GroupState | None, bool]:
    """The same state as a new object, so ``update_state`` writes it (a new revision, nothing else)."""
    if current is None:
        return None, False
    return current.model_copy(), True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    store = open_store(os.environ["CHAOS_STORE_URL"], field="CHAOS_STORE_URL")
    key = os.environ["CHAOS_STATE_KEY"]
    writes = conflicts = gave_up = errors = 0
    deadline = time.monotonic() + args.seconds
    try:
        while time.monotonic() < deadline:
            try:
                wrote, stats = update_state(store, key, no_op, max_attempts=3, backoff_cap_s=0.05)
            except ContentionError:
                gave_up += 1
                continue
            except StoreUnavailableError:
                errors += 1
                time.sleep(0.5)
                continue
            writes += int(wrote)
            conflicts += stats.conflicts
    finally:
        store.close()
    print(json.dumps({"writes": writes, "conflicts": conflicts, "gave_up": gave_up, "errors": errors}), flush=True)


if __name__ == "__main__":
    main()
