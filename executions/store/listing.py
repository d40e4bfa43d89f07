"""Listing executions with filters and keyset cursors (spec 000 §7.4 list_executions)."""

from __future__ import annotations

import base64
from datetime import datetime

from django.db.models import Q

from executions import errors
from executions.events import check_text
from executions.ids import ExecutionId
from executions.models import (
    ExecutionState,
)
from executions.outcome import FINISHED_OUTCOMES, expand_outcomes, result_kind_of_outcome
from executions.state_machine import (
    Lifecycle,
    State,
)
from executions.store.common import in_utc, utc_now
from executions.store.datatypes import STATUS_FILTERS, ExecutionFilter, ExecutionSnapshot, Page

MAX_FILTER_CHARS = 1024  # longest text filter; the longest column compared (execution_id) has 1024
MAX_CURSOR_CHARS = 2048


def filter_text(value: object, what: str) -> str:
    """A text filter must be text that can reach the database: ``ValidationFailed`` for a
    non-string or an over-long one, ``UnsupportedValue`` for a NUL or a lone surrogate
    (PostgreSQL cannot take either; the driver would raise mid-query)."""
    if not isinstance(value, str):
        raise errors.ValidationFailed(f"{what} must be text, got {type(value).__name__}")
    if len(value) > MAX_FILTER_CHARS:
        raise errors.ValidationFailed(
            f"{what} is {len(value)} characters, more than {MAX_FILTER_CHARS}: `{errors.excerpt(value)}`"
        )
    check_text(value, f"{what} `{errors.excerpt(value)}`")
    return value


def encode_cursor(row: ExecutionSnapshot) -> str:
    raw = f"{row.created_at.isoformat()}|{row.execution_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    invalid = errors.ValidationFailed(f"invalid cursor `{errors.excerpt(cursor)}`")
    if not isinstance(cursor, str) or len(cursor) > MAX_CURSOR_CHARS or not cursor.isascii():
        raise invalid
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, execution_id = raw.split("|", 1)
        at = datetime.fromisoformat(created_at)
        check_text(execution_id, "cursor")
    except (ValueError, UnicodeDecodeError, errors.ValidationFailed):
        raise invalid from None
    if at.tzinfo is None:  # every cursor we hand out is aware; a naive one cannot be compared
        raise invalid
    return in_utc(at, invalid), execution_id


def _status_condition(status: str, now: datetime) -> Q:
    finished_ok = '"ok"'
    finished_error = '{"err":"error"}'
    return {
        "pending": Q(state=State.PENDING_AT, lifecycle=Lifecycle.ACTIVE, pending_expires_finished__lte=now),
        "scheduled": Q(state=State.PENDING_AT, lifecycle=Lifecycle.ACTIVE, pending_expires_finished__gt=now),
        "locked": Q(state=State.LOCKED, lifecycle=Lifecycle.ACTIVE),
        "blocked": Q(state=State.BLOCKED_BY_JOIN_SET, lifecycle=Lifecycle.ACTIVE),
        "paused": Q(lifecycle=Lifecycle.PAUSED),
        "cancelling": Q(lifecycle=Lifecycle.CANCELLING),
        "finished": Q(state=State.FINISHED),
        "finished_ok": Q(state=State.FINISHED, result_kind=finished_ok),
        "finished_error": Q(state=State.FINISHED, result_kind=finished_error),
        "finished_failure": Q(state=State.FINISHED) & ~Q(result_kind__in=[finished_ok, finished_error]),
    }[status]


# Unfinished outcomes are statuses under another name (``executions.outcome``).
_UNFINISHED_OUTCOME_STATUS = {
    "pending": "pending",
    "scheduled": "scheduled",
    "running": "locked",
    "blocked": "blocked",
    "paused": "paused",
    "cancelling": "cancelling",
}


def outcome_condition(outcomes, now: datetime) -> Q:
    """The condition of an outcome filter (``failed`` is every failure kind), applied on
    ``t_state`` itself: each finished outcome is a range of ``t_state_outcome``, each
    unfinished one a condition the partial indexes serve (D93). ``ValidationFailed`` for an
    unknown outcome."""
    try:
        expanded = expand_outcomes(outcomes)
    except ValueError as error:
        raise errors.ValidationFailed(errors.excerpt(str(error), 300)) from None
    finished = [result_kind_of_outcome(o) for o in expanded if o in FINISHED_OUTCOMES]
    condition = Q(state=State.FINISHED, result_kind__in=finished) if finished else Q(pk__in=[])
    for outcome in expanded:
        if outcome not in FINISHED_OUTCOMES:
            condition |= _status_condition(_UNFINISHED_OUTCOME_STATUS[outcome], now)
    return condition


def finished_since(since: datetime) -> Q:
    """Finished at or after ``since``: a range of ``t_state_finished_at`` (D93), the same
    condition the dashboard's last hour counts."""
    return Q(state=State.FINISHED, pending_expires_finished__gte=since)


