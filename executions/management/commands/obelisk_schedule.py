"""``obelisk_schedule list|show|create|update|pause|resume|trigger|backfill|delete``.

Through ``executions.schedules``, audited as ``cli_actor()`` with ``via="cli"``. Bad input
is one bounded line on stderr (``CommandError: <code>: …``) and writes nothing: a spec the
core refuses names its field (``invalid_schedule: cron: …``), and text the database cannot
hold (NUL, invalid UTF-8 in argv) or too long for its column is refused before any query.

why: D113, D116
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from executions import errors, schedules
from executions.management.commands._cli import ObeliskCommand, cli_actor, fail, invalid, parse_seconds
from executions.models.triggers import OVERLAP_POLICIES
from executions.schedule_spec import SpecError, check_schedule_id

VIA = "cli"
TICKS_SHOWN = 10
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
LIMITS = {"FFQN": 512, "--cron": 256, "--tz": 64, "--reason": 2000}  # the columns' lengths


class Command(ObeliskCommand):
    help = "Schedules: list, show, create, change, pause, resume, trigger now, backfill a past range, delete."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("list", help="every schedule: id, state, target, spec, next fire time")
        show = sub.add_parser("show", help="one schedule: its spec, next five fire times and last ticks")
        show.add_argument("schedule_id", metavar="ID")
        create = sub.add_parser("create", help="create a schedule of FFQN (an existing ID is refused)")
        create.add_argument("schedule_id", metavar="ID")
        create.add_argument("ffqn", metavar="FFQN", help="e.g. py:demo/workflows.report")
        _spec_options(create)
        create.add_argument("--paused", action="store_true", help="create it paused")
        update = sub.add_parser("update", help="replace a schedule's target and spec (pausing is kept)")
        update.add_argument("schedule_id", metavar="ID")
        update.add_argument("ffqn", metavar="FFQN")
        _spec_options(update)
        pause = sub.add_parser("pause", help="stop ticking")
        pause.add_argument("schedule_id", metavar="ID")
        pause.add_argument("--reason", default="paused by an operator", help="shown in the console")
        for name, text in (
            ("resume", "tick again from the next tick after now"),
            ("trigger", "start one tick now (even while paused); prints its execution id"),
            ("delete", "delete the schedule and its tick records (its executions stay)"),
        ):
            sub.add_parser(name, help=text).add_argument("schedule_id", metavar="ID")
        backfill = sub.add_parser("backfill", help="create each tick of [--start, --end] that does not exist yet")
        backfill.add_argument("schedule_id", metavar="ID")
        backfill.add_argument("--start", required=True, help="ISO 8601 with a time zone, e.g. 2026-01-01T00:00Z")
        backfill.add_argument("--end", required=True, help="ISO 8601 with a time zone")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    # -- reading -------------------------------------------------------------------------

    def _list(self, **_):
        for row in schedules.list_all():
            state = _state(row)
            upcoming = _upcoming(row, 1)
            after = f"next {_when(upcoming[0])}" if upcoming else "no next tick"
            self.stdout.write(f"{row.schedule_id}  {state}  {row.ffqn}  {_spec_text(row)}  {after}")

    def _show(self, schedule_id, **_):
        row = schedules.get(_checked_id(schedule_id))
        self.stdout.write(f"schedule   {row.schedule_id} ({row.source})")
        self.stdout.write(f"target     {row.ffqn} {json.dumps(row.arguments)}")
        self.stdout.write(f"spec       {_spec_text(row)}")
        self.stdout.write(
            f"policy     overlap {row.overlap}, catch-up window {row.catchup_window_seconds:g} s, "
            f"jitter {row.jitter_seconds:g} s"
        )
        self.stdout.write(f"state      {_state(row)}")
        self.stdout.write("next fire times:")
        for moment in _upcoming(row, 5) or []:
            self.stdout.write(f"  {_when(moment)}")
        ticks = schedules.ticks(row.schedule_id, limit=TICKS_SHOWN)
        self.stdout.write("last ticks:" if ticks else "last ticks: none yet")
        for tick in ticks:
            how = f" ({tick.manual})" if tick.manual else ""
            reason = f"  {tick.reason}" if tick.reason else ""
            self.stdout.write(f"  {_when(tick.nominal_at)}  {tick.action}{how}  {tick.execution_id or '-'}{reason}")

    # -- acting --------------------------------------------------------------------------

    def _create(self, schedule_id, paused, **options):
        row = schedules.create(_request(schedule_id, **options), paused=paused, actor=cli_actor(), via=VIA)
        upcoming = _upcoming(row, 1)
        after = f", next {_when(upcoming[0])}" if upcoming else ""
        self.stdout.write(f"{row.schedule_id}: created{' paused' if row.paused else ''}{after}")

    def _update(self, schedule_id, **options):
        row, outcome = schedules.update(_request(schedule_id, **options), actor=cli_actor(), via=VIA)
        self.stdout.write(f"{row.schedule_id}: {outcome}")

    def _pause(self, schedule_id, reason, **_):
        schedule_id = _existing(schedule_id)
        schedules.pause(schedule_id, reason=_checked_text(reason, "--reason"), actor=cli_actor(), via=VIA)
        self.stdout.write(f"{schedule_id}: paused")

    def _resume(self, schedule_id, **_):
        schedule_id = _existing(schedule_id)
        schedules.resume(schedule_id, actor=cli_actor(), via=VIA)
        self.stdout.write(f"{schedule_id}: resumed")

    def _trigger(self, schedule_id, **_):
        schedule_id = _existing(schedule_id)
        self.stdout.write(schedules.trigger(schedule_id, actor=cli_actor(), via=VIA))

    def _backfill(self, schedule_id, start, end, **_):
        schedule_id = _existing(schedule_id)
        start, end = _moment(start, "--start"), _moment(end, "--end")
        ticks = schedules.backfill(schedule_id, start, end, actor=cli_actor(), via=VIA)
        self.stdout.write(
            f"{schedule_id}: {len(ticks)} tick(s) from {_when(start)} to {_when(end)}; "
            "each exists once (a tick that existed already was not created again)"
        )

    def _delete(self, schedule_id, **_):
        schedule_id = _existing(schedule_id)
        schedules.delete(schedule_id, actor=cli_actor(), via=VIA)
        self.stdout.write(f"{schedule_id}: deleted")


def _spec_options(parser) -> None:
    parser.add_argument("--cron", default="", help='5 fields, or 6 with seconds, e.g. "0 2 * * *"')
    parser.add_argument("--every", metavar="SECONDS", help="an interval (with or instead of --cron)")
    parser.add_argument("--tz", default="UTC", help="an IANA time zone, e.g. Europe/Prague (default UTC)")
    parser.add_argument(
        "--args", dest="arguments", default="[]", help="the arguments as JSON, e.g. '[1, 2]' or '{\"a\": 1}'"
    )
    parser.add_argument("--overlap", default="skip", help=f"one of {', '.join(OVERLAP_POLICIES)} (default skip)")
    parser.add_argument("--catchup-window", metavar="SECONDS", default="60", help="late ticks still run (default 60)")
    parser.add_argument("--jitter", metavar="SECONDS", default="0", help="delay each tick by up to this much")
    parser.add_argument("--start", help="no tick before this (ISO 8601 with a time zone)")
    parser.add_argument("--end", help="no tick after this (ISO 8601 with a time zone)")


def _request(schedule_id, ffqn, cron, every, tz, arguments, overlap, catchup_window, jitter, start, end, **_):
    return schedules.ScheduleRequest(
        schedule_id=_checked_id(schedule_id),
        ffqn=_checked_text(ffqn, "FFQN"),
        arguments=_json_arguments(arguments),
        cron=_checked_text(cron, "--cron"),
        interval_seconds=_number(every, "--every", "interval_seconds"),
        timezone=_checked_text(tz, "--tz"),
        start_at=_moment(start, "--start"),
        end_at=_moment(end, "--end"),
        jitter_seconds=_number(jitter, "--jitter", "jitter_seconds"),
        overlap=_checked_text(overlap, "--overlap"),
        catchup_window_seconds=parse_seconds(catchup_window, "--catchup-window"),
    )


def _checked_id(schedule_id: str) -> str:
    try:
        return check_schedule_id(schedule_id)
    except SpecError as error:
        raise fail(error) from None


def _existing(schedule_id: str) -> str:
    """The id of an existing schedule (unknown: ``not_found``, before anything is audited)."""
    return schedules.get(_checked_id(schedule_id)).schedule_id


def _checked_text(value: str, what: str) -> str:
    """``value`` if the database can store it: valid Unicode, no NUL, short enough."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise fail(errors.UnsupportedValue(f"{what} is not valid UTF-8: `{errors.excerpt(value)}`")) from None
    if "\x00" in value:
        raise fail(errors.UnsupportedValue(f"{what} contains a NUL character: `{errors.excerpt(value)}`"))
    limit = LIMITS.get(what)
    if limit is not None and len(value) > limit:
        raise invalid(f"{what} must be at most {limit} characters, got `{errors.excerpt(value)}`")
    return value


