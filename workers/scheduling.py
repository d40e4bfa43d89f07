"""``@schedule``: a schedule declared in code, next to the function it starts.

::

    from workers import schedule, workflow

    @schedule("0 2 * * *", tz="Europe/Prague")            # every night at 02:00, Prague time
    @schedule(every=timedelta(minutes=10), id="report-10m", overlap="buffer_one")
    @workflow
    def report(ctx, scheduled_at: str) -> int: ...

Put it above ``@activity`` or ``@workflow``. Declaring only records the schedule here; a
worker applies the declared schedules when it starts (``executions.schedules.apply``: by id,
created, changed or left as they are, so starting any number of workers keeps one schedule
each, as DBOS's ``apply_schedules``). This module imports no worker runtime and no Django.

why: D113
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from executions.schedule_spec import ScheduleFields
from workers.registry import Function, RegistrationError

_DECLARED: dict[str, DeclaredSchedule] = {}


@dataclass(frozen=True)
class DeclaredSchedule(ScheduleFields):
    """A schedule as ``@schedule`` declared it (validated when a worker applies it)."""

    where: str = field(default="", compare=False)


def schedule(
    cron: str | None = None,
    *,
    every: timedelta | None = None,
    tz: str = "UTC",
    id: str | None = None,  # noqa: A002 - the schedule's id, as users call it
    args: list | dict | None = None,
    overlap: str = "skip",
    catchup_window: timedelta = timedelta(minutes=1),
    jitter: timedelta = timedelta(0),
    start_at: datetime | None = None,
    end_at: datetime | None = None,
):
    """Declare a schedule of the decorated activity or workflow: a cron string (5 fields,
    or 6 with seconds last), ``every`` (an interval), or both, in time zone ``tz``. ``id``
    defaults to the function's module and name; ``args`` are its arguments."""

    def declare(function: Any) -> Any:
        if not isinstance(function, Function):
            raise RegistrationError("@schedule goes above @activity or @workflow (it needs the registered function)")
        schedule_id = id or f"{function.module}.{function.fn.__name__}"
        declared = DeclaredSchedule(
            schedule_id=schedule_id,
            ffqn=function.ffqn,
            arguments=[] if args is None else args,
            cron=cron or "",
            interval_seconds=every.total_seconds() if isinstance(every, timedelta) else every,
            timezone=tz,
            start_at=start_at,
            end_at=end_at,
            jitter_seconds=jitter.total_seconds(),
            overlap=overlap,
            catchup_window_seconds=catchup_window.total_seconds(),
            where=f"{function.module}.{function.fn.__name__}",
        )
        if _DECLARED.get(schedule_id, declared) != declared:  # the same again: a module imported twice
            raise RegistrationError(
                f"schedule `{schedule_id}` is declared twice; give each @schedule of a function its own id="
            )
        _DECLARED[schedule_id] = declared
        return function

    return declare


def declared_schedules() -> list[DeclaredSchedule]:
    """Every schedule the imported modules declared."""
    return list(_DECLARED.values())


def forget_declared_schedules() -> None:
    """Clear the declarations (tests that import components of their own)."""
    _DECLARED.clear()
