"""The upgrade dry run in Chromium (issue 38): from a deployment's page, its "Upgrade dry
run" button (the active deployment chosen) opens the report, a table of the in-flight
executions pinned to it: each linked to its page, clean or nondeterministic with the
message the engine would record, and the totals; every column in view at 1366×768 and
1920×1080 (screenshots ``var/screenshots/upgrade-dry-run-*.png``,
``deployment-upgrade-*.png``). And what the upgrade leaves behind, as an operator sees it:
the nondeterministic execution, still pinned to the old code while a live cluster serves
the new one, is "not served" on the dashboard and on its page, whose backtrace shows the
stored source lines of a workflow of the new deployment (``dashboard-not-served-*.png``,
``execution-not-served-*.png``)."""

from __future__ import annotations

import re

import pytest
from django.utils import timezone

from executions import store
from executions.events import Ok
from tests.support import browser as support
from tests.support import deployments as scenarios
from tests.support import workflow_runs
from tests.support.browser import log_in, screenshot

page = support.page

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def upgrade(transactional_db, tmp_path, monkeypatch):
    support.make_admin()
    sample = scenarios.sample_code(tmp_path, monkeypatch)
    to_id = scenarios.create_deployment(sample)
    scenario = scenarios.upgrade_scenario(sample, to_id)
    store.activate_deployment(to_id)
    scenarios.other_deployment("t5_unrelated")
    yield scenario
    scenarios.forget(sample)


def columns_in_view(page) -> bool:
    return page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_the_dry_run_button_opens_the_report_table(page, upgrade):
    log_in(page)
    page.goto(f"{page.live_server_url}/admin/obelisk_deployments/deployment/{upgrade.from_id}/change/")
    select = page.locator("#obelisk-upgrade-to")
    assert select.input_value() == upgrade.to_id  # the active one
    assert select.locator("option").count() == 1  # the unrelated deployment is not offered
    screenshot(page, "deployment-upgrade")
    page.click("#obelisk-upgrade-dry-run")
    page.wait_for_selector("#obelisk-upgrade-table")
    assert re.search(rf"/deployment/{upgrade.from_id}/upgrade-dry-run/\?to={upgrade.to_id}$", page.url), page.url

    assert page.inner_text("#obelisk-upgrade-totals").startswith("3 clean, 1 nondeterministic of 4")
    rows = page.locator("#obelisk-upgrade-table tbody tr")
    assert rows.count() == 4
    verdicts = {
        rows.nth(i).get_attribute("data-execution"): rows.nth(i).locator("td").nth(4).inner_text()
        for i in range(rows.count())
    }
    assert verdicts == {
        **{execution_id: "clean" for execution_id in upgrade.clean},
        **{execution_id: "nondeterministic" for execution_id in upgrade.nondeterministic},
    }
    (bad,) = upgrade.nondeterministic
    bad_row = page.locator(f'tr[data-execution="{bad}"]')
    assert "key does not match event stored at version 2" in bad_row.locator("pre.obelisk-message").inner_text()
    assert bad_row.locator("td").nth(1).inner_text() == upgrade.sample.ffqn("welcome")
    assert bad_row.locator("td").nth(2).inner_text() == upgrade.sample.workflow_component
    screenshot(page, "upgrade-dry-run")
    for size in ((1366, 768), (1920, 1080)):
        page.set_viewport_size({"width": size[0], "height": size[1]})
        assert columns_in_view(page), (size, page.evaluate("document.documentElement.scrollWidth"))

    bad_row.locator("td.obelisk-id a").click()
    page.wait_for_selector("#obelisk-execution")
    assert page.url.endswith(f"/executionstate/{bad}/change/"), page.url


def test_an_execution_left_on_code_no_worker_serves_shows_on_the_dashboard_and_its_page(page, upgrade):
    """The nondeterministic workflow's child finishes: it is due again, on code no live
    cluster serves (one serves the new deployment), and it waits, visibly."""
    (bad,) = upgrade.nondeterministic
    (child,) = workflow_runs.children_of(bad)
    workflow_runs.finish_child(child, Ok(3))
    old_workflow = store.get_state(bad).component_id_input_digest
    now = timezone.now()
    store.record_heartbeat(
        "web-1:4242:01JSERVES", hostname="web-1", pid=4242, started_at=now, processes=2, running=0,
        functions=[upgrade.sample.ffqn("welcome")], deployment_id=upgrade.to_id,
    )  # fmt: skip
    log_in(page)
    card = page.locator('#obelisk-live [data-count="not-served"]')
    assert card.locator(".n").inner_text() == "2"  # it, and the pending activity of the old deployment
    assert page.locator(f'#obelisk-not-served tr[data-digest="{old_workflow}"] td').nth(1).inner_text() == "1"
    screenshot(page, "dashboard-not-served")
    page.goto(f"{page.live_server_url}/admin/obelisk_executions/executionstate/{bad}/change/")
    banner = page.locator("#obelisk-waiting-for")
    assert banner.inner_text() == f"waiting for component {old_workflow} (not served)"
    screenshot(page, "execution-not-served")
