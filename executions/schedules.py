"""Schedules for people and programs: create, change, pause, trigger, backfill, delete, and
the timer sweep's firing of due ticks (floor 4, next to ``executions.client``).

A schedule starts an ordinary execution of its target at every tick. The target and its
arguments are checked against the catalogue when the schedule is saved (a wrong call is
refused, naming the field, and nothing is created) and again at every tick against the
active deployment: a tick whose call no longer fits (a deploy changed the function) pauses
the schedule with the reason instead of failing the sweep. Every tick's execution carries
``obelisk.schedule`` and ``obelisk.scheduled_at`` in its metadata, and a target with a
parameter named ``scheduled_at`` that the schedule's arguments leave out receives the
tick's time (ISO 8601) there.

Every action by a person (``via`` admin, api or cli) is audited under ``schedule:<id>``::

    from executions import schedules
    schedules.create("nightly", "py:demo/workflows.report", [], cron="0 2 * * *", timezone="Europe/Prague")
    schedules.trigger("nightly")

why: D113, D114, D115, D116
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from executions import catalog, conf, errors, store
from executions.events import check_storable
from executions.ids import FunctionFqn
from executions.models import Schedule
from executions.schedule_spec import (
    Overlap,
    ScheduleFields,
    ScheduleSpec,
    SpecError,
    check_schedule_id,
    parse_overlap,
)
from executions.store.audit import SCHEDULE_SUBJECT

SYSTEM_ACTOR = "system"
SCHEDULED_AT_PARAMETER = "scheduled_at"
METADATA_SCHEDULE = "obelisk.schedule"
METADATA_SCHEDULED_AT = "obelisk.scheduled_at"


@dataclass(frozen=True)
class ScheduleRequest(ScheduleFields):
    """A schedule as a caller describes it; ``definition()`` checks every field."""

    source: str = "runtime"

    def definition(self) -> store.ScheduleDefinition:
        check_schedule_id(self.schedule_id)
        spec = ScheduleSpec.parse(
            cron=self.cron,
            interval_seconds=self.interval_seconds,
            timezone=self.timezone,
            start_at=self.start_at,
            end_at=self.end_at,
            jitter_seconds=self.jitter_seconds,
        )
        window = self.catchup_window_seconds
        if isinstance(window, bool) or not isinstance(window, int | float) or not 0 <= window <= 366 * 86_400:
            raise SpecError("catchup_window_seconds", "must be a number of seconds from 0 to 31622400")
        _check_target(self.ffqn, self.arguments)
        return store.ScheduleDefinition(
            schedule_id=self.schedule_id,
            ffqn=self.ffqn,
            arguments=self.arguments,
            spec=spec,
            overlap=parse_overlap(self.overlap),
            catchup_window=timedelta(seconds=window),
            source=self.source,
        )


def _check_target(ffqn: str, arguments) -> None:
    """The target exists and the arguments fit it, with the tick's time filled in."""
    if not isinstance(ffqn, str):
        raise SpecError("ffqn", "must be a function name such as `py:demo/workflows.report`")
    try:
        FunctionFqn.parse(ffqn)
        function = catalog.find_function(ffqn)
    except errors.StoreError as error:
        raise SpecError("ffqn", str(error)) from None
    if not isinstance(arguments, list | dict):
        raise SpecError("arguments", "must be a JSON array, or an object by parameter name")
    check_storable(arguments, "arguments", max_depth=conf.get("MAX_JSON_DEPTH"))
    try:
        function.encode_arguments(_with_scheduled_at(function, arguments, "1970-01-01T00:00:00+00:00"))
    except errors.ValidationFailed as error:
        raise SpecError("arguments", str(error)) from None


def _with_scheduled_at(function: catalog.StoredFunction, arguments, tick_iso: str):
    """The arguments with the tick's time as ``scheduled_at`` when the target has that
    parameter and the arguments leave it out."""
    names = [p.name for p in function.parameters]
    if SCHEDULED_AT_PARAMETER not in names:
        return arguments
    if isinstance(arguments, dict):
        return arguments if SCHEDULED_AT_PARAMETER in arguments else {**arguments, SCHEDULED_AT_PARAMETER: tick_iso}
    if len(arguments) == names.index(SCHEDULED_AT_PARAMETER):
        return [*arguments, tick_iso]
    return arguments


def prepare_tick(row: Schedule, tick: datetime, execution_id: str) -> store.CreateRequest:
    """A tick's execution, against the active deployment (the store's ``prepare``)."""
    try:
        function = catalog.find_function(row.ffqn)
        params = function.encode_arguments(_with_scheduled_at(function, row.arguments, tick.isoformat()))
    except errors.StoreError as error:
        reason = str(error).removeprefix(f"{row.ffqn}: ")  # the catalogue's errors may start with the name
        raise store.TargetFailed(f"cannot submit {row.ffqn}: {reason}") from None
    return store.CreateRequest(
        execution_id=execution_id,
        ffqn=row.ffqn,
        params=params,
        component_id=function.component_id,
        deployment_id=function.deployment_id,
        scheduled_at=tick,
        metadata={METADATA_SCHEDULE: row.schedule_id, METADATA_SCHEDULED_AT: tick.isoformat()},
    )