def _aware(value: object, what: str) -> datetime:
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise errors.ValidationFailed(f"{what} must be a timezone-aware datetime")
    return in_utc(value, errors.ValidationFailed(f"{what} is out of range: in UTC it must fall in the years 1 to 9999"))


def filter_executions(filters: ExecutionFilter, *, now: datetime | None = None):
    """The queryset of ``list_executions`` (also used by the admin's counts): read-only, as
    every ``objects`` queryset of the store's models is (``models.ReadOnlyQuerySet``)."""
    now = utc_now(now)
    query = ExecutionState.objects.all()
    if filters.parent_id:
        parent = ExecutionId.parse(filter_text(filters.parent_id, "parent id"))
        # Children are `<parent>.<kind>:<name>_<idx>` with no further `.` after the prefix.
        query = query.filter(execution_id__startswith=f"{parent}.").exclude(
            execution_id__regex=r"^" + str(parent).replace(".", r"\.") + r"\.[^.]*\."
        )
    elif not filters.show_derived:
        query = query.filter(is_top_level=True)
    if filters.created_after is not None:
        query = query.filter(created_at__gte=_aware(filters.created_after, "created_after"))
    if filters.created_before is not None:
        query = query.filter(created_at__lt=_aware(filters.created_before, "created_before"))
    if filters.outcomes:
        query = query.filter(outcome_condition(filters.outcomes, now))
    if filters.ffqn_prefix:
        query = query.filter(ffqn__startswith=filter_text(filters.ffqn_prefix, "function prefix"))
    if filters.execution_id_prefix:
        query = query.filter(execution_id__startswith=filter_text(filters.execution_id_prefix, "execution id prefix"))
    if filters.hide_finished:
        query = query.exclude(state=State.FINISHED)
    if filters.deployment_id:
        query = query.filter(deployment_id=filter_text(filters.deployment_id, "deployment id"))
    if filters.component_digest:
        query = query.filter(component_id_input_digest=filter_text(filters.component_digest, "component digest"))
    if filters.statuses:
        unknown = set(filters.statuses) - set(STATUS_FILTERS)
        if unknown:
            shown = errors.excerpt(", ".join(sorted(map(str, unknown))))
            raise errors.ValidationFailed(f"unknown status filter(s) {shown}; use {', '.join(STATUS_FILTERS)}")
        condition = Q()
        for status in filters.statuses:
            condition |= _status_condition(status, now)
        query = query.filter(condition)
    return query


def list_executions(
    filters: ExecutionFilter = ExecutionFilter(),
    *,
    limit: int = 20,
    older_than: str | None = None,
    newer_than: str | None = None,
    now: datetime | None = None,
) -> Page:
    """A page of executions, newest first, with keyset cursors on ``(created_at, id)``.

    Pass ``older_cursor`` of a page as ``older_than`` for the next page, ``newer_cursor`` as
    ``newer_than`` for the previous one. Ordering and cursor use the same key (a deliberate
    fix of spec 000 §12.17).
    """
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1 or limit > 1000:
        raise errors.ValidationFailed(f"limit must be between 1 and 1000, got {errors.excerpt(limit)}")
    if older_than and newer_than:
        raise errors.ValidationFailed("pass older_than or newer_than, not both")
    query = filter_executions(filters, now=now)
    if newer_than:
        at, execution_id = decode_cursor(newer_than)
        query = query.filter(Q(created_at__gt=at) | Q(created_at=at, execution_id__gt=execution_id))
        rows = [ExecutionSnapshot.of(row) for row in query.order_by("created_at", "execution_id")[: limit + 1]]
        more_newer = len(rows) > limit
        rows = rows[:limit][::-1]
        return Page(
            rows,
            older_cursor=encode_cursor(rows[-1]) if rows else None,
            newer_cursor=encode_cursor(rows[0]) if rows and more_newer else None,
        )
    if older_than:
        at, execution_id = decode_cursor(older_than)
        query = query.filter(Q(created_at__lt=at) | Q(created_at=at, execution_id__lt=execution_id))
    rows = [ExecutionSnapshot.of(row) for row in query.order_by("-created_at", "-execution_id")[: limit + 1]]
    more_older = len(rows) > limit
    rows = rows[:limit]
    return Page(
        rows,
        older_cursor=encode_cursor(rows[-1]) if rows and more_older else None,
        newer_cursor=encode_cursor(rows[0]) if rows and older_than else None,
    )


def in_flight_of_component(component_digest: str, *, limit: int = 10_000) -> list[ExecutionSnapshot]:
    """The unfinished executions pinned to ``component_digest``, oldest first (at most
    ``limit``): what an upgrade from that component would move. Served by the index
    ``t_state_component``."""
    query = ExecutionState.objects.filter(component_id_input_digest=component_digest).exclude(state=State.FINISHED)
    return [ExecutionSnapshot.of(row) for row in query.order_by("created_at", "execution_id")[:limit]]
