"""Schedules in the operator console, through Django's test client (issue 39): the list
and the page show each schedule's spec, status (with a pause's reason), next five fire
times in its zone and in UTC and its last ticks as outcome badges linking to their
executions; pause / resume / trigger act through ``executions.schedules`` as the user via
the console, audited, only for who may act and only by POST."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from executions import schedules
from executions.console.urls import execution_url
from executions.models import AuditEntry, ExecutionState, Schedule, ScheduleTick
from tests.support import browser as support
from tests.support import helpers
from tests.support.schedules_console import make_schedules

pytestmark = pytest.mark.django_db

LIST = reverse("admin:obelisk_executions_schedule_changelist")


def page_url(schedule_id: str) -> str:
    return reverse("admin:obelisk_executions_schedule_change", args=[schedule_id])


def act_url(schedule_id: str, action: str) -> str:
    return reverse("admin:obelisk_executions_schedule_act", args=[schedule_id, action])


@pytest.fixture
def made():
    return make_schedules()


@pytest.fixture
def admin_client(client):
    support.make_admin()
    client.login(username="admin", password=support.ADMIN_PASSWORD)
    return client


def row_of(html: str, schedule_id: str) -> str:
    """The list's row of one schedule."""
    rows = html.split('id="result_list"')[1].split("</table>")[0].split("<tr")
    return next(r for r in rows if f'class="obelisk-id">{schedule_id}<' in r)


def test_the_list_shows_spec_status_next_fire_times_and_tick_badges(admin_client, made):
    response = admin_client.get(LIST)
    assert response.status_code == 200
    html = response.content.decode()

    sync = row_of(html, made.sync)
    assert "every 10 s, UTC" in sync and "test:acts/basic.add" in sync and "skip" in sync
    assert "obelisk-schedule-active" in sync
    assert len(re.findall(r'<div class="obelisk-time">[^<]+ UTC</div>', sync)) == 5
    # The finished tick is its execution's ok badge, linked; the waiting one pending (or
    # scheduled, while its tick is ahead of the clock).
    assert f'href="{execution_url(made.ok_execution)}"' in sync and "obelisk-badge obelisk-ok" in sync
    assert f'href="{execution_url(made.scheduled_execution)}"' in sync
    assert re.search(r"obelisk-badge obelisk-(pending|scheduled)", sync)
    assert "obelisk-tick-skipped" in sync and "obelisk-tick-missed" in sync

    nightly = row_of(html, made.nightly)
    assert "cron 30 2 * * *, Europe/Prague" in nightly and "buffer_one" in nightly
    # 02:30 in Prague is 01:30 UTC in winter and 00:30 UTC in summer.
    times = re.findall(r'<div class="obelisk-time">([^<]+)</div>', nightly)
    assert len(times) == 5 and all(re.search(r" 02:30:00 CES?T \((01|00):30:00 UTC\)$", t) for t in times), times
    assert nightly.count('class="obelisk-tick"') == 3  # three nights backfilled, each linked

    broken = row_of(html, made.broken)
    assert "obelisk-schedule-paused" in broken and "paused: cannot submit test:acts/basic.add" in broken
    assert "obelisk-tick-failed" in broken and "none while paused" in broken


def test_the_page_shows_the_spec_in_full_more_ticks_and_the_buttons_that_apply(admin_client, made):
    html = admin_client.get(page_url(made.sync)).content.decode()
    assert "Catch-up window" in html and "30.00 s" in html
    assert (
        len(re.findall(r'<tr class="obelisk-tick-row', html))
        == ScheduleTick.objects.filter(schedule_id=made.sync).count()
    )
    assert html.count('<td class="obelisk-time">') >= 5
    assert 'id="obelisk-action-pause"' in html and 'id="obelisk-action-trigger"' in html
    assert 'id="obelisk-action-resume"' not in html
    assert 'name="csrfmiddlewaretoken"' in html

    broken = admin_client.get(page_url(made.broken)).content.decode()
    assert 'id="obelisk-action-resume"' in broken and 'id="obelisk-action-pause"' not in broken
    assert "paused: cannot submit test:acts/basic.add" in broken and "None while paused." in broken