def _json_arguments(text: str):
    try:
        return json.loads(_checked_text(text, "--args"))
    except RecursionError:
        raise invalid("--args is nested too deeply to parse") from None
    except ValueError as error:
        raise invalid(f"--args is not valid JSON: {errors.excerpt(str(error), 200)}") from None


def _number(text: str | None, option: str, field_name: str) -> float | None:
    """A number for the core to check (so ``--every 0`` is refused naming the field)."""
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        raise fail(
            SpecError(field_name, f"{option} must be a number of seconds, got `{errors.excerpt(text)}`")
        ) from None


def _moment(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 time with a time zone, between 1970 and 9000 in UTC."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(_checked_text(text, option))
    except ValueError:
        raise invalid(f"{option} must be an ISO 8601 date-time, got `{errors.excerpt(text)}`") from None
    if moment.tzinfo is None:
        raise invalid(f"{option} needs a time zone (e.g. `Z` or `+01:00`), got `{errors.excerpt(text)}`")
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:
        moment = None
    if moment is None or not EARLIEST <= moment < LATEST:
        raise invalid(f"{option} must fall between 1970-01-01 and 9000-01-01 in UTC, got `{errors.excerpt(text)}`")
    return moment


def _upcoming(row, count: int) -> list[datetime]:
    try:
        return schedules.next_fire_times(row, count)
    except OverflowError:
        return []


def _state(row) -> str:
    if not row.paused:
        return "active"
    return f"paused ({row.pause_reason})" if row.pause_reason else "paused"


def _when(moment: datetime) -> str:
    return f"{moment.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _spec_text(row) -> str:
    parts = []
    if row.cron:
        parts.append(f'cron "{row.cron}" {row.timezone}')
    if row.interval_seconds:
        parts.append(f"every {row.interval_seconds:g} s")
    if row.start_at:
        parts.append(f"from {_when(row.start_at)}")
    if row.end_at:
        parts.append(f"until {_when(row.end_at)}")
    return ", ".join(parts)
