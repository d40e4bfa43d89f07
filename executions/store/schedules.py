"""Schedules: their rows, and firing their due ticks as executions (D113).

A tick is fired by the timer sweep of any cluster: ``fire_due_schedules`` takes each due
schedule's row with ``FOR UPDATE SKIP LOCKED`` (SQLite's ``BEGIN IMMEDIATE`` serialises
instead), decides what its due ticks do (``schedule_spec.plan_ticks``), creates the ticks
that start, records every tick, and moves ``next_tick_at`` on: one transaction per
schedule, so a tick's execution and the schedule's progress commit together or not at all.
A tick's execution id is derived from the schedule's key and the tick's time
(``schedule_spec.tick_execution_id``), so a tick created twice (a backfill over fired ticks,
a race the row lock did not see) is the same execution (decision 13).

The store knows nothing of functions' signatures: the caller passes ``prepare``, which
turns a tick into a ``CreateRequest`` (``executions.schedules`` validates against the
catalogue) or raises ``TargetFailed``; then the schedule is paused with that reason.

why: D113, D114, D115, D116
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from django.db import connection
from ulid import ULID

from executions import errors
from executions.models import ExecutionState, Schedule, ScheduleTick
from executions.schedule_spec import Overlap, ScheduleSpec, plan_ticks, tick_execution_id
from executions.state_machine import State
from executions.store.common import utc_now, write_transaction
from executions.store.create import create
from executions.store.datatypes import CreateRequest
from executions.store.lifecycle import cancel

__all__ = [
    "FireReport",
    "ScheduleDefinition",
    "TargetFailed",
    "Tick",
    "backfill_schedule",
    "delete_schedule",
    "fire_due_schedules",
    "get_schedule",
    "list_schedule_ticks",
    "list_schedules",
    "next_schedule_due_at",
    "save_schedule",
    "spec_of",
    "set_schedule_paused",
    "trigger_schedule",
]

TICKS_KEPT = 200  # per schedule: about the newest tick records; older ones are deleted as ticks fire
TRIM_CHANCE = 1 / 16  # a firing trims its schedule's old tick records with this chance
BUFFER_RECHECK = timedelta(seconds=1)  # how often a schedule with buffered ticks looks again
MAX_BACKFILL = 10_000


class TargetFailed(errors.ValidationFailed):
    """A schedule's target cannot be submitted (unknown function, arguments that no longer fit)."""

    code = "schedule_target_failed"


@dataclass(frozen=True)
class ScheduleDefinition:
    """What a schedule is, as its author wrote it (the rest of the row is its progress)."""

    schedule_id: str
    ffqn: str
    arguments: list | dict
    spec: ScheduleSpec
    overlap: Overlap = Overlap.SKIP
    catchup_window: timedelta = timedelta(minutes=1)
    source: str = "runtime"

    def columns(self) -> dict:
        spec = self.spec
        return {
            "ffqn": self.ffqn,
            "arguments": self.arguments,
            "cron": spec.cron,
            "interval_seconds": spec.interval.total_seconds() if spec.interval else None,
            "timezone": spec.timezone,
            "start_at": spec.start_at,
            "end_at": spec.end_at,
            "jitter_seconds": spec.jitter.total_seconds(),
            "overlap": self.overlap.value,
            "catchup_window_seconds": self.catchup_window.total_seconds(),
            "source": self.source,
        }


def spec_of(row: Schedule) -> ScheduleSpec:
    return ScheduleSpec.parse(
        cron=row.cron,
        interval_seconds=row.interval_seconds,
        timezone=row.timezone,
        start_at=row.start_at,
        end_at=row.end_at,
        jitter_seconds=row.jitter_seconds,
    )


@dataclass(frozen=True)
class Tick:
    """One tick and what it did."""

    schedule_id: str
    nominal_at: datetime
    action: str
    execution_id: str
    manual: str
    reason: str
    recorded_at: datetime


Prepare = Callable[[Schedule, datetime, str], CreateRequest]


# -- definitions ---------------------------------------------------------------------------


def save_schedule(
    definition: ScheduleDefinition, *, mode: str, paused: bool | None = None, now=None
) -> tuple[Schedule, str]:
    try:
        return _save_schedule(definition, mode=mode, paused=paused, now=now)
    except errors.Conflict:
        if mode != "upsert":
            raise
        # Another process created it between this one's read and its insert (two workers
        # starting at once apply the same @schedule): it exists now, so this is an update.
        return _save_schedule(definition, mode="update", paused=paused, now=now)