def test_pause_resume_and_trigger_go_through_schedules_as_the_user_and_are_audited(admin_client, made):
    paused = admin_client.post(act_url(made.sync, "pause"), follow=True)
    assert paused.status_code == 200 and b"Paused: no tick fires until it is resumed." in paused.content
    row = Schedule.objects.get(schedule_id=made.sync)
    assert row.paused and row.pause_reason == "paused by admin in the console"
    assert schedules.next_fire_times(row) == []

    resumed = admin_client.post(act_url(made.sync, "resume"), follow=True)
    assert b"Resumed" in resumed.content and not Schedule.objects.get(schedule_id=made.sync).paused

    before = set(ExecutionState.objects.values_list("execution_id", flat=True))
    triggered = admin_client.post(act_url(made.broken, "trigger"))
    assert triggered.status_code == 302 and triggered.url == page_url(made.broken)
    # ``broken``'s arguments no longer fit: the trigger is refused with the reason, nothing started.
    assert set(ExecutionState.objects.values_list("execution_id", flat=True)) == before
    refused = admin_client.get(page_url(made.broken)).content.decode()
    assert "Trigger now failed: cannot submit test:acts/basic.add" in refused

    started = admin_client.post(act_url(made.nightly, "trigger"), follow=True).content.decode()
    (new,) = set(ExecutionState.objects.values_list("execution_id", flat=True)) - before
    assert f"Triggered: started {new}." in started and execution_url(new) in started

    audit = list(
        AuditEntry.objects.filter(execution_id__startswith="schedule:")
        .order_by("id")
        .values_list("actor", "via", "action", "execution_id")
    )
    assert audit[-3:] == [
        ("admin", "admin", "schedule_pause", "schedule:sync"),
        ("admin", "admin", "schedule_resume", "schedule:sync"),
        ("admin", "admin", "schedule_trigger", "schedule:nightly"),
    ]
    assert "schedule_trigger" in started and "schedule_pause" not in started  # the page's own audit trail


def test_without_the_act_permission_the_page_has_no_buttons_and_nothing_changes(client, made):
    support.make_viewer()
    client.login(username="viewer", password="viewer")
    assert client.get(LIST).status_code == 200
    page = client.get(page_url(made.sync))
    assert page.status_code == 200 and b"obelisk-action-" not in page.content
    before = helpers.db_snapshot()
    audit_count = AuditEntry.objects.count()
    for schedule_id, action in [(made.sync, "pause"), (made.broken, "resume"), (made.sync, "trigger")]:
        assert client.post(act_url(schedule_id, action)).status_code == 403
        assert client.get(act_url(schedule_id, action)).status_code == 403
    assert helpers.db_snapshot() == before
    assert AuditEntry.objects.count() == audit_count
    assert Schedule.objects.get(schedule_id=made.sync).paused is False


def test_a_get_acts_on_nothing_and_bad_addresses_answer_without_an_error(admin_client, made):
    audit_count = AuditEntry.objects.count()
    assert admin_client.get(act_url(made.sync, "pause")).status_code == 405
    assert not Schedule.objects.get(schedule_id=made.sync).paused
    assert AuditEntry.objects.count() == audit_count
    assert admin_client.post(act_url(made.sync, "delete")).status_code == 404
    assert admin_client.post(act_url("no-such-schedule", "pause")).status_code == 302
    assert admin_client.get(page_url("no-such-schedule")).status_code == 302
    assert admin_client.get(page_url("a_5Fb")).status_code == 302
    assert admin_client.get(reverse("admin:obelisk_executions_schedule_add")).status_code == 403
    assert admin_client.get(LIST, {"q": "night"}).content.count(b'class="obelisk-id"') == 1
    assert b">broken<" in admin_client.get(LIST, {"q": "paused"}).content
    assert admin_client.get(LIST, {"q": "paused"}).content.count(b'class="obelisk-id"') == 1
    assert admin_client.get(LIST, {"q": "active"}).content.count(b'class="obelisk-id"') == 2
