"""``obelisk_schedule``: every subcommand does what it says through ``executions.schedules``,
audited as the operating-system user with ``via="cli"``; bad input is one line naming the
field, a non-zero exit status and no write (the one-line shape checked in real processes,
as a user runs the command)."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from executions import schedules
from executions.management.commands import _cli
from executions.models import AuditEntry, ExecutionState, Schedule, ScheduleTick
from tests.support import helpers
from tests.support.processes import refused, run

ADD = "test:acts/basic.add"


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


def schedule(*argv: str) -> str:
    out = io.StringIO()
    call_command("obelisk_schedule", *argv, stdout=out)
    return out.getvalue()


def refusal(*argv: str) -> str:
    """The command's one-line error (in-process), having written nothing."""
    before = (helpers.db_snapshot(), list(Schedule.objects.values_list()), ScheduleTick.objects.count())
    with pytest.raises(CommandError) as refused_with:
        schedule(*argv)
    assert refused_with.value.returncode == _cli.EXIT_ERROR
    assert (helpers.db_snapshot(), list(Schedule.objects.values_list()), ScheduleTick.objects.count()) == before
    return str(refused_with.value)


def audit_of(schedule_id: str) -> list[tuple[str, str, str]]:
    return list(
        AuditEntry.objects.filter(execution_id=f"schedule:{schedule_id}")
        .order_by("id")
        .values_list("action", "actor", "via")
    )


@pytest.mark.django_db
def test_create_then_show_gives_the_next_five_fire_times_and_the_action_is_audited_as_the_os_user():
    out = schedule("create", "nightly", ADD, "--cron", "30 2 * * *", "--tz", "Europe/Prague", "--args", "[1, 2]")
    assert out.startswith("nightly: created, next ")
    row = Schedule.objects.get()
    assert (row.ffqn, row.arguments, row.cron, row.timezone) == (ADD, [1, 2], "30 2 * * *", "Europe/Prague")
    shown = schedule("show", "nightly")
    fire_times = shown.split("next fire times:\n")[1].split("last ticks")[0].splitlines()
    assert len(fire_times) == 5 and all(line.endswith(" UTC") for line in fire_times)
    assert "last ticks: none yet" in shown
    assert audit_of("nightly") == [("schedule_create", _cli.cli_actor(), "cli")]


@pytest.mark.django_db
def test_every_option_reaches_the_schedule():
    schedule(
        "create", "often", ADD, "--every", "10", "--args", '{"a": 1, "b": 2}', "--overlap", "buffer_one",
        "--catchup-window", "30", "--jitter", "2", "--start", "2030-01-01T00:00:00+01:00",
        "--end", "2031-01-01T00:00Z", "--paused",
    )  # fmt: skip
    row = Schedule.objects.get()
    assert row.interval_seconds == 10 and row.arguments == {"a": 1, "b": 2} and row.overlap == "buffer_one"
    assert (row.catchup_window_seconds, row.jitter_seconds, row.paused) == (30, 2, True)
    assert row.start_at == datetime(2029, 12, 31, 23, tzinfo=UTC) and row.end_at == datetime(2031, 1, 1, tzinfo=UTC)
    assert "often  paused  test:acts/basic.add  every 10 s" in schedule("list")


@pytest.mark.django_db
def test_update_replaces_the_spec_and_says_whether_it_changed():
    schedule("create", "nightly", ADD, "--cron", "0 2 * * *", "--args", "[1, 2]")
    assert schedule("update", "nightly", ADD, "--cron", "0 3 * * *", "--args", "[1, 2]") == "nightly: changed\n"
    assert schedule("update", "nightly", ADD, "--cron", "0 3 * * *", "--args", "[1, 2]") == "nightly: unchanged\n"
    assert Schedule.objects.get().cron == "0 3 * * *"
    assert "not_found: " in refusal("update", "other", ADD, "--cron", "0 3 * * *", "--args", "[1, 2]")


@pytest.mark.django_db
def test_pause_with_a_reason_resume_trigger_and_delete_are_audited_in_order():
    schedule("create", "tick", ADD, "--every", "60", "--args", "[1, 2]")
    assert schedule("pause", "tick", "--reason", "maintenance") == "tick: paused\n"
    row = Schedule.objects.get()
    assert row.paused and row.pause_reason == "maintenance"
    assert "state      paused (maintenance)" in schedule("show", "tick")
    assert schedule("resume", "tick") == "tick: resumed\n" and not Schedule.objects.get().paused
    execution_id = schedule("trigger", "tick").strip()
    assert ExecutionState.objects.filter(execution_id=execution_id).exists()
    assert f"started (trigger)  {execution_id}" in schedule("show", "tick")
    assert schedule("delete", "tick") == "tick: deleted\n" and not Schedule.objects.exists()
    assert [action for action, _, _ in audit_of("tick")] == [
        "schedule_create",
        "schedule_pause",
        "schedule_resume",
        "schedule_trigger",
        "schedule_delete",
    ]
    assert {(actor, via) for _, actor, via in audit_of("tick")} == {(_cli.cli_actor(), "cli")}