def _save_schedule(
    definition: ScheduleDefinition, *, mode: str, paused: bool | None = None, now=None
) -> tuple[Schedule, str]:
    """Create (``mode="create"``; an existing id is ``Conflict``), change (``"update"``; a
    missing one is ``NotFound``) or either (``"upsert"``, for schedules declared in code).
    Returns the row and ``created``, ``changed`` or ``unchanged``. A changed spec starts
    ticking from now; ticks already fired stay fired. Pausing is kept unless ``paused`` is
    given (a schedule paused at run time stays paused when its code is applied again)."""
    now = utc_now(now)
    columns = definition.columns()
    with write_transaction():
        row = _row_for_update(definition.schedule_id, missing_ok=True)
        if row is None:
            if mode == "update":
                raise errors.NotFound(f"schedule `{definition.schedule_id}` does not exist")
            row = Schedule.store_objects.create(
                schedule_id=definition.schedule_id,
                key=str(ULID()),
                paused=bool(paused),
                created_at=now,
                updated_at=now,
                **columns,
                **_progress_from(definition.spec, now),
            )
            return row, "created"
        if mode == "create":
            raise errors.Conflict(f"schedule `{definition.schedule_id}` already exists; change it with an update")
        same = all(_same(getattr(row, name), value) for name, value in columns.items())
        if same and (paused is None or paused == row.paused):
            return row, "unchanged"
        if not same:
            for name, value in columns.items():
                setattr(row, name, value)
            _drop_buffered(row, "dropped: the schedule was changed", now)
            row.__dict__.update(_progress_from(definition.spec, now))
        if paused is not None:
            row.paused = paused
        row.updated_at = now
        row.save()
        return row, "changed"


def _same(old, new) -> bool:
    if isinstance(old, float) or isinstance(new, float):
        return old is not None and new is not None and abs(float(old) - float(new)) < 1e-9 or old == new
    return old == new


def _progress_from(spec: ScheduleSpec, now: datetime) -> dict:
    next_tick = spec.next_after(now)
    return {"next_tick_at": next_tick, "due_at": next_tick, "buffered": []}


def _drop_buffered(row: Schedule, reason: str, now: datetime) -> None:
    """Ticks waiting in the buffer that a resume or a change empties are recorded as
    ``skipped``: a ``buffered`` record is a tick still waiting."""
    if row.buffered:
        ScheduleTick.store_objects.filter(schedule_id=row.schedule_id, action="buffered").update(
            action="skipped", reason=reason, recorded_at=now
        )


def delete_schedule(schedule_id: str) -> bool:
    """Delete a schedule and its tick records; its executions stay. Returns whether it existed."""
    with write_transaction():
        deleted, _ = Schedule.store_objects.filter(schedule_id=schedule_id).delete()
        ScheduleTick.store_objects.filter(schedule_id=schedule_id).delete()
    return bool(deleted)


def set_schedule_paused(schedule_id: str, paused: bool, *, reason: str = "", now=None) -> bool:
    """Pause or resume. Resuming starts from the next tick after now: the ticks of the
    paused time are not caught up. Returns whether anything changed."""
    now = utc_now(now)
    with write_transaction():
        row = _row_for_update(schedule_id)
        if row.paused == paused and (not paused or row.pause_reason == reason):
            return False
        row.paused, row.pause_reason, row.updated_at = paused, reason if paused else "", now
        if not paused:
            _drop_buffered(row, "dropped: the schedule was paused", now)
            row.__dict__.update(_progress_from(spec_of(row), now))
        row.save()
    return True


def get_schedule(schedule_id: str) -> Schedule:
    row = Schedule.objects.filter(schedule_id=schedule_id).first()
    if row is None:
        raise errors.NotFound(f"schedule `{schedule_id}` does not exist")
    return row


def list_schedules() -> list[Schedule]:
    return list(Schedule.objects.order_by("schedule_id"))


def list_schedule_ticks(schedule_id: str, *, limit: int = 20) -> list[Tick]:
    """Its newest tick records, newest first."""
    rows = ScheduleTick.objects.filter(schedule_id=schedule_id).order_by("-nominal_at", "-id")[:limit]
    return [
        Tick(r.schedule_id, r.nominal_at, r.action, r.execution_id, r.manual, r.reason, r.recorded_at) for r in rows
    ]


def next_schedule_due_at() -> datetime | None:
    """When the earliest active schedule is due: one of the sweep's wake-ups."""
    return (
        Schedule.objects.filter(paused=False, due_at__isnull=False)
        .order_by("due_at")
        .values_list("due_at", flat=True)
        .first()
    )


