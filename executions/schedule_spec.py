"""When a schedule ticks, and what a tick does: pure, no Django (floor 1).

A spec is a cron string (croniter, 5 or 6 fields; the sixth is seconds), an interval, or
both (their ticks merged), read in an IANA time zone, between optional start and end times.
Daylight-saving changes are croniter's: a wall-clock time the zone skips fires at the first
time after the gap (02:30 on the spring-forward day fires once, at 03:00). On the day the
clocks go back, a cron whose hour field is fixed fires once, at the first of the two
repeated times; a cron with ``*`` hours keeps both, an hour of elapsed time apart (D114).

``plan_ticks`` is the overlap policy and the catch-up window as one pure decision (D115);
``tick_execution_id`` makes a tick's execution id from the schedule and the tick's time, so
any number of sweeps firing one tick create it once (decision 13, D113).

why: D113, D114, D115
"""

from __future__ import annotations

import enum
import hashlib
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter
from ulid import ULID

from executions.errors import ValidationFailed, excerpt

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)  # far from datetime's end, so that next ticks never overflow
SCHEDULE_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:")


class Overlap(enum.StrEnum):
    """What a tick does while the schedule's previous execution still runs (Temporal's)."""

    SKIP = "skip"  # it is skipped
    BUFFER_ONE = "buffer_one"  # it waits for the running one; one waits at most
    BUFFER_ALL = "buffer_all"  # every such tick waits, in order
    ALLOW_ALL = "allow_all"  # it starts anyway
    CANCEL_OTHER = "cancel_other"  # the running one is cancelled and it starts


class SpecError(ValidationFailed):
    """A schedule's spec or settings are invalid; ``field`` names which."""

    code = "invalid_schedule"

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


def check_schedule_id(schedule_id: object) -> str:
    if not isinstance(schedule_id, str) or not 1 <= len(schedule_id) <= 128:
        raise SpecError("schedule_id", "must be text of 1 to 128 characters")
    if not set(schedule_id) <= SCHEDULE_ID_CHARS:
        raise SpecError("schedule_id", f"`{excerpt(schedule_id)}` may hold only letters, digits and `_ - . :`")
    return schedule_id


def parse_overlap(value: object) -> Overlap:
    try:
        return Overlap(value)
    except ValueError:
        raise SpecError(
            "overlap", f"must be one of {', '.join(p.value for p in Overlap)}, got `{excerpt(value)}`"
        ) from None


def parse_timezone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise SpecError("timezone", "must be an IANA time zone name such as `Europe/Prague` or `UTC`")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a name too long for a file
        raise SpecError(
            "timezone", f"unknown time zone `{excerpt(name)}` (an IANA name such as `Europe/Prague`)"
        ) from None


