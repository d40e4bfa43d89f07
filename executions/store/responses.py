"""Join-set responses and delays (spec 000 §6.4, §7.3, §7.4)."""

from __future__ import annotations

from datetime import datetime

from executions import errors, notify
from executions.ids import (
    DelayId,
    JoinSetId,
)
from executions.models import (
    Delay,
    JoinSetResponse,
)
from executions.store.common import _eid, _now, _row_for_update, _write_transaction
from executions.store.datatypes import DelayOutcome
from executions.store.transitions import _deliver_response


def append_delay_response(delay_id: str, success: bool, *, now: datetime | None = None) -> DelayOutcome:
    """Deliver a delay's response: fired (``success``) or cancelled; idempotent per delay."""
    now = _now(now)
    delay = DelayId.parse(delay_id)
    execution_id, join_set_id = str(delay.execution_id), str(delay.join_set_id)
    with _write_transaction():
        _row_for_update(execution_id)
        previous = list(
            JoinSetResponse.objects.filter(execution_id=execution_id, delay_id=str(delay)).values_list(
                "delay_success", flat=True
            )
        )
        if previous:
            return DelayOutcome.ALREADY_FIRED if previous[0] else DelayOutcome.ALREADY_CANCELLED
        if not Delay.objects.filter(delay_id=str(delay)).exists():
            raise errors.NotFound(f"delay `{delay}` was never requested")
        notes = notify.Notes()
        _deliver_response(execution_id, join_set_id, now, notes, delay_id=str(delay), delay_success=success)
        notes.publish()
    return DelayOutcome.DELIVERED


def append_response_for_test(
    parent_id: str, join_set_id: str, child_id: str, finished_version: int, *, now=None
) -> int:
    """Deliver a child response directly (tests only; a real child response comes with its
    ``Finished`` event)."""
    now = _now(now)
    with _write_transaction():
        notes = notify.Notes()
        seq = _deliver_response(
            _eid(parent_id), str(JoinSetId.parse(join_set_id)), now, notes,
            child_id=_eid(child_id), finished_version=finished_version,
        )  # fmt: skip
        notes.publish()
    return seq


def pause_delay(delay_id: str) -> None:
    _set_delay_paused(delay_id, True)


def unpause_delay(delay_id: str) -> None:
    _set_delay_paused(delay_id, False)


def _set_delay_paused(delay_id: str, paused: bool) -> None:
    delay = str(DelayId.parse(delay_id))
    with _write_transaction():
        if not Delay.objects.filter(delay_id=delay).update(is_paused=paused):
            raise errors.NotFound(f"delay `{delay}` not found: already fired or cancelled")
        notes = notify.Notes(timers=True)
        notes.publish()
