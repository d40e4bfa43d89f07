"""The operator console in a real browser (Debian's Chromium through Playwright) on
pytest-django's live server: what an operator does, step by step. Screenshots of the list
and the execution page at 1366×768 and 1920×1080 land in ``var/screenshots/``.

Few tests on purpose (each costs seconds); the console's rules are checked without a
browser in ``test_console.py``."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote

from executions import client, store
from executions.events import Ok
from executions.models import AuditEntry
from tests.support import browser as support
from tests.support import console_components
from tests.support.browser import log_in, screenshot
from tests.support.clusters import outcomes, started_clusters
from workers.testing import submit

page = support.page

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/admin/obelisk_executions/executionstate/"


@pytest.fixture
def scenario(transactional_db):
    support.make_admin()
    return support.make_scenario()


@pytest.fixture
def tour(transactional_db, request, tmp_path):
    """A finished ``test:console/wf.tour`` (``tests/support/console_components.py``), run by a real
    worker cluster: a persisted time, a failed child answered first, an ok child, a delay."""
    support.make_admin()
    env = {"OBELISK_COMPONENT_MODULES": "tests.support.components,tests.support.console_components"}
    with started_clusters(request, tmp_path, default_workers=2, default_env=env) as start:
        start()
        execution_id, _ = submit(console_components.TOUR, [7])
        result = outcomes([execution_id], timeout=90)[execution_id]
    assert isinstance(result, Ok), result
    return execution_id


def open_execution(page, execution_id: str, query: str = "") -> None:
    page.goto(f"{page.live_server_url}{LIST}{quote(execution_id)}/change/{query}")
    page.wait_for_selector("#obelisk-execution")


def test_time_travel_opens_every_version_of_a_workflow_with_children_a_delay_and_a_failed_child(page, tour):
    log_in(page)
    open_execution(page, tour)
    versions = [int(v) for v in page.locator("a.obelisk-as-of").evaluate_all("els => els.map(e => e.dataset.version)")]
    assert versions == [record.version for record in store.get(tour).events]
    base = f"{page.live_server_url}{LIST}{quote(tour)}/change/"
    for version in versions:
        response = page.goto(f"{base}?as_of={version}")
        assert response.status == 200, f"version {version}: HTTP {response.status}"
        page.wait_for_selector("#obelisk-execution")
        if version != versions[-1]:
            assert f"as of version {version}" in page.inner_text("#obelisk-time-travel")
    # Waiting on its delay: both children had answered (the failure first), the delay not yet.
    page.goto(f"{base}?as_of={versions[-2]}")
    requests = page.locator("#obelisk-requests tr.obelisk-request")
    texts = [requests.nth(i).inner_text() for i in range(requests.count())]
    assert len(texts) == 3, texts
    assert "broken on purpose" in texts[0] and "test:console/acts.breaks" in texts[0]
    assert "ok" in texts[1] and "test:console/acts.triple" in texts[1]
    assert "waiting" in texts[2]
    responses = page.inner_text("#obelisk-responses")
    assert responses.index("broken on purpose") < responses.index("ok 21")
    screenshot(page, "execution-time-travel-tour")


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
    page.goto(page.live_server_url + LIST + "?outcome=failed&finished=1h")
    assert page.locator(f'span[title="{scenario.failed}"]').count() == 1
    screenshot(page, "executions-failed-last-hour")

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
    screenshot(page, "confirm-retry", sizes=((1366, 768),))
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
    screenshot(page, "execution-cancelling")


def test_pause_then_resume_a_pending_execution(page, scenario):
    log_in(page)
    open_execution(page, scenario.pending)
    page.click("#obelisk-action-pause")
    page.wait_for_selector("#obelisk-confirm")
    page.click("#obelisk-confirm-yes")
    page.wait_for_selector(".messagelist")
    assert "Paused" in page.inner_text(".messagelist")
    assert "paused" in page.inner_text("#obelisk-outcome")
    assert store.get_state(scenario.pending).lifecycle == "paused"
    screenshot(page, "execution-paused")
    page.click("#obelisk-action-resume")
    page.click("#obelisk-confirm-yes")
    page.wait_for_selector("text=Resumed.")
    assert store.get_state(scenario.pending).lifecycle == "active"


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
    assert re.search(r"/deployment/Dep_[0-9A-Z]{26}/change/$", page.url), page.url  # copyable, not Dep_5F…
    text = page.inner_text("#content")
    assert "test:acts/basic.add" in text and "object (" not in text
    screenshot(page, "deployment")
    page.locator("a", has_text="execution(s)").first.click()
    page.wait_for_url(re.compile(r"deployment=Dep_"))
    assert page.locator(f'span[title="{scenario.ok}"]').count() == 1


@pytest.mark.parametrize("size", [(1366, 768), (1920, 1080)])
def test_a_workflows_page_shows_its_children_with_durations_above_its_history_and_names_each_event(page, tour, size):
    page.set_viewport_size({"width": size[0], "height": size[1]})
    log_in(page)
    open_execution(page, tour)
    tree, timeline = page.locator("#obelisk-tree"), page.locator("#obelisk-timeline")
    assert tree.bounding_box()["y"] < timeline.bounding_box()["y"]
    children = page.locator("#obelisk-tree tr.obelisk-child")
    assert children.count() == 2
    for i in range(2):
        assert re.fullmatch(r"\d+ ms|\d+\.\d\d s", children.nth(i).locator(".obelisk-duration").inner_text())
    titles = page.locator("#obelisk-timeline tbody tr td:nth-child(4)").all_inner_texts()
    assert "History" not in titles
    for title in ("Time read (ctx.now)", "Child started", "Delay started", "Waiting for a response"):
        assert title in titles, titles
    now_row = page.locator("#obelisk-timeline tbody tr", has_text="Time read (ctx.now)").inner_text()
    assert re.search(r"now = \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} UTC", now_row), now_row
    assert "[50, 48" not in now_row  # not the ISO text's bytes
    screenshot(page, "execution-workflow-children", sizes=(size,))


def test_an_unfinished_executions_page_refreshes_itself_until_it_finishes(page, scenario):
    execution_id = client.submit(support.NOOP, []).execution_id
    locked = support._lock(execution_id)
    log_in(page)
    open_execution(page, execution_id)
    assert "running" in page.inner_text("#obelisk-outcome")
    assert page.evaluate("document.documentElement.dataset.obeliskPoll") == "polling"

    client.cancel(execution_id, actor="bob", via="cli")  # from elsewhere: no reload here
    page.wait_for_function("document.querySelector('#obelisk-outcome').innerText.includes('cancelling')")
    assert "Cancellation requested" in page.inner_text("#obelisk-timeline")
    screenshot(page, "execution-cancelling")
    assert "bob" in page.inner_text("#obelisk-audit")

    version = store.get_state(execution_id).next_version
    assert store.finish_cancelled(execution_id, fence=locked.fence, version=version)
    page.wait_for_function("document.documentElement.dataset.obeliskPoll === 'stopped'")
    assert "cancelled" in page.inner_text("#obelisk-outcome")
    assert page.locator("#obelisk-execution[data-poll-seconds]").count() == 0


def test_bulk_retry_is_audited_and_the_audit_page_shows_what_one_operator_did_today(page, scenario):
    from django.contrib.auth.models import User

    User.objects.create_superuser("bob", "bob@example.com", "bob-pw")
    failed = [scenario.failed, support.failed_execution()]
    client.cancel(scenario.running, actor="alice", via="api")  # someone else's action
    log_in(page, "bob", "bob-pw")
    page.goto(page.live_server_url + LIST + "?outcome=failed")
    for execution_id in failed:
        page.locator("#result_list tbody tr", has=page.locator(f'span[title="{execution_id}"]')).locator(
            "input.action-select"
        ).check()
    page.select_option("select[name=action]", "retry_selected")
    page.click("button[name=index]")
    page.wait_for_selector("input[value='Yes, retry']")
    assert AuditEntry.objects.filter(action="retry").count() == 0  # asking changed nothing
    page.click("input[value='Yes, retry']")
    page.wait_for_selector(".messagelist")
    assert "Retry 2 execution(s)" in page.inner_text(".messagelist")
    for execution_id in failed:
        entry = AuditEntry.objects.get(execution_id=execution_id, action="retry")
        assert (entry.actor, entry.via) == ("bob", "admin")
        assert store.get_created(entry.detail["new_execution_id"]).metadata == {"retry_of": execution_id}

    page.goto(page.live_server_url + "/admin/")
    page.locator("a", has_text="Audit entries").first.click()
    page.locator("#changelist-filter a", has_text="today (UTC)").click()
    page.locator("#changelist-filter a", has_text="bob").click()
    page.wait_for_url(re.compile(r"actor=bob"))
    rows = page.locator("#result_list tbody tr")
    assert rows.count() == 2
    text = page.inner_text("#result_list")
    assert "alice" not in text and all(execution_id in text for execution_id in failed)
    screenshot(page, "audit-bob-today")
    rows.first.locator("a.obelisk-id").click()
    page.wait_for_selector("#obelisk-execution")
    assert "bob" in page.inner_text("#obelisk-audit")


def test_execution_urls_carry_the_id_as_it_is_so_it_can_be_copied(page, scenario):
    log_in(page)
    page.goto(page.live_server_url + LIST + f"?q={scenario.workflow}")
    page.locator(f'span[title="{scenario.workflow}"]').click()
    page.wait_for_selector("#obelisk-execution")
    assert f"/{scenario.workflow}/change/" in page.url
    page.locator("#obelisk-tree a").first.click()
    page.wait_for_selector("#obelisk-parent")
    assert page.url.endswith(f"/{scenario.child}/change/")
    assert page.inner_text("h1") == scenario.child
    # Links made before (the admin's escaping) still open the page.
    open_execution(page, scenario.child)
    assert page.inner_text("h1") == scenario.child


@pytest.mark.parametrize("size", [(1366, 768), (1920, 1080)])
def test_the_list_shows_every_column_whole(page, scenario, size):
    from datetime import timedelta

    from django.utils import timezone

    from executions.events import Err
    from tests.support import helpers

    long_ffqn = "test-namespace:a-long-package/a-rather-long-interface-name.and-a-long-function-name"
    helpers.create(long_ffqn, [1], scheduled_at=timezone.now() + timedelta(hours=23, minutes=59))
    helpers.create(long_ffqn, [2], now=timezone.now() - timedelta(days=3, hours=23))
    support.finished(support.ERROR_VALUE, ["E42"], Err({"code": "E42", "message": "a long explanation " * 20}))
    page.set_viewport_size({"width": size[0], "height": size[1]})
    log_in(page)
    page.goto(page.live_server_url + LIST + "?top_level=all")
    cells = page.locator("#result_list td.field-duration")
    assert cells.count() >= 7
    # The table sits in a box that scrolls sideways: what passes its right edge is cut off.
    visible = page.locator("#result_list").evaluate("e => e.parentElement.getBoundingClientRect().right")
    for i in range(cells.count()):
        cell = cells.nth(i)
        box = cell.bounding_box()
        assert box["x"] + box["width"] <= visible + 0.5, (
            f"duration column ends at {box['x'] + box['width']} > {visible}"
        )
        assert cell.evaluate("e => e.scrollWidth <= e.clientWidth")
    assert page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
    screenshot(page, "executions-list-columns", sizes=(size,))


@pytest.mark.parametrize("size", [(1366, 768), (1920, 1080)])
def test_the_clusters_functions_column_stays_on_one_line(page, scenario, size):
    from django.utils import timezone

    functions = [f"test:acts/basic.function-with-a-long-name-{i}" for i in range(15)]
    store.record_heartbeat(
        "Cluster_" + "X" * 26,
        hostname="worker-host-with-a-rather-long-name.example.internal",
        pid=4242,
        started_at=timezone.now(),
        processes=4,
        running=2,
        functions=functions,
        deployment_id="Dep_01JAAAAAAAAAAAAAAAAAAAAAAA",
    )
    page.set_viewport_size({"width": size[0], "height": size[1]})
    log_in(page)
    cell = page.locator("#obelisk-clusters td.fn").first
    lines = "e => { const r = document.createRange(); r.selectNodeContents(e); return new Set(Array.from(r.getClientRects(), b => Math.round(b.top))).size }"
    assert cell.evaluate(lines) == 1
    assert set(functions) <= set(cell.get_attribute("title").split(", "))
    assert "15" in cell.inner_text()
    table = page.locator("#obelisk-clusters table").bounding_box()
    module = page.locator("#obelisk-clusters").bounding_box()
    assert table["x"] + table["width"] <= module["x"] + module["width"] + 0.5  # no column cut off
    screenshot(page, "dashboard-clusters", sizes=(size,))


def test_the_api_docs_render_offline_and_the_console_links_to_them(page, scenario):
    """No request may leave the live server: Swagger UI's assets are served by it (D92)."""
    local = page.live_server_url
    requested, refused = [], []

    def only_local(route):
        requested.append(route.request.url)
        if route.request.url.startswith(local):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    page.context.route("**/*", only_local)
    log_in(page)
    link = page.locator("#user-tools a", has_text="API docs")
    assert page.locator("#user-tools a", has_text="View site").count() == 0
    link.click()
    page.wait_for_url(re.compile(r"/api/docs"))
    page.wait_for_selector(".swagger-ui .info .title")
    assert "Obelisk for Django" in page.inner_text(".swagger-ui .info .title")
    page.wait_for_selector(".opblock-summary-path")
    assert "/api/v1/executions" in page.inner_text(".swagger-ui")
    assert refused == [], refused
    assert all(url.startswith(local) for url in requested)
    screenshot(page, "api-docs")

    # The index names the API too, and the bare site leads to the console.
    page.goto(local + "/admin/")
    assert page.locator("#obelisk-api-links a[href='/api/docs']").count() == 1
    response = page.goto(local + "/")
    assert response.status == 200 and page.url == local + "/admin/"
