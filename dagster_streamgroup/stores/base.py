"""The one interface every state store implements: load, save-if-unchanged, create-if-absent, and a clock.

Implementations: ``sql`` (SQLite file by default, PostgreSQL for members on many hosts) and ``v3io``
(a KV item next to the stream, mtime-conditioned as v3io-go does). ``memory`` serves tests and simulation.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from dagster_streamgroup.protocol.codec import ForeignStateError
from dagster_streamgroup.protocol.state import GroupState


class StoreUnavailableError(RuntimeError):
    """The store could not be reached or used; the message names it with any password hidden."""


class StoreConfigError(ValueError):
    """The store URL or options are invalid; the message says which part and why."""


class StateDamagedError(ForeignStateError):
    """Part of a stored state is missing or unreadable (an item or row deleted or overwritten by hand): reading on
    would roll the group back to an older state, so the store refuses, naming what is damaged and what to do. A
    kind of ``ForeignStateError``: like a foreign object, it is never overwritten."""


def reason(exc: Exception) -> str:
    """What a codec error says, without the location it starts with (the damage message names it once)."""
    text = str(exc)
    _where, sep, rest = text.partition("): ")
    if sep and "key " in _where:
        return rest
    _where, sep, rest = text.partition("': ")
    return rest if sep and "key " in _where else text


StateToken = str
"""Opaque CAS version of a stored state (an integer counter, an mtime pair, ...)."""


@runtime_checkable
class StateStore(Protocol):
    def load(self, key: str) -> tuple[GroupState | None, StateToken | None]:
        """The state stored under ``key`` and its version, or ``(None, None)`` when absent.

        Raises ``StateFormatError`` for an object that is foreign or of a newer schema."""
        ...

    def save_if(self, key: str, state: GroupState, token: StateToken | None) -> bool:
        """Write ``state`` only if the stored version is still ``token``; ``None`` means create-if-absent.

        Returns False on a conflict (someone else wrote first). Never overwrites a foreign object."""
        ...

    def now(self) -> float:
        """The store's clock in seconds, so heartbeats never compare two hosts' wall clocks."""
        ...

    def close(self) -> None: ...


def state_key(stream: str, group: str) -> str:
    """The key of a group's state: one state per (stream, group)."""
    return f"{stream}|{group}"
