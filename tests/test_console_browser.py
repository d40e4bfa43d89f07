"""The operator console in a real browser (Debian's Chromium through Playwright) on
pytest-django's live server: what an operator does, step by step. Screenshots of the list
and the execution page at 1366×768 and 1920×1080 land in ``var/screenshots/``.

Few tests on purpose (each costs seconds); the console's rules are checked without a
browser in ``test_console.py``."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote

from executions import store
from executions.models import AuditEntry
from tests import browser_support as support
from tests.browser_support import log_in, screenshot

page = support.page

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/admin/obelisk_executions/executionstate/"


@pytest.fixture
def scenario(transactional_db):
    support.make_admin()
    return support.make_scenario()


def open_execution(page, execution_id: str, query: str = "") -> None:
    page.goto(f"{page.live_server_url}{LIST}{quote(execution_id)}/change/{query}")
    page.wait_for_selector("#obelisk-execution")


def test_log_in_and_find_the_failed_executions(page, scenario):
    log_in(page)
    page.goto(page.live_server_url + LIST)
    assert page.locator("#result_list tbody tr").count() >= 7
    screenshot(page, "executions-list")

    page.locator("#changelist-filter a", has_text="failed (any").click()
    page.wait_for_url(re.compile(r"outcome=failed"))
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 1
    assert "this never works" in rows.first.inner_text()
    assert page.locator(f'span[title="{scenario.failed}"]').count() == 1
    screenshot(page, "executions-list-failed")

    # Search by the text of the error.
    page.goto(page.live_server_url + LIST)
    page.fill("#searchbar", "never works")
    page.press("#searchbar", "Enter")
    page.wait_for_url(re.compile(r"q=never"))
    assert page.locator("#result_list tbody tr").count() == 1


def test_open_a_failed_execution_read_the_traceback_and_retry_it(page, scenario):
    log_in(page)
    page.goto(page.live_server_url + LIST + "?outcome=failed")
    page.locator(f'span[title="{scenario.failed}"]').click()
    page.wait_for_selector("#obelisk-execution")
    assert "uncategorized" in page.inner_text("#obelisk-outcome")
    assert "this never works" in page.inner_text("#obelisk-failure-reason")
    traceback = page.inner_text("#obelisk-traceback")
    assert "Traceback (most recent call last)" in traceback and 'raise ValueError("this never works")' in traceback
    assert page.locator("#obelisk-action-cancel").count() == 0
    screenshot(page, "execution-failed")
    screenshot(page, "execution-failed-full", sizes=((1366, 768),), full_page=True)

    page.click("#obelisk-action-retry")
    page.wait_for_selector("#obelisk-confirm")
    page.click("#obelisk-confirm-yes")
    page.wait_for_selector("#obelisk-retry-of")
    assert page.inner_text("#obelisk-retry-of") == scenario.failed
    assert "Retried as" in page.inner_text(".messagelist")
    new_id = AuditEntry.objects.get(execution_id=scenario.failed, action="retry").detail["new_execution_id"]
    assert store.get_created(new_id).metadata == {"retry_of": scenario.failed}

    page.click("#obelisk-retry-of")
    page.wait_for_selector(".obelisk-retried-as")
    assert page.inner_text(".obelisk-retried-as") == new_id
    assert "admin" in page.inner_text("#obelisk-audit")


def test_cancel_a_running_execution(page, scenario):
    log_in(page)
    open_execution(page, scenario.running)
    assert "running" in page.inner_text("#obelisk-outcome")
    page.click("#obelisk-action-cancel")
    page.wait_for_selector("#obelisk-confirm")
    assert store.get_state(scenario.running).lifecycle == "active"  # asking changed nothing
    page.click("#obelisk-confirm-yes")
    page.wait_for_selector(".messagelist")
    assert "Cancellation requested" in page.inner_text(".messagelist")
    assert "cancelling" in page.inner_text("#obelisk-outcome")
    assert page.locator("#obelisk-action-cancel").count() == 0
    assert store.get_state(scenario.running).lifecycle == "cancelling"
    assert "Cancellation requested" in page.inner_text("#obelisk-timeline")


def test_open_a_workflows_tree_and_time_travel(page, scenario):
    log_in(page)
    open_execution(page, scenario.workflow)
    tree = page.locator("#obelisk-tree")
    assert scenario.child.rsplit(".", 1)[-1] in tree.inner_text()
    screenshot(page, "execution-workflow")

    # Back to when the child had been requested but had not answered yet.
    versions = page.locator("a.obelisk-as-of")
    request_version = None
    for i in range(versions.count()):
        row = page.locator("#obelisk-timeline tbody tr").nth(i)
        if "child_execution_request" in row.inner_text():
            request_version = int(versions.nth(i).get_attribute("data-version"))
            versions.nth(i).click()
            break
    assert request_version is not None
    page.wait_for_selector("#obelisk-time-travel")
    assert f"as of version {request_version}" in page.inner_text("#obelisk-time-travel")
    requests = page.inner_text("#obelisk-requests")
    assert scenario.child in requests and "no response yet" in requests
    assert page.locator("#obelisk-timeline tbody tr").count() == request_version + 1
    assert page.locator("#obelisk-actions").count() == 0
    screenshot(page, "execution-time-travel")

    page.click("text=Back to the present")
    page.wait_for_selector("#obelisk-tree")
    page.locator("#obelisk-tree a").first.click()
    page.wait_for_selector("#obelisk-parent")
    assert page.inner_text("#obelisk-parent") == scenario.workflow


def test_deployment_pages(page, scenario):
    log_in(page)
    page.goto(page.live_server_url + "/admin/obelisk_deployments/deployment/")
    page.locator("#result_list tbody tr th a").first.click()
    page.wait_for_selector(".obelisk-functions")
    text = page.inner_text("#content")
    assert "test:acts/basic.add" in text and "object (" not in text
    screenshot(page, "deployment")
    page.locator("a", has_text="execution(s)").first.click()
    page.wait_for_url(re.compile(r"deployment=Dep_"))
    assert page.locator(f'span[title="{scenario.ok}"]').count() == 1