def _aware(value: datetime | None, field_name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise SpecError(field_name, "must be a date-time with a time zone")
    try:
        value = value.astimezone(UTC)
    except OverflowError:
        value = None
    if value is None or not EPOCH <= value <= LATEST:
        raise SpecError(field_name, "must fall between 1970 and 9000 (UTC)")
    return value


@dataclass(frozen=True)
class ScheduleFields:
    """What a schedule says, field by field, before any check: the fields a caller's
    ``executions.schedules.ScheduleRequest`` and ``@schedule``'s
    ``workers.scheduling.DeclaredSchedule`` share (``ScheduleRequest.definition`` checks
    them)."""

    schedule_id: str
    ffqn: str
    arguments: list | dict
    cron: str = ""
    interval_seconds: float | None = None
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    jitter_seconds: float = 0
    overlap: str = "skip"
    catchup_window_seconds: float = 60


@dataclass(frozen=True)
class ScheduleSpec:
    """When ticks fall. Build with ``ScheduleSpec.parse``, which checks every field."""

    cron: str = ""
    interval: timedelta | None = None
    timezone: str = "UTC"
    start_at: datetime | None = None
    end_at: datetime | None = None
    jitter: timedelta = timedelta(0)
    _zone: ZoneInfo = field(default=ZoneInfo("UTC"), repr=False, compare=False)

    @classmethod
    def parse(
        cls,
        *,
        cron: str | None = None,
        interval_seconds: float | None = None,
        timezone: str = "UTC",
        start_at: datetime | None = None,
        end_at: datetime | None = None,
        jitter_seconds: float = 0,
    ) -> ScheduleSpec:
        cron = _check_cron(cron or "")
        interval = _check_interval(interval_seconds)
        if not cron and interval is None:
            raise SpecError("cron", "a schedule needs a cron string, an interval, or both")
        zone = parse_timezone(timezone)
        start_at, end_at = _aware(start_at, "start_at"), _aware(end_at, "end_at")
        if start_at and end_at and end_at <= start_at:
            raise SpecError("end_at", "must be after start_at")
        if not isinstance(jitter_seconds, int | float) or isinstance(jitter_seconds, bool):
            raise SpecError("jitter_seconds", "must be a number of seconds")
        if not 0 <= jitter_seconds <= 86_400 or math.isnan(jitter_seconds):
            raise SpecError("jitter_seconds", "must be between 0 and 86400")
        return cls(cron, interval, timezone, start_at, end_at, timedelta(seconds=jitter_seconds), zone)

    # -- ticks -------------------------------------------------------------------------

    def next_after(self, moment: datetime) -> datetime | None:
        """The first tick strictly after ``moment`` (UTC), or None once the spec has ended."""
        moment = moment.astimezone(UTC)
        if self.start_at is not None and moment < self.start_at:
            moment = self.start_at - timedelta(microseconds=1)
        candidates = [t for t in (self._next_cron(moment), self._next_interval(moment)) if t is not None]
        if not candidates:
            return None
        tick = min(candidates)
        if self.end_at is not None and tick > self.end_at:
            return None
        return tick

    def next_times(self, after: datetime, count: int) -> list[datetime]:
        times, moment = [], after
        while len(times) < count and (moment := self.next_after(moment)) is not None:
            times.append(moment)
        return times

    def _next_cron(self, moment: datetime) -> datetime | None:
        if not self.cron:
            return None
        local = moment.astimezone(self._zone)
        iterator = croniter(self.cron, local)
        fixed_hours = iterator.expanded[1] != ["*"]  # `*/1` and `0-23` are `*` too
        for _ in range(4):  # at most one repeated wall-clock time to step over
            tick = iterator.get_next(datetime)
            if fixed_hours and _repeated_wall_time(tick, self._zone):
                continue
            return tick.astimezone(UTC)
        return None

    def _next_interval(self, moment: datetime) -> datetime | None:
        if self.interval is None:
            return None
        anchor = self.start_at or EPOCH
        steps = math.floor((moment - anchor) / self.interval) + 1
        return anchor + self.interval * max(steps, 0)

    def jitter_of(self, key: str, nominal: datetime) -> timedelta:
        """A tick's delay in ``[0, jitter)``, the same every time it is computed."""
        if not self.jitter:
            return timedelta(0)
        fraction = int.from_bytes(_tick_hash(key, nominal)[10:14], "big") / 2**32
        return timedelta(microseconds=int(self.jitter / timedelta(microseconds=1) * fraction))


def _repeated_wall_time(tick: datetime, zone: ZoneInfo) -> bool:
    """The second of two instants with this wall-clock time (the clocks went back)."""
    naive = tick.replace(tzinfo=None)
    first = naive.replace(tzinfo=zone, fold=0)
    second = naive.replace(tzinfo=zone, fold=1)
    return first.utcoffset() != second.utcoffset() and tick.utcoffset() == second.utcoffset()


def _check_cron(cron: object) -> str:
    if not isinstance(cron, str):
        raise SpecError("cron", "must be text")
    cron = " ".join(cron.split())
    if not cron:
        return ""
    if len(cron.split()) not in (5, 6):
        raise SpecError("cron", f"`{excerpt(cron)}` needs 5 fields (minute hour day month weekday) or 6 (… seconds)")
    try:
        croniter(cron, EPOCH)
    except (CroniterError, ValueError, KeyError, TypeError) as error:
        raise SpecError("cron", f"`{excerpt(cron)}` is not a valid cron string: {error}") from None
    return cron


def _check_interval(seconds: object) -> timedelta | None:
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or math.isnan(seconds):
        raise SpecError("interval_seconds", "must be a number of seconds")
    if seconds <= 0:
        raise SpecError("interval_seconds", f"must be above zero, got {seconds}")
    if seconds < 0.001 or seconds > 366 * 86_400:
        raise SpecError("interval_seconds", "must be between 0.001 and 31622400 (a year)")
    return timedelta(seconds=seconds)


# -- tick ids ---------------------------------------------------------------------------


def _tick_hash(key: str, nominal: datetime) -> bytes:
    return hashlib.sha256(f"{key}|{nominal.astimezone(UTC).isoformat()}".encode()).digest()


def tick_execution_id(key: str, nominal: datetime) -> str:
    """``E_<ULID>`` of a tick: its time in the ULID's 48 time bits (so tick executions sort by
    tick), and 80 bits of a hash of the schedule's key and the tick's time."""
    millis = max(0, int((nominal.astimezone(UTC) - EPOCH) / timedelta(milliseconds=1)))
    return f"E_{ULID.from_bytes(millis.to_bytes(6, 'big') + _tick_hash(key, nominal)[:10])}"


# -- what due ticks do -------------------------------------------------------------------


@dataclass
class TickPlan:
    """The decision for a schedule's due ticks: which start, wait, or are dropped, and why."""

    start: list[datetime] = field(default_factory=list)
    buffered: list[datetime] = field(default_factory=list)  # the buffer after this decision
    dropped: list[tuple[datetime, str, str]] = field(default_factory=list)  # (tick, action, reason)
    cancel_running: bool = False


def plan_ticks(
    due: list[datetime], *, buffered: list[datetime], running: bool, overlap: Overlap, now: datetime, window: timedelta
) -> TickPlan:
    """Decide what due ticks do, as if they came one after another in no time (D115).

    A tick older than the catch-up window is ``missed``. The rest, after any already
    buffered ones, meet the overlap policy: while an execution of the schedule runs (or once
    the first of them has started), ``skip`` drops them, ``buffer_one`` keeps one waiting,
    ``buffer_all`` keeps all, ``allow_all`` starts all, and ``cancel_other`` cancels the
    running one and starts only the latest (the earlier are ``superseded``).
    """
    plan = TickPlan()
    fresh = []
    for tick in due:
        if now - tick > window:
            plan.dropped.append((tick, "missed", f"more than {window.total_seconds():g} s late (the catch-up window)"))
        else:
            fresh.append(tick)
    queue = list(buffered) + fresh
    if overlap is Overlap.ALLOW_ALL:
        plan.start = queue
        return plan
    if overlap is Overlap.CANCEL_OTHER:
        if queue:
            plan.start = queue[-1:]
            plan.cancel_running = running
            plan.dropped += [(t, "superseded", "a later tick replaced it (cancel_other)") for t in queue[:-1]]
        return plan
    if not running and queue:
        plan.start, queue = queue[:1], queue[1:]
    capacity = {Overlap.SKIP: 0, Overlap.BUFFER_ONE: 1, Overlap.BUFFER_ALL: len(queue)}[overlap]
    plan.buffered = queue[:capacity]
    plan.dropped += [(t, "skipped", f"the previous run still ran ({overlap.value})") for t in queue[capacity:]]
    return plan
