"""Schedules: list, read, create, change, delete, pause, resume, trigger and backfill.

Every route goes through ``executions.schedules`` (the client-level API every face shares).
Reading needs the view permission (the API's default); the rest need the act permission
and is audited under ``schedule:<id>`` with the caller's username, ``via="api"``. A
schedule id in the path is checked before any query (400 ``invalid_schedule``), so text the
database cannot compare (NUL) never reaches it.

why: D113, D116
"""

from __future__ import annotations

from ninja import Router, Status

from executions import errors, schedules, store
from executions.models import Schedule, ScheduleTick
from executions.schedule_spec import check_schedule_id
from obelisk_api.auth import ACT, actor
from obelisk_api.schedule_schemas import (
    BackfilledOut,
    BackfillIn,
    PauseIn,
    ScheduleChangedOut,
    ScheduleDetailOut,
    ScheduleIdText,
    ScheduleIn,
    ScheduleListOut,
    ScheduleOut,
    ScheduleSpecIn,
    TriggeredOut,
    within_range,
)
from obelisk_api.schemas import BY_ID, POSTED, SIGNED_IN, VALIDATED, ErrorOut

router = Router(tags=["schedules"])
VIA = "api"
ACTING = {"auth": ACT}
TICKS_SHOWN = 20

LIST_ERRORS = SIGNED_IN
READ_ERRORS = SIGNED_IN | BY_ID
CREATE_ERRORS = SIGNED_IN | POSTED | VALIDATED | {409}  # 400 `invalid_schedule` names the field
UPDATE_ERRORS = SIGNED_IN | POSTED | BY_ID | VALIDATED
ACTION_ERRORS = SIGNED_IN | POSTED | BY_ID
BODY_ACTION_ERRORS = ACTION_ERRORS | VALIDATED


# -- rendering ---------------------------------------------------------------------------


def upcoming(row: Schedule) -> list:
    """The next five fire times; fewer where the spec ends (or would leave the calendar)."""
    try:
        return schedules.next_fire_times(row, 5)
    except OverflowError:
        return []


def tick_out(tick: store.Tick) -> dict:
    return {
        "nominal_at": tick.nominal_at,
        "action": tick.action,
        "execution_id": tick.execution_id or None,
        "manual": tick.manual or None,
        "reason": tick.reason,
        "recorded_at": tick.recorded_at,
    }


