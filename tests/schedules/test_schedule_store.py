"""The store's schedules: firing due ticks once, the overlap policy and catch-up window,
pausing a schedule whose target no longer fits, and the audit of people's actions."""

from datetime import UTC, datetime, timedelta

import pytest

from executions import errors, schedules, store
from executions.models import ExecutionState, Schedule, ScheduleTick
from executions.schedule_spec import tick_execution_id
from tests.support.helpers import deploy_components

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def deployed():
    return deploy_components()


def every_second(schedule_id="tick", **options) -> schedules.ScheduleRequest:
    fields = {"interval_seconds": 1, "catchup_window_seconds": 5, **options}
    return schedules.ScheduleRequest(schedule_id, "test:acts/basic.add", [1, 2], **fields)


def save_at(request, now, **kwargs):
    row, _ = store.save_schedule(request.definition(), mode="create", now=now, **kwargs)
    return row


def fire(now):
    return store.fire_due_schedules(schedules.prepare_tick, now=now)


def actions(schedule_id="tick"):
    return [
        (t.nominal_at, t.action)
        for t in ScheduleTick.objects.filter(schedule_id=schedule_id).order_by("nominal_at", "id")
    ]


def test_each_due_tick_becomes_one_execution_with_an_id_derived_from_the_tick():
    row = save_at(every_second(), T0)
    assert row.next_tick_at == T0 + timedelta(seconds=1)
    report = fire(T0 + timedelta(seconds=1))
    assert report.started == 1
    execution_id = tick_execution_id(row.key, T0 + timedelta(seconds=1))
    state = ExecutionState.objects.get(execution_id=execution_id)
    assert state.ffqn == "test:acts/basic.add"
    created = store.get_created(execution_id)
    assert created.metadata["obelisk.schedule"] == "tick"
    assert created.metadata["obelisk.scheduled_at"] == "2026-12-06T12:00:01+00:00"
    assert fire(T0 + timedelta(seconds=1, milliseconds=500)).started == 0  # nothing new is due
    assert Schedule.objects.get().next_tick_at == T0 + timedelta(seconds=2)


def test_skip_drops_ticks_while_the_previous_execution_runs():
    save_at(every_second(overlap="skip"), T0)
    fire(T0 + timedelta(seconds=1))
    fire(T0 + timedelta(seconds=2))  # the first has not run: no worker here
    assert [a for _, a in actions()] == ["started", "skipped"]


def test_buffer_one_keeps_one_tick_waiting_and_skips_the_rest():
    save_at(every_second(overlap="buffer_one"), T0)
    fire(T0 + timedelta(seconds=1))
    fire(T0 + timedelta(seconds=3))
    assert [a for _, a in actions()] == ["started", "buffered", "skipped"]


def test_allow_all_starts_every_tick_in_the_catch_up_window_and_misses_the_older():
    save_at(every_second(overlap="allow_all", catchup_window_seconds=2.5), T0)
    report = fire(T0 + timedelta(seconds=4))  # ticks 1..4 due; 1 is 3 s late
    assert report.started == 3
    assert [a for _, a in actions()] == ["missed", "started", "started", "started"]


def test_a_target_that_no_longer_fits_pauses_the_schedule_with_the_reason():
    row = save_at(every_second(), T0)
    Schedule.store_objects.filter(pk=row.pk).update(arguments=["one", "two"])
    report = fire(T0 + timedelta(seconds=1))
    assert report.paused == ["tick"]
    row = Schedule.objects.get()
    assert row.paused and "cannot submit test:acts/basic.add" in row.pause_reason
    assert [a for _, a in actions()] == ["failed"]


@pytest.mark.parametrize(
    ("field", "options"),
    [
        ("cron", {"interval_seconds": None, "cron": "61 * * * *"}),
        ("timezone", {"timezone": "Mars/Olympus"}),
        ("interval_seconds", {"interval_seconds": 0}),
        ("interval_seconds", {"interval_seconds": -5}),
        ("overlap", {"overlap": "sometimes"}),
    ],
)
def test_an_invalid_schedule_is_refused_naming_the_field_and_nothing_is_created(field, options):
    with pytest.raises(errors.ValidationFailed) as refused:
        schedules.create(every_second(**options))
    assert refused.value.field == field
    assert not Schedule.objects.exists()


def test_an_unknown_target_is_refused_naming_the_field():
    request = schedules.ScheduleRequest("x", "test:acts/basic.nope", [], interval_seconds=1)
    with pytest.raises(errors.ValidationFailed) as refused:
        schedules.create(request)
    assert refused.value.field == "ffqn"
    assert not Schedule.objects.exists()


def test_applying_the_same_declaration_twice_is_one_unchanged_schedule():
    request = every_second(source="code")
    assert schedules.apply([request]) == {"tick": "created"}
    key = Schedule.objects.get().key
    assert schedules.apply([request]) == {"tick": "unchanged"}
    assert Schedule.objects.get().key == key and Schedule.objects.count() == 1


def test_backfill_creates_each_missing_tick_once():
    row = save_at(every_second(), T0)
    fire(T0 + timedelta(seconds=1))
    ticks = store.backfill_schedule(
        "tick", T0 + timedelta(seconds=1), T0 + timedelta(seconds=3), schedules.prepare_tick
    )
    assert len(ticks) == 3
    ids = {tick_execution_id(row.key, T0 + timedelta(seconds=s)) for s in (1, 2, 3)}
    assert set(ExecutionState.objects.values_list("execution_id", flat=True)) == ids


def test_pause_and_trigger_are_audited_under_the_schedule():
    save_at(every_second(), T0)
    schedules.pause("tick", actor="ada", via="cli")
    execution_id = schedules.trigger("tick", actor="ada", via="cli")
    trail = store.list_audit("schedule:tick")
    assert [entry.action for entry in trail] == ["schedule_trigger", "schedule_pause"]
    assert trail[0].detail["execution_id"] == execution_id
