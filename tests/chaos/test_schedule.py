"""When the chaos run injects its faults (``bench.chaos.schedule``): a fault that finds nothing to act on gets
another moment, after more records, instead of failing the run; it is missed only once none of its moments had
anything for it. Pure: the deployment is replaced by a record of what was produced and injected."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from bench.chaos.schedule import MAX_TRIES, inject_planned


class World:
    """Faults land at a moment unless the moment is quiet (``quiet[kind]`` moments for that kind first)."""

    def __init__(self, quiet: dict[str, int]) -> None:
        self.quiet = dict(quiet)
        self.events: list[tuple[str, object]] = []
        self.ended = 0

    def produce(self, size: int) -> None:
        self.events.append(("produce", size))

    def inject(self, kind: str, final: bool) -> bool:
        self.events.append(("inject", (kind, final)))
        over = True
        if self.quiet.get(kind, 0) > 0:
            self.quiet[kind] -= 1
            over = final  # nothing to act on: over only when it was the last chance (then: missed)
        self.ended += over
        return over

    def injected(self) -> list[tuple[str, bool]]:
        return [e[1] for e in self.events if e[0] == "inject"]  # type: ignore[misc]


def run(kinds: list[str], quiet: dict[str, int], in_time: bool = True) -> tuple[World, list[str]]:
    world = World(quiet)
    skipped = inject_planned(
        kinds,
        [10] * (len(kinds) + 1),
        produce=world.produce,
        inject=world.inject,
        wait=lambda: None,
        in_time=lambda: in_time,
    )
    return world, skipped


def test_a_fault_that_found_no_run_is_tried_again_after_the_next_chunk_instead_of_missed() -> None:
    """The case of the issue: ``run_kill_before_commit`` and ``launcher_outage`` found no run to act on."""
    world, skipped = run(
        ["run_kill_before_commit", "daemon_restart", "launcher_outage"],
        {"run_kill_before_commit": 1, "launcher_outage": 2},
    )
    assert not skipped
    assert world.events[:4] == [
        ("produce", 10),
        ("inject", ("run_kill_before_commit", False)),
        ("produce", 10),
        ("inject", ("run_kill_before_commit", False)),  # its second moment, first after the next chunk
    ]
    landed = [kind for kind, _ in world.injected()]
    assert landed.count("run_kill_before_commit") == 2 and landed.count("launcher_outage") == 3
    assert all(not final for _, final in world.injected()), "each landed before its last chance"
    produced = sum(size for name, size in world.events if name == "produce")  # type: ignore[misc]
    assert produced == 60, "the 4 planned chunks, and 2 of its own for the fault still waiting at the end"


def test_a_fault_that_never_finds_anything_is_missed_at_its_last_moment() -> None:
    world, _ = run(["run_pause"], {"run_pause": 99})
    assert world.injected() == [("run_pause", False)] * (MAX_TRIES - 1) + [("run_pause", True)]


def test_out_of_time_faults_are_reported_skipped() -> None:
    world, skipped = run(["run_pause", "poison"], {}, in_time=False)
    assert skipped == ["run_pause", "poison"] and not world.injected()


@given(
    kinds=st.lists(st.sampled_from(["a", "b", "c"]), max_size=8),
    quiet=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 6)),
)
def test_every_fault_ends_landed_or_missed_at_its_last_chance(kinds: list[str], quiet: dict[str, int]) -> None:
    world, skipped = run(kinds, quiet)
    assert not skipped
    assert world.ended == len(kinds), "each planned fault ends once: landed, or missed at its last chance"
    assert len(world.injected()) <= MAX_TRIES * len(kinds)
    produced = [e for e in world.events if e[0] == "produce"]
    assert len(produced) >= len(kinds) + 1, "every planned chunk is produced"