# -- the sweep -------------------------------------------------------------------------


def fire_due(*, now: datetime | None = None, limit: int = 100) -> store.FireReport:
    """Fire every due tick (the timer sweep calls this)."""
    return store.fire_due_schedules(prepare_tick, now=now, limit=limit)


# -- people and programs ------------------------------------------------------------------


def create(request: ScheduleRequest, *, paused: bool = False, actor=SYSTEM_ACTOR, via="python") -> Schedule:
    definition = request.definition()
    with _audited("schedule_create", definition.schedule_id, actor, via) as audit:
        row, _ = store.save_schedule(definition, mode="create", paused=paused)
        audit.detail.update(ffqn=definition.ffqn)
    return row


def update(request: ScheduleRequest, *, actor=SYSTEM_ACTOR, via="python") -> tuple[Schedule, str]:
    definition = request.definition()
    with _audited("schedule_update", definition.schedule_id, actor, via) as audit:
        row, outcome = store.save_schedule(definition, mode="update")
        audit.detail["outcome"] = outcome
    return row, outcome


def apply(requests: list[ScheduleRequest]) -> dict[str, str]:
    """Apply schedules declared in code (``@schedule``): each is created, changed or left
    as it is, by id, so applying the same code twice is one schedule (as DBOS's
    ``apply_schedules``). A schedule paused at run time stays paused. Returns
    ``{schedule id: "created" | "changed" | "unchanged"}``."""
    outcomes = {}
    for request in requests:
        definition = request.definition()
        _, outcomes[definition.schedule_id] = store.save_schedule(definition, mode="upsert")
    return outcomes


def pause(schedule_id: str, *, reason: str = "paused by an operator", actor=SYSTEM_ACTOR, via="python") -> bool:
    with _audited("schedule_pause", schedule_id, actor, via):
        return store.set_schedule_paused(schedule_id, True, reason=reason)


def resume(schedule_id: str, *, actor=SYSTEM_ACTOR, via="python") -> bool:
    with _audited("schedule_resume", schedule_id, actor, via):
        return store.set_schedule_paused(schedule_id, False)


def trigger(schedule_id: str, *, actor=SYSTEM_ACTOR, via="python") -> str:
    """Start one tick now (whatever the overlap policy, even when paused); its execution id."""
    with _audited("schedule_trigger", schedule_id, actor, via) as audit:
        execution_id = store.trigger_schedule(schedule_id, prepare_tick)
        audit.detail["execution_id"] = execution_id
    return execution_id


def backfill(schedule_id: str, start: datetime, end: datetime, *, actor=SYSTEM_ACTOR, via="python") -> list:
    """Create each tick of ``[start, end]`` that does not exist yet; the ticks."""
    with _audited("schedule_backfill", schedule_id, actor, via) as audit:
        ticks = store.backfill_schedule(schedule_id, start, end, prepare_tick)
        audit.detail.update(start=start.isoformat(), end=end.isoformat(), ticks=len(ticks))
    return ticks


def delete(schedule_id: str, *, actor=SYSTEM_ACTOR, via="python") -> bool:
    """Delete a schedule (its executions stay); an unknown one is ``NotFound``, unaudited."""
    with _audited("schedule_delete", schedule_id, actor, via):
        if not store.delete_schedule(schedule_id):
            raise errors.NotFound(f"schedule `{schedule_id}` does not exist")
        return True


def get(schedule_id: str) -> Schedule:
    return store.get_schedule(schedule_id)


def list_all() -> list[Schedule]:
    return store.list_schedules()


def ticks(schedule_id: str, *, limit: int = 20) -> list[store.Tick]:
    return store.list_schedule_ticks(schedule_id, limit=limit)


def next_fire_times(row: Schedule, count: int = 5, *, after: datetime | None = None) -> list[datetime]:
    """The next ``count`` tick times of an active schedule (none while paused)."""
    if row.paused or row.next_tick_at is None:
        return []
    spec = store.spec_of(row)
    first = row.next_tick_at if after is None or row.next_tick_at > after else spec.next_after(after)
    return [first, *spec.next_times(first, count - 1)] if first else []


def _audited(action: str, schedule_id: str, actor: str, via: str):
    return store.audited(action, SCHEDULE_SUBJECT + check_schedule_id(schedule_id), actor=actor, via=via)


__all__ = [
    "Overlap",
    "ScheduleRequest",
    "apply",
    "backfill",
    "create",
    "delete",
    "fire_due",
    "get",
    "list_all",
    "next_fire_times",
    "pause",
    "prepare_tick",
    "resume",
    "ticks",
    "trigger",
    "update",
]
