"""The schedules pages in a real browser (Debian's Chromium through Playwright) on
pytest-django's live server (issue 39): an operator reads the list, opens a paused
schedule and sees why, pauses, resumes and triggers one with the buttons and follows a
tick's badge to its execution. Screenshots of the list and the pages at 1366×768 and
1920×1080 land in ``var/screenshots/``. The pages' rules are checked without a browser in
``test_schedules_console.py``."""

from __future__ import annotations

import pytest

from executions.models import AuditEntry
from tests.support import browser as support
from tests.support.browser import log_in, screenshot
from tests.support.schedules_console import make_schedules

page = support.page

pytestmark = pytest.mark.django_db(transaction=True)

LIST = "/admin/obelisk_executions/schedule/"


@pytest.fixture
def made(transactional_db):
    support.make_admin()
    return make_schedules()


def row(page, schedule_id: str):
    return page.locator("#result_list tbody tr", has=page.locator(f"span.obelisk-id:text-is('{schedule_id}')"))


def test_the_list_shows_fire_times_and_tick_badges_and_a_paused_schedule_says_why(page, made):
    log_in(page)
    page.goto(page.live_server_url + LIST)
    page.wait_for_selector("#result_list")
    sync = row(page, made.sync)
    assert sync.locator(".field-next_fire_times .obelisk-time").count() == 5
    assert sync.locator(".field-last_ticks .obelisk-badge.obelisk-ok").count() == 1
    assert sync.locator(".field-last_ticks .obelisk-tick-skipped").count() >= 1
    broken = row(page, made.broken)
    assert "paused: cannot submit test:acts/basic.add" in broken.locator(".field-status").inner_text()
    assert broken.locator(".obelisk-tick-failed").is_visible()
    nightly = row(page, made.nightly)
    assert "CET" in nightly.locator(".field-next_fire_times").inner_text()
    # Every column stays in view at 1366 px, the last ticks too: the table needs no scrolling.
    assert page.evaluate(
        "() => { const r = document.querySelector('.results'); return r.scrollWidth <= r.clientWidth; }"
    )
    box = sync.locator(".field-last_ticks").bounding_box()
    assert box and box["x"] + box["width"] <= 1366
    screenshot(page, "schedules-list")

    broken.locator(".field-schedule a").click()
    page.wait_for_selector("#obelisk-schedule")
    assert "paused: cannot submit" in page.inner_text("#obelisk-schedule-status")
    assert page.locator("#obelisk-action-resume").is_visible()
    assert page.locator("#obelisk-ticks tr.obelisk-tick-row-failed").count() == 1
    screenshot(page, "schedule-paused", full_page=True)

    page.goto(page.live_server_url + LIST)
    row(page, made.sync).locator(".field-last_ticks a:has(.obelisk-ok)").click()
    page.wait_for_selector("#obelisk-execution")
    assert made.ok_execution in page.inner_text("h1")


def test_pause_resume_and_trigger_with_the_buttons_are_audited(page, made):
    log_in(page)
    page.goto(f"{page.live_server_url}{LIST}{made.sync}/change/")
    page.wait_for_selector("#obelisk-schedule")
    assert page.locator("#obelisk-fire-times tr").count() == 5
    screenshot(page, "schedule-page", full_page=True)

    page.click("#obelisk-action-pause")
    page.wait_for_selector("ul.messagelist li.success")
    assert "Paused" in page.inner_text("ul.messagelist")
    assert "paused by admin in the console" in page.inner_text("#obelisk-schedule-status")
    assert page.locator("#obelisk-fire-times-none").is_visible()

    page.click("#obelisk-action-resume")
    page.wait_for_selector("#obelisk-action-pause")
    assert "Resumed" in page.inner_text("ul.messagelist")
    assert page.locator("#obelisk-fire-times tr").count() == 5

    page.click("#obelisk-action-trigger")
    page.wait_for_selector("ul.messagelist li.success")
    message = page.inner_text("ul.messagelist")
    assert "Triggered: started E_" in message
    assert page.locator("#obelisk-ticks tbody tr", has_text="trigger").count() == 1
    assert "schedule_trigger" in page.inner_text("#obelisk-schedule-audit")
    screenshot(page, "schedule-triggered", full_page=True)
    assert list(
        AuditEntry.objects.filter(execution_id="schedule:sync").order_by("id").values_list("actor", "via", "action")
    ) == [
        ("admin", "admin", "schedule_pause"),
        ("admin", "admin", "schedule_resume"),
        ("admin", "admin", "schedule_trigger"),
    ]
