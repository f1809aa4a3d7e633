"""When a chaos run injects its faults: after each chunk of records, and again later for a fault that found
nothing to act on.

A fault that needs a run in flight (to kill, pause or hold) or a launch (to refuse) finds none when the stream is
quiet at its moment: the records of the chunk before it were all processed already, on a fast machine, or no
member launched during an outage. Counting that as a missed fault would fail the run for bad timing. So the fault
is given another moment: it is tried again after the next chunk, and once the planned chunks are all produced,
after a chunk of records of its own, up to ``MAX_TRIES`` tries in all; only then is it missed, and the run red:
a red chaos run always means a broken guarantee or a fault that could not land at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

MAX_TRIES = 4
"""Moments a fault gets before it counts as missed."""


def inject_planned(
    kinds: Sequence[str],
    sizes: Sequence[int],
    *,
    produce: Callable[[int], None],
    inject: Callable[[str, bool], bool],
    wait: Callable[[], None],
    in_time: Callable[[], bool],
    max_tries: int = MAX_TRIES,
) -> list[str]:
    """Produce ``sizes[i]`` records, then inject ``kinds[i]`` (after ``wait``), with the faults waiting for
    another moment first; the last size is produced after the last fault. ``inject(kind, final)`` is True once
    the fault is over, False when it found nothing to act on and may be tried again. Returns the faults never
    injected because ``in_time`` said the budget was spent."""
    if len(sizes) != len(kinds) + 1:
        raise ValueError(f"{len(kinds)} faults need {len(kinds) + 1} chunks, got {len(sizes)}")
    waiting: list[tuple[str, int]] = []
    skipped: list[str] = []

    def moment(queue: list[tuple[str, int]]) -> list[tuple[str, int]]:
        again = []
        for kind, tries in queue:
            if not in_time():
                skipped.append(kind)
                continue
            wait()
            if not inject(kind, tries + 1 >= max_tries):
                again.append((kind, tries + 1))
        return again

    for kind, size in zip(kinds, sizes, strict=False):
        produce(size)
        waiting = moment([*waiting, (kind, 0)])
    produce(sizes[-1])
    while waiting:  # a chunk of records of its own for each fault still waiting, until it lands or is missed
        produce(max(1, sizes[-1]))
        waiting = moment(waiting[:1]) + waiting[1:]
    return skipped
