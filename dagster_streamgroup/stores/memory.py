"""An in-process store with a settable clock: for unit tests and the simulator, not for production."""

from __future__ import annotations

import threading
from collections.abc import Callable

from dagster_streamgroup.protocol.codec import decode_state, encode_state
from dagster_streamgroup.protocol.state import GroupState
from dagster_streamgroup.stores.base import StateToken
from dagster_streamgroup.stores.ranges import MemoryRangeIndex


class MemoryStore(MemoryRangeIndex):
    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self._clock = clock
        self._lock = threading.Lock()
        self._items: dict[str, tuple[str, int]] = {}

    def load(self, key: str) -> tuple[GroupState | None, StateToken | None]:
        with self._lock:
            item = self._items.get(key)
        if item is None:
            return None, None
        text, version = item
        return decode_state(text, where=f"memory:{key}"), str(version)

    def save_if(self, key: str, state: GroupState, token: StateToken | None) -> bool:
        text = encode_state(state)
        with self._lock:
            current = self._items.get(key)
            if token is None:
                if current is not None:
                    return False
                self._items[key] = (text, 1)
                return True
            if current is None or str(current[1]) != token:
                return False
            self._items[key] = (text, current[1] + 1)
            return True

    def now(self) -> float:
        return self._clock()

    def close(self) -> None:
        pass
