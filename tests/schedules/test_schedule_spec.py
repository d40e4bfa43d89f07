"""When ticks fall (``executions/schedule_spec.py``): daylight-saving changes as croniter
defines them (D114), 5- and 6-field crons, intervals anchored at ``start_at``, ``end_at``,
jitter, and tick execution ids; and the DST day through the store, fired pass by pass."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from executions import schedules, store
from executions.models import ScheduleTick
from executions.schedule_spec import ScheduleSpec, tick_execution_id
from tests.support.helpers import deploy_components

PRAGUE = ZoneInfo("Europe/Prague")
SPRING_FORWARD = datetime(2026, 3, 29, tzinfo=PRAGUE)  # 02:00 CET -> 03:00 CEST
FALL_BACK = datetime(2026, 10, 25, tzinfo=PRAGUE)  # 03:00 CEST -> 02:00 CET


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def ticks_on(spec: ScheduleSpec, day: datetime) -> list[datetime]:
    """The ticks that fall on a local calendar day."""
    times, moment = [], day.astimezone(UTC) - timedelta(microseconds=1)
    end = (day + timedelta(days=1, hours=1)).replace(hour=0).astimezone(UTC)
    while (moment := spec.next_after(moment)) is not None and moment < end:
        times.append(moment)
    return times


# -- daylight saving ----------------------------------------------------------------------


def test_a_0230_daily_schedule_fires_once_on_the_day_the_clocks_skip_0230():
    spec = ScheduleSpec.parse(cron="30 2 * * *", timezone="Europe/Prague")
    ticks = ticks_on(spec, SPRING_FORWARD)
    assert ticks == [utc(2026, 3, 29, 1, 0)]  # the first time after the gap: 03:00 CEST
    assert ticks[0].astimezone(PRAGUE).strftime("%H:%M %Z") == "03:00 CEST"


def test_a_0230_daily_schedule_fires_once_on_the_day_0230_happens_twice():
    spec = ScheduleSpec.parse(cron="30 2 * * *", timezone="Europe/Prague")
    ticks = ticks_on(spec, FALL_BACK)
    assert ticks == [utc(2026, 10, 25, 0, 30)]  # the first 02:30 (CEST), not the second (CET)


def test_the_days_around_the_changes_keep_their_0230():
    spec = ScheduleSpec.parse(cron="30 2 * * *", timezone="Europe/Prague")
    local = [t.astimezone(PRAGUE) for t in spec.next_times(utc(2026, 3, 27), 4)]
    assert [(t.day, t.strftime("%H:%M")) for t in local] == [(27, "02:30"), (28, "02:30"), (29, "03:00"), (30, "02:30")]
    local = [t.astimezone(PRAGUE) for t in spec.next_times(utc(2026, 10, 23), 4)]
    assert [(t.day, t.strftime("%H:%M")) for t in local] == [(23, "02:30"), (24, "02:30"), (25, "02:30"), (26, "02:30")]


def test_an_hourly_cron_keeps_both_repeated_hours_an_hour_of_elapsed_time_apart():
    spec = ScheduleSpec.parse(cron="30 * * * *", timezone="Europe/Prague")
    ticks = spec.next_times(utc(2026, 10, 24, 23, 0), 4)
    assert ticks == [
        utc(2026, 10, 24, 23, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 1, 30),
        utc(2026, 10, 25, 2, 30),
    ]
    assert all(b - a == timedelta(hours=1) for a, b in zip(ticks, ticks[1:], strict=False))


def test_an_hourly_cron_written_as_a_step_fires_as_often_as_one_written_as_a_star():
    """``*/1`` and ``0-23`` are every hour, as ``*`` is: the fall-back day has the same ticks."""
    star = ScheduleSpec.parse(cron="0 * * * *", timezone="Europe/Prague")
    for hours in ("*/1", "0-23"):
        step = ScheduleSpec.parse(cron=f"0 {hours} * * *", timezone="Europe/Prague")
        assert ticks_on(step, FALL_BACK) == ticks_on(star, FALL_BACK), hours


@pytest.mark.django_db
def test_the_spring_forward_day_fired_pass_by_pass_through_the_store_starts_one_tick():
    deploy_components()
    request = schedules.ScheduleRequest(
        "dst", "test:acts/basic.add", [1, 2], cron="30 2 * * *", timezone="Europe/Prague", catchup_window_seconds=600
    )
    store.save_schedule(request.definition(), mode="create", now=utc(2026, 3, 28, 22, 0))
    now = utc(2026, 3, 28, 22, 0)
    while now < utc(2026, 3, 29, 22, 0):  # the whole local day, a pass every 5 minutes
        now += timedelta(minutes=5)
        store.fire_due_schedules(schedules.prepare_tick, now=now)
    ticks = list(ScheduleTick.objects.filter(schedule_id="dst").values_list("nominal_at", "action"))
    assert ticks == [(utc(2026, 3, 29, 1, 0), "started")]


@pytest.mark.django_db
def test_the_fall_back_day_fired_pass_by_pass_through_the_store_starts_one_tick():
    deploy_components()
    request = schedules.ScheduleRequest(
        "dst", "test:acts/basic.add", [1, 2], cron="30 2 * * *", timezone="Europe/Prague", catchup_window_seconds=600
    )
    store.save_schedule(request.definition(), mode="create", now=utc(2026, 10, 24, 21, 0))
    now = utc(2026, 10, 24, 21, 0)
    while now < utc(2026, 10, 25, 23, 0):
        now += timedelta(minutes=5)
        store.fire_due_schedules(schedules.prepare_tick, now=now)
    ticks = list(ScheduleTick.objects.filter(schedule_id="dst").values_list("nominal_at", "action"))
    assert ticks == [(utc(2026, 10, 25, 0, 30), "started")]


# -- crons, intervals, bounds ---------------------------------------------------------------


def test_a_five_field_cron_ticks_on_minutes_and_a_six_field_cron_on_seconds_too():
    five = ScheduleSpec.parse(cron="*/15 9 * * 1")  # Mondays 09:00, 09:15, ...
    assert five.next_times(utc(2026, 12, 6, 12), 3) == [
        utc(2026, 12, 7, 9, 0),
        utc(2026, 12, 7, 9, 15),
        utc(2026, 12, 7, 9, 30),
    ]
    six = ScheduleSpec.parse(cron="* * * * * */20")  # the sixth field is seconds
    assert six.next_times(utc(2026, 12, 6, 12, 0, 5), 3) == [
        utc(2026, 12, 6, 12, 0, 20),
        utc(2026, 12, 6, 12, 0, 40),
        utc(2026, 12, 6, 12, 1, 0),
    ]


def test_a_cron_is_read_in_its_time_zone():
    spec = ScheduleSpec.parse(cron="0 9 * * *", timezone="America/New_York")
    assert spec.next_after(utc(2026, 12, 6, 12)) == utc(2026, 12, 6, 14)  # 09:00 EST


def test_an_interval_is_anchored_at_start_at_and_start_at_is_its_first_tick():
    start = utc(2026, 12, 6, 12, 0, 7)
    spec = ScheduleSpec.parse(interval_seconds=10, start_at=start)
    assert spec.next_times(utc(2026, 1, 1), 3) == [start, start + timedelta(seconds=10), start + timedelta(seconds=20)]
    assert spec.next_after(start + timedelta(seconds=15)) == start + timedelta(seconds=20)


def test_an_interval_without_start_at_is_anchored_at_the_epoch():
    spec = ScheduleSpec.parse(interval_seconds=60)
    assert spec.next_after(utc(2026, 12, 6, 12, 0, 30)) == utc(2026, 12, 6, 12, 1)
    assert spec.next_after(utc(2026, 12, 6, 12, 1)) == utc(2026, 12, 6, 12, 2)  # strictly after


def test_a_cron_and_an_interval_together_merge_their_ticks():
    spec = ScheduleSpec.parse(cron="0 * * * *", interval_seconds=25 * 60, start_at=utc(2026, 12, 6, 12))
    assert spec.next_times(utc(2026, 12, 6, 12, 0), 4) == [
        utc(2026, 12, 6, 12, 25),
        utc(2026, 12, 6, 12, 50),
        utc(2026, 12, 6, 13, 0),
        utc(2026, 12, 6, 13, 15),
    ]


def test_no_tick_falls_after_end_at():
    end = utc(2026, 12, 6, 12, 0, 30)
    spec = ScheduleSpec.parse(interval_seconds=10, end_at=end)
    assert spec.next_times(utc(2026, 12, 6, 12), 10) == [utc(2026, 12, 6, 12, 0, s) for s in (10, 20, 30)]
    assert spec.next_after(end) is None


def test_start_at_and_end_at_bound_a_cron():
    spec = ScheduleSpec.parse(cron="0 12 * * *", start_at=utc(2026, 12, 8), end_at=utc(2026, 12, 10, 12))
    assert spec.next_times(utc(2026, 1, 1), 5) == [utc(2026, 12, d, 12) for d in (8, 9, 10)]


# -- jitter and tick ids ----------------------------------------------------------------------


def test_jitter_is_within_its_bounds_and_the_same_every_time_it_is_computed():
    spec = ScheduleSpec.parse(interval_seconds=60, jitter_seconds=30)
    ticks = spec.next_times(utc(2026, 12, 6), 500)
    delays = [spec.jitter_of("01JKEY", t) for t in ticks]
    assert all(timedelta(0) <= d < timedelta(seconds=30) for d in delays)
    assert delays == [spec.jitter_of("01JKEY", t) for t in ticks]
    assert len(set(delays)) > 400  # spread, not one constant
    assert max(delays) > timedelta(seconds=25) and min(delays) < timedelta(seconds=5)
    assert [spec.jitter_of("01JOTHER", t) for t in ticks] != delays  # each schedule its own


def test_no_jitter_is_no_delay():
    spec = ScheduleSpec.parse(interval_seconds=60)
    assert spec.jitter_of("01JKEY", utc(2026, 12, 6)) == timedelta(0)


def test_tick_ids_sort_as_their_ticks_and_are_stable():
    spec = ScheduleSpec.parse(interval_seconds=0.25)
    ticks = spec.next_times(utc(2026, 12, 6), 200)
    ids = [tick_execution_id("01JKEY", t) for t in ticks]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert ids == [tick_execution_id("01JKEY", t) for t in ticks]
    same_moment = ticks[0].astimezone(PRAGUE)
    assert tick_execution_id("01JKEY", same_moment) == ids[0]  # the instant, not its zone
    assert tick_execution_id("01JOTHER", ticks[0]) != ids[0]


@pytest.mark.parametrize(
    ("field", "options"),
    [
        ("cron", {"cron": "* * * *"}),
        ("cron", {"cron": "* * * * * * *"}),
        ("cron", {"cron": "0 25 * * *"}),
        ("cron", {}),
        ("timezone", {"cron": "* * * * *", "timezone": "Europe/Atlantis"}),
        ("interval_seconds", {"interval_seconds": float("nan")}),
        ("end_at", {"interval_seconds": 1, "start_at": utc(2026, 1, 2), "end_at": utc(2026, 1, 1)}),
        ("start_at", {"interval_seconds": 1, "start_at": datetime(2026, 1, 1)}),
        ("jitter_seconds", {"interval_seconds": 1, "jitter_seconds": -1}),
    ],
)
def test_an_invalid_spec_is_refused_naming_its_field(field, options):
    with pytest.raises(Exception) as refused:
        ScheduleSpec.parse(**options)
    assert getattr(refused.value, "field", None) == field
