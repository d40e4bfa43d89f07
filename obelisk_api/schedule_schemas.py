"""The bodies of the schedules' routes (``routes.schedules``), as the OpenAPI document shows them.

Lengths are the columns' (``t_schedule``), checked here so that text too long for a column
is a 422 naming the field, not a database error. Everything else about a spec (the cron
string, the time zone, the interval, the target and its arguments) is checked by
``executions.schedules`` and refused as 400 ``invalid_schedule`` with the field, so that
every face refuses the same input in the same words.

why: D113
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from ninja import Schema
from pydantic import AwareDatetime, Field, StrictBool, StrictFloat, StrictStr, WithJsonSchema

from executions.models.triggers import OVERLAP_POLICIES
from executions.schedule_spec import SpecError
from obelisk_api.schemas import ExecutionIdText, Strict

SCHEDULE_ID_PATTERN = r"^[A-Za-z0-9_.:-]{1,128}$"
# Ticks fall in these years: a spec near year 9999 would tick past what a datetime holds.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)

# Only shown: ``check_schedule_id`` checks it, so a malformed id is a 400 that says why.
ScheduleIdText = Annotated[
    str,
    WithJsonSchema({"type": "string", "pattern": SCHEDULE_ID_PATTERN, "description": "letters, digits, `_ - . :`"}),
]
Overlap = Literal[tuple(OVERLAP_POLICIES)]  # type: ignore[valid-type]


def within_range(value: datetime | None, field_name: str) -> datetime | None:
    """``value`` in UTC, refused (naming the field) outside 1970 to 9000: year 1 at +14:00
    does not convert to UTC, and a tick near year 9999 overflows."""
    if value is None:
        return None
    try:
        moment = value.astimezone(UTC)
    except OverflowError:
        moment = None
    if moment is None or not EARLIEST <= moment < LATEST:
        raise SpecError(field_name, "must fall between 1970-01-01 and 9000-01-01 in UTC")
    return moment


class ScheduleSpecIn(Strict):
    """A schedule's target and spec (PUT replaces all of it)."""

    function: Annotated[StrictStr, Field(max_length=512, description="e.g. `test:acts/basic.add`")]
    arguments: list[Any] | dict[str, Any] = []
    cron: Annotated[StrictStr, Field(max_length=256, description="5 fields, or 6 with seconds")] = ""
    interval_seconds: StrictFloat | None = None
    timezone: Annotated[StrictStr, Field(max_length=64, description="an IANA name")] = "UTC"
    start_at: AwareDatetime | None = None
    end_at: AwareDatetime | None = None
    jitter_seconds: StrictFloat = 0
    overlap: Overlap = "skip"
    catchup_window_seconds: StrictFloat = 60


class ScheduleIn(ScheduleSpecIn):
    schedule_id: Annotated[StrictStr, Field(max_length=128, description="letters, digits, `_ - . :`")]
    paused: StrictBool = False


class PauseIn(Strict):
    reason: Annotated[StrictStr, Field(max_length=2000)] = "paused by an operator"


class BackfillIn(Strict):
    start: AwareDatetime
    end: AwareDatetime


class TickOut(Schema):
    nominal_at: datetime
    action: str  # started, skipped, buffered, missed, failed, superseded
    execution_id: ExecutionIdText | None
    manual: str | None  # trigger or backfill; none for the clock's ticks
    reason: str
    recorded_at: datetime


class ScheduleOut(Schema):
    schedule_id: ScheduleIdText
    function: str
    arguments: list[Any] | dict[str, Any]
    cron: str
    interval_seconds: float | None
    timezone: str
    start_at: datetime | None
    end_at: datetime | None
    jitter_seconds: float
    overlap: str
    catchup_window_seconds: float
    paused: bool
    pause_reason: str
    source: str  # code (declared with @schedule) or runtime
    next_fire_times: list[datetime]  # the next five; none while paused or once ended
    last_tick_at: datetime | None
    running_execution_id: ExecutionIdText | None
    created_at: datetime
    updated_at: datetime


class ScheduleDetailOut(ScheduleOut):
    ticks: list[TickOut]  # the last ticks, newest first


class ScheduleChangedOut(ScheduleOut):
    outcome: str  # changed or unchanged


class ScheduleListOut(Schema):
    items: list[ScheduleOut]


class TriggeredOut(Schema):
    schedule_id: ScheduleIdText
    execution_id: ExecutionIdText


class BackfilledOut(Schema):
    schedule_id: ScheduleIdText
    ticks: list[TickOut]
