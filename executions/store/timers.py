"""Expired locks and due delays: what the timer sweep acts on (spec 000 §7.3, §10)."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timedelta

from django.db.models import Min

from executions import notify
from executions.events import (
    Event,
)
from executions.models import (
    Delay,
    ExecutionState,
)
from executions.state_machine import (
    ExpiredLock,
    Lifecycle,
    State,
    on_lock_expired,
)
from executions.store.common import canonical_id, has_unfinished_children, utc_now, write_transaction
from executions.store.datatypes import DelayOutcome, ExpiredDelay
from executions.store.responses import append_delay_response
from executions.store.transitions import append_in_tx

logger = logging.getLogger("obelisk.store")


def get_expired_timers(
    *, now: datetime | None = None, limit: int = 1000
) -> tuple[list[ExpiredDelay], list[ExpiredLock]]:
    """Due, unpaused delays and expired locks (of any lifecycle; see ``on_lock_expired``)."""
    now = utc_now(now)
    delays = [
        ExpiredDelay(*row)
        for row in Delay.objects.filter(expires_at__lte=now, is_paused=False)
        .order_by("expires_at")
        .values_list("delay_id", "execution_id", "join_set_id", "expires_at")[:limit]
    ]
    locks = [
        _expired_lock(row)
        for row in ExecutionState.objects.filter(state=State.LOCKED, pending_expires_finished__lte=now).order_by(
            "pending_expires_finished"
        )[:limit]
    ]
    return delays, locks


def _expired_lock(row: ExecutionState) -> ExpiredLock:
    return ExpiredLock(
        execution_id=row.execution_id,
        locked_at_version=row.last_lock_version,
        next_version=row.corresponding_version + 1,
        intermittent_event_count=row.intermittent_event_count,
        max_retries=row.max_retries,
        retry_exp_backoff=timedelta(milliseconds=row.retry_exp_backoff_millis or 0),
        executor_id=row.executor_id,
        run_id=row.run_id,
        lifecycle=row.lifecycle,
    )


def next_timer_at() -> datetime | None:
    """When the earliest lock expires or delay is due: the sweep's next wake-up."""
    first_lock = (
        ExecutionState.objects.filter(state=State.LOCKED)
        .order_by("pending_expires_finished")
        .values_list("pending_expires_finished", flat=True)
        .first()
    )
    first_delay = (
        Delay.objects.filter(is_paused=False).order_by("expires_at").values_list("expires_at", flat=True).first()
    )
    times = [t for t in (first_lock, first_delay) if t is not None]
    return min(times) if times else None


def next_pending_at(ffqns) -> datetime | None:
    """When the earliest pending execution of these functions is due (a broker's next
    wake-up when no notification comes)."""
    ffqns = list(ffqns)
    if not ffqns:
        return None
    return ExecutionState.objects.filter(state=State.PENDING_AT, lifecycle=Lifecycle.ACTIVE, ffqn__in=ffqns).aggregate(
        first=Min("pending_expires_finished")
    )["first"]


def expire_lock(execution_id: str, *, now: datetime | None = None) -> Event | None:
    """Handle one expired lock: retry, unlock or finish it (``on_lock_expired``).

    Skips (returns None) a row another sweeper holds, or one no longer locked and expired:
    the holder may have finished or extended in the meantime. The appended event revokes the
    holder's lock, so a late write from it fails with ``LockLost``.
    """
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    with write_transaction():
        row = (
            ExecutionState.objects.select_for_update(skip_locked=True)
            .filter(pk=execution_id, state=State.LOCKED, pending_expires_finished__lte=now)
            .first()
        )
        if row is None:
            return None
        lock = _expired_lock(row)
        if row.lifecycle == Lifecycle.CANCELLING and row.component_type == "workflow":
            lock = replace(lock, children_running=has_unfinished_children(execution_id))
        event = on_lock_expired(lock, now)
        notes = notify.Notes()
        append_in_tx(row, row.corresponding_version + 1, event, now, None, notes)
        notes.publish()
    logger.info("lock of %s expired: %s", execution_id, event.VARIANT)
    return event


def fire_delay(delay_id: str, *, now: datetime | None = None) -> DelayOutcome:
    """The sweep's action for a due delay: deliver its ``DelayFinished`` (success)."""
    return append_delay_response(delay_id, True, now=now)