# -- firing ------------------------------------------------------------------------------


@dataclass
class FireReport:
    started: int = 0
    dropped: int = 0
    paused: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.started or self.dropped or self.paused)


def fire_due_schedules(prepare: Prepare, *, now: datetime | None = None, limit: int = 100) -> FireReport:
    """Fire the ticks of every schedule due at ``now``, one transaction per schedule; a
    schedule another sweep holds is left to it."""
    now = utc_now(now)
    report = FireReport()
    due = (
        Schedule.objects.filter(paused=False, due_at__lte=now).order_by("due_at").values_list("schedule_id", flat=True)
    )
    for schedule_id in list(due[:limit]):
        try:
            with write_transaction():
                row = _row_for_update(schedule_id, missing_ok=True, skip_locked=True)
                if row is None or row.paused or row.due_at is None or row.due_at > now:
                    continue
                _fire(row, prepare, now, report)
        except errors.StoreError as error:  # this schedule's trouble is not the others'
            report.errors.append(f"{schedule_id}: {error}")
    return report


def _fire(row: Schedule, prepare: Prepare, now: datetime, report: FireReport) -> None:
    spec = spec_of(row)
    due, next_tick = _due_ticks(row, spec, now)
    buffered = [datetime.fromisoformat(t) for t in row.buffered]
    running = _running(row.running_execution_id)
    plan = plan_ticks(
        due,
        buffered=buffered,
        running=running,
        overlap=Overlap(row.overlap),
        now=now,
        window=timedelta(seconds=row.catchup_window_seconds),
    )
    if plan.cancel_running and running:
        cancel(row.running_execution_id, now=now)
    for tick, action, reason in plan.dropped:
        _record(row, tick, action, reason=reason, now=now)
        report.dropped += 1
    for tick in [t for t in plan.buffered if t not in buffered]:
        _record(row, tick, "buffered", reason="waiting for the running execution", now=now)
    try:
        for tick in plan.start:
            row.running_execution_id = _start(row, spec, tick, prepare, now, was_buffered=tick in buffered)
            report.started += 1
    except TargetFailed as failure:
        _pause_for(row, tick, str(failure), now)
        report.paused.append(row.schedule_id)
        return
    row.buffered = [t.isoformat() for t in plan.buffered]
    row.next_tick_at = next_tick
    if due:
        row.last_tick_at = due[-1]
    recheck = now + BUFFER_RECHECK if plan.buffered else None
    row.due_at = min((t for t in (next_tick, recheck) if t is not None), default=None)
    row.updated_at = now
    row.save()
    if random.random() < TRIM_CHANCE:  # housekeeping, not every tick: it costs a query
        _trim_ticks(row.schedule_id)


def _due_ticks(row: Schedule, spec: ScheduleSpec, now: datetime) -> tuple[list[datetime], datetime | None]:
    """The ticks due by ``now`` and the next one after them. Ticks long past the catch-up
    window are stepped over in one jump (a 1-second schedule stopped for a day), recorded
    as one ``missed`` tick."""
    tick, due = row.next_tick_at, []
    window_start = now - timedelta(seconds=row.catchup_window_seconds)
    if tick is not None and tick < window_start - timedelta(seconds=1):
        jumped = spec.next_after(window_start - timedelta(microseconds=1))
        if jumped is not None and jumped > tick:
            _record(
                row,
                tick,
                "missed",
                reason=f"ticks from {tick:%Y-%m-%d %H:%M:%S} until {window_start:%Y-%m-%d %H:%M:%S} UTC missed (outside the catch-up window)",
                now=now,
            )
            tick = jumped
    while tick is not None and tick <= now and len(due) < 1000:
        due.append(tick)
        tick = spec.next_after(tick)
    return due, tick


def _running(execution_id: str) -> bool:
    if not execution_id:
        return False
    state = ExecutionState.objects.filter(execution_id=execution_id).values_list("state", flat=True).first()
    return state is not None and state != State.FINISHED


