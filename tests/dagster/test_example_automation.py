"""The example's downstream refresh (``jobs/clickstream.py``'s ``VIEWS_AUTOMATION``) evaluated by Dagster's own
automation-condition evaluator on a real (ephemeral) instance: clicks that land while a refresh runs are followed by
another refresh. With ``since_last_handled`` the refresh's own materialization ended the wait for them, and the
views stayed behind the clicks until more landed (the e2e smoke test timed out on it under load)."""

from __future__ import annotations

import time

import dagster as dg
import pytest

from jobs.clickstream import VIEWS_AUTOMATION


@pytest.fixture
def assets() -> list[dg.AssetsDefinition]:
    @dg.asset(name="clicks")
    def clicks() -> None: ...

    @dg.asset(name="page_views_per_minute", deps=["clicks"], automation_condition=VIEWS_AUTOMATION)
    def views() -> None: ...

    return [clicks, views]


class Ticks:
    """The automation daemon's ticks over one instance, each continuing from the previous one's cursor."""

    def __init__(self, assets: list[dg.AssetsDefinition]) -> None:
        self.assets = assets
        self.instance = dg.DagsterInstance.ephemeral()
        self.cursor = dg.evaluate_automation_conditions(defs=assets, instance=self.instance).cursor

    def tick(self) -> int:
        result = dg.evaluate_automation_conditions(defs=self.assets, instance=self.instance, cursor=self.cursor)
        self.cursor = result.cursor
        return result.get_num_requested(dg.AssetKey("page_views_per_minute"))

    def materialized(self, asset: str) -> None:
        time.sleep(0.01)  # the events' timestamps are what the condition compares with the tick's time
        self.instance.report_runless_asset_event(dg.AssetMaterialization(asset))
        time.sleep(0.01)


def test_clicks_that_land_while_a_refresh_runs_get_a_refresh_of_their_own(assets: list[dg.AssetsDefinition]) -> None:
    ticks = Ticks(assets)
    assert ticks.tick() == 0, "nothing landed yet"
    ticks.materialized("clicks")
    assert ticks.tick() == 1, "clicks landed: a refresh"
    ticks.materialized("clicks")  # lands after the refresh read the table...
    ticks.materialized("page_views_per_minute")  # ...which then ends without it
    assert ticks.tick() == 1, "the clicks the refresh did not see get a refresh"
    ticks.materialized("page_views_per_minute")
    assert ticks.tick() == 0 and ticks.tick() == 0, "and nothing more once it is done"


def test_one_landing_is_one_refresh(assets: list[dg.AssetsDefinition]) -> None:
    ticks = Ticks(assets)
    ticks.materialized("clicks")
    ticks.materialized("clicks")
    assert ticks.tick() == 1
    ticks.materialized("page_views_per_minute")
    assert [ticks.tick() for _ in range(3)] == [0, 0, 0], "the refresh saw every click that landed before it"