@pytest.mark.django_db
def test_backfill_creates_each_missing_tick_once():
    schedule("create", "hourly", ADD, "--every", "3600", "--args", "[1, 2]", "--start", "2026-01-01T00:00Z")
    argv = ("backfill", "hourly", "--start", "2026-01-01T00:00Z", "--end", "2026-01-01T05:00Z")
    assert schedule(*argv).startswith("hourly: 6 tick(s) from 2026-01-01 00:00:00 UTC to 2026-01-01 05:00:00 UTC")
    assert ExecutionState.objects.count() == 6
    schedule(*argv)
    assert ExecutionState.objects.count() == 6


BAD_INPUT = {
    "cron": (("--cron", "61 * * * *"), "invalid_schedule: cron: "),
    "timezone": (("--cron", "* * * * *", "--tz", "Mars/Olympus_Mons"), "invalid_schedule: timezone: "),
    "timezone-too-long": (("--cron", "* * * * *", "--tz", "a" * 300), "validation_failed: --tz "),
    "interval-zero": (("--every", "0"), "invalid_schedule: interval_seconds: "),
    "interval-negative": (("--every", "-1"), "invalid_schedule: interval_seconds: "),
    "interval-text": (("--every", "often"), "invalid_schedule: interval_seconds: "),
    "no-spec": ((), "invalid_schedule: cron: "),
    "overlap": (("--every", "1", "--overlap", "sometimes"), "invalid_schedule: overlap: "),
    "arguments": (("--every", "1", "--args", '["x", "y", "z"]'), "invalid_schedule: arguments: "),
    "arguments-json": (("--every", "1", "--args", "[1,"), "validation_failed: --args is not valid JSON"),
    "nul": (("--every", "1", "--args", '["a\\u0000"]'), "unsupported_value: "),
    "start-naive": (("--every", "1", "--start", "2030-01-01T00:00"), "validation_failed: --start needs a time zone"),
    "start-year-1": (("--every", "1", "--start", "0001-01-01T00:00+14:00"), "validation_failed: --start must fall"),
}


@pytest.mark.django_db
@pytest.mark.parametrize("case", BAD_INPUT, ids=list(BAD_INPUT))
def test_bad_input_is_refused_naming_the_field_and_nothing_is_created(case):
    options, expected = BAD_INPUT[case]
    assert expected in refusal("create", "s", ADD, "--args", "[1, 2]", *options)
    assert not Schedule.objects.exists()


@pytest.mark.django_db
def test_an_unknown_target_or_schedule_is_refused():
    assert "invalid_schedule: ffqn: " in refusal("create", "s", "test:acts/basic.nope", "--every", "1")
    assert "invalid_schedule: schedule_id: " in refusal("create", "a b", ADD, "--every", "1", "--args", "[1, 2]")
    for action in ("show", "pause", "resume", "trigger", "delete"):
        assert "not_found: schedule `nope` does not exist" in refusal(action, "nope")
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_creating_an_existing_id_is_refused_as_a_conflict():
    schedule("create", "s", ADD, "--every", "1", "--args", "[1, 2]")
    assert "conflict: " in refusal("create", "s", ADD, "--every", "5", "--args", "[1, 2]")
    assert Schedule.objects.get().interval_seconds == 1


@pytest.mark.django_db(transaction=True)
def test_as_a_process_a_refusal_is_one_line_and_success_prints_the_result():
    refused("obelisk_schedule", "create", "s", ADD, "--cron", "* * *", code="invalid_schedule")
    refused("obelisk_schedule", "create", "s", ADD, "--every", "1", "--tz", "x" * 100_000, code="validation_failed")
    refused("obelisk_schedule", "show", "s\x01", code="invalid_schedule")
    refused("obelisk_schedule", "frobnicate", code="usage_error", status=_cli.EXIT_USAGE)
    assert not Schedule.objects.exists()
    created = run("obelisk_schedule", "create", "s", ADD, "--every", "60", "--args", "[1, 2]")
    assert created.returncode == 0, created.stderr
    assert created.stdout.decode().startswith("s: created, next ")
    assert Schedule.objects.get().next_tick_at <= datetime.now(UTC) + timedelta(seconds=60)
    assert schedules.get("s").ffqn == ADD