def _start(
    row: Schedule,
    spec: ScheduleSpec,
    tick: datetime,
    prepare: Prepare,
    now: datetime,
    *,
    manual: str = "",
    was_buffered: bool = False,
) -> str:
    execution_id = tick_execution_id(row.key, tick)
    request = prepare(row, tick, execution_id)
    jitter = spec.jitter_of(row.key, tick) if not manual else timedelta(0)
    if jitter:
        request = replace(request, scheduled_at=tick + jitter)
    try:
        outcome = create(request, now=now)
        reason = "it existed already" if outcome.already_existed else ""
    except errors.Conflict:
        reason = "an execution of this tick existed already, with another call"
    if manual == "backfill" and reason:  # a tick backfilled before: it is recorded already
        return execution_id
    if was_buffered:
        ScheduleTick.store_objects.filter(schedule_id=row.schedule_id, nominal_at=tick, action="buffered").update(
            action="started", execution_id=execution_id, reason=reason, recorded_at=now
        )
    else:
        _record(row, tick, "started", execution_id=execution_id, manual=manual, reason=reason, now=now)
    return execution_id


def _pause_for(row: Schedule, tick: datetime, reason: str, now: datetime) -> None:
    """The target cannot be submitted: record the failed tick and pause the schedule with
    the reason, so that the console shows it and the sweep goes on with the others."""
    _record(row, tick, "failed", reason=reason, now=now)
    Schedule.store_objects.filter(schedule_id=row.schedule_id).update(
        paused=True, pause_reason=reason, running_execution_id=row.running_execution_id, updated_at=now
    )


def _record(row: Schedule, tick: datetime, action: str, *, execution_id="", manual="", reason="", now) -> None:
    ScheduleTick.store_objects.create(
        schedule_id=row.schedule_id,
        nominal_at=tick,
        action=action,
        execution_id=execution_id,
        manual=manual,
        reason=reason[:2000],
        recorded_at=now,
    )


def _trim_ticks(schedule_id: str) -> None:
    boundary = (
        ScheduleTick.objects.filter(schedule_id=schedule_id)
        .order_by("-nominal_at", "-id")
        .values_list("id", flat=True)[TICKS_KEPT : TICKS_KEPT + 1]
    )
    cut = list(boundary)
    if cut:
        ScheduleTick.store_objects.filter(schedule_id=schedule_id, id__lte=cut[0]).exclude(action="buffered").delete()


# -- manual ticks ------------------------------------------------------------------------


def trigger_schedule(schedule_id: str, prepare: Prepare, *, now: datetime | None = None) -> str:
    """Start one tick now, whatever the overlap policy and pause (an operator asked for
    it). Returns the execution id."""
    now = utc_now(now)
    tick = now.replace(microsecond=now.microsecond // 1000 * 1000)
    with write_transaction():
        row = _row_for_update(schedule_id)
        execution_id = _start(row, spec_of(row), tick, prepare, now, manual="trigger")
        if not _running(row.running_execution_id):  # a clock tick that runs stays the one overlap waits for
            row.running_execution_id = execution_id
        row.updated_at = now
        row.save(update_fields=["running_execution_id", "updated_at"])
    return execution_id


def backfill_schedule(schedule_id: str, start: datetime, end: datetime, prepare: Prepare, *, now=None) -> list[Tick]:
    """Create every tick of the spec in ``[start, end]`` that does not exist yet, at once
    (overlap does not apply: a backfill asks for all of them). A tick fired before is the
    same execution (its id is derived from the tick), so it is not created again."""
    now = utc_now(now)
    start, end = utc_now(start), utc_now(end)
    if end < start:
        raise errors.ValidationFailed("backfill: end must not be before start")
    with write_transaction():
        row = _row_for_update(schedule_id)
        spec = spec_of(row)
        ticks = []
        tick = spec.next_after(start - timedelta(microseconds=1))
        while tick is not None and tick <= end:
            if len(ticks) >= MAX_BACKFILL:
                raise errors.ValidationFailed(
                    f"backfill: more than {MAX_BACKFILL} ticks in the range; backfill less at once"
                )
            ticks.append(tick)
            tick = spec.next_after(tick)
        started = [(tick, _start(row, spec, tick, prepare, now, manual="backfill")) for tick in ticks]
    return [Tick(schedule_id, tick, "started", execution_id, "backfill", "", now) for tick, execution_id in started]


# -- rows --------------------------------------------------------------------------------


def _row_for_update(schedule_id: str, *, missing_ok: bool = False, skip_locked: bool = False) -> Schedule | None:
    query = Schedule.store_objects.filter(schedule_id=schedule_id)
    if connection.features.has_select_for_update:
        query = query.select_for_update(
            skip_locked=skip_locked and connection.features.has_select_for_update_skip_locked
        )
    row = query.first()
    if row is None and not missing_ok:
        raise errors.NotFound(f"schedule `{schedule_id}` does not exist")
    return row