def schedule_out(row: Schedule) -> dict:
    return {
        "schedule_id": row.schedule_id,
        "function": row.ffqn,
        "arguments": row.arguments,
        "cron": row.cron,
        "interval_seconds": row.interval_seconds,
        "timezone": row.timezone,
        "start_at": row.start_at,
        "end_at": row.end_at,
        "jitter_seconds": row.jitter_seconds,
        "overlap": row.overlap,
        "catchup_window_seconds": row.catchup_window_seconds,
        "paused": row.paused,
        "pause_reason": row.pause_reason,
        "source": row.source,
        "next_fire_times": upcoming(row),
        "last_tick_at": row.last_tick_at,
        "running_execution_id": row.running_execution_id or None,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


def request_of(schedule_id: str, body: ScheduleSpecIn) -> schedules.ScheduleRequest:
    return schedules.ScheduleRequest(
        schedule_id=check_schedule_id(schedule_id),
        ffqn=body.function,
        arguments=body.arguments,
        cron=body.cron,
        interval_seconds=body.interval_seconds,
        timezone=body.timezone,
        start_at=within_range(body.start_at, "start_at"),
        end_at=within_range(body.end_at, "end_at"),
        jitter_seconds=body.jitter_seconds,
        overlap=body.overlap,
        catchup_window_seconds=body.catchup_window_seconds,
    )


def existing(schedule_id: str) -> Schedule:
    """The schedule, or 400 for a malformed id and 404 for an unknown one: before an
    audited action, so that acting on nothing writes nothing."""
    return schedules.get(check_schedule_id(schedule_id))


# -- reading -----------------------------------------------------------------------------


@router.get("/schedules", response={200: ScheduleListOut, LIST_ERRORS: ErrorOut})
def list_schedules(request):
    """Every schedule by id, with its next five fire times."""
    return {"items": [schedule_out(row) for row in schedules.list_all()]}


@router.get("/schedules/{schedule_id}", response={200: ScheduleDetailOut, READ_ERRORS: ErrorOut})
def get_schedule(request, schedule_id: ScheduleIdText):
    """The schedule, its next five fire times and its last ticks (newest first): what each
    did (`started`, `skipped`, `buffered`, `missed`, `failed`, `superseded`) and the
    execution it started."""
    row = existing(schedule_id)
    return {**schedule_out(row), "ticks": [tick_out(t) for t in schedules.ticks(schedule_id, limit=TICKS_SHOWN)]}


# -- acting ------------------------------------------------------------------------------


@router.post("/schedules", response={201: ScheduleOut, CREATE_ERRORS: ErrorOut}, **ACTING)
def create_schedule(request, body: ScheduleIn):
    """Create a schedule: 201. An existing id is 409 (change it with PUT); an invalid cron
    string, time zone, interval or target is 400 `invalid_schedule` naming the field, and
    nothing is created."""
    row = schedules.create(request_of(body.schedule_id, body), paused=body.paused, actor=actor(request), via=VIA)
    return Status(201, schedule_out(row))


@router.put("/schedules/{schedule_id}", response={200: ScheduleChangedOut, UPDATE_ERRORS: ErrorOut}, **ACTING)
def update_schedule(request, schedule_id: ScheduleIdText, body: ScheduleSpecIn):
    """Replace the target and spec (pausing is kept). A changed spec ticks from now on;
    `outcome` is `unchanged` when the body is what the schedule already was."""
    row, outcome = schedules.update(request_of(schedule_id, body), actor=actor(request), via=VIA)
    return {**schedule_out(row), "outcome": outcome}


@router.delete("/schedules/{schedule_id}", response={204: None, READ_ERRORS: ErrorOut}, **ACTING)
def delete_schedule(request, schedule_id: ScheduleIdText):
    """Delete the schedule and its tick records: 204. The executions it started stay."""
    existing(schedule_id)
    if not schedules.delete(schedule_id, actor=actor(request), via=VIA):
        raise errors.NotFound(f"schedule `{schedule_id}` does not exist")
    return Status(204, None)


@router.post("/schedules/{schedule_id}/pause", response={200: ScheduleOut, BODY_ACTION_ERRORS: ErrorOut}, **ACTING)
def pause_schedule(request, schedule_id: ScheduleIdText, body: PauseIn | None = None):
    """Stop ticking (optional body `{"reason": …}`, shown in the console)."""
    existing(schedule_id)
    reason = body.reason if body is not None else PauseIn().reason
    schedules.pause(schedule_id, reason=reason, actor=actor(request), via=VIA)
    return schedule_out(schedules.get(schedule_id))


@router.post("/schedules/{schedule_id}/resume", response={200: ScheduleOut, ACTION_ERRORS: ErrorOut}, **ACTING)
def resume_schedule(request, schedule_id: ScheduleIdText):
    """Tick again from the next tick after now (the paused time is not caught up)."""
    existing(schedule_id)
    schedules.resume(schedule_id, actor=actor(request), via=VIA)
    return schedule_out(schedules.get(schedule_id))


@router.post("/schedules/{schedule_id}/trigger", response={201: TriggeredOut, ACTION_ERRORS: ErrorOut}, **ACTING)
def trigger_schedule(request, schedule_id: ScheduleIdText):
    """Start one tick now, whatever the overlap policy, even while paused: 201 with its
    execution id."""
    existing(schedule_id)
    execution_id = schedules.trigger(schedule_id, actor=actor(request), via=VIA)
    return Status(201, {"schedule_id": schedule_id, "execution_id": execution_id})


@router.post("/schedules/{schedule_id}/backfill", response={200: BackfilledOut, BODY_ACTION_ERRORS: ErrorOut}, **ACTING)
def backfill_schedule(request, schedule_id: ScheduleIdText, body: BackfillIn):
    """Create every tick of `[start, end]` that does not exist yet (a tick that fired
    already is the same execution, not a second one); the ticks of the range."""
    existing(schedule_id)
    start, end = within_range(body.start, "start"), within_range(body.end, "end")
    schedules.backfill(schedule_id, start, end, actor=actor(request), via=VIA)
    return {"schedule_id": schedule_id, "ticks": [tick_out(t) for t in backfilled(schedule_id, start, end)]}


def backfilled(schedule_id: str, start, end) -> list[store.Tick]:
    """Each tick of the range once, oldest first, as its newest backfill recorded it (the
    store's answer lists the newest records, so a range backfilled twice shows half of it
    twice)."""
    rows = ScheduleTick.objects.filter(
        schedule_id=schedule_id, manual="backfill", nominal_at__gte=start, nominal_at__lte=end
    ).order_by("nominal_at", "id")
    newest = {row.nominal_at: row for row in rows}
    return [
        store.Tick(r.schedule_id, r.nominal_at, r.action, r.execution_id, r.manual, r.reason, r.recorded_at)
        for r in newest.values()
    ]
