"""The audit trail: who acted on an execution, from where, in the action's own transaction."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from executions import errors
from executions.events import check_text
from executions.models import AuditEntry
from executions.store.common import canonical_id, utc_now, write_transaction

VIA = ("admin", "api", "cli", "python")
SCHEDULE_SUBJECT = "schedule:"  # the audit subject of a schedule: ``schedule:<schedule id>``


@dataclass(frozen=True)
class AuditRecord:
    created_at: datetime
    actor: str
    via: str
    action: str
    execution_id: str
    detail: dict


@dataclass
class AuditScope:
    """Handed to the body of ``audited``: what it puts in ``detail`` is recorded."""

    detail: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def audited(action: str, execution_id: str, *, actor: str, via: str, now: datetime | None = None):
    """Run an operator's action and record it in one transaction: the action's events and
    its audit entry commit together, and an action that raises leaves no entry (nor any
    other write). Store operations inside nest as savepoints of this transaction.

    The subject is an execution id, or ``schedule:<id>`` for an action on a schedule
    (``t_audit.execution_id`` is plain text, D116)."""
    if via not in VIA:
        raise errors.ValidationFailed(f"via must be one of {', '.join(VIA)}")
    if not isinstance(actor, str) or not actor or len(actor) > 256:
        raise errors.ValidationFailed("an audited action needs an actor of 1 to 256 characters")
    check_text(actor, "actor")
    if not execution_id.startswith(SCHEDULE_SUBJECT):
        execution_id = canonical_id(execution_id)
    scope = AuditScope()
    with write_transaction():
        yield scope
        AuditEntry.store_objects.create(
            created_at=utc_now(now),
            actor=actor,
            via=via,
            action=action,
            execution_id=execution_id,
            detail=scope.detail,
        )


def list_audit(execution_id: str | None = None, *, limit: int = 100) -> list[AuditRecord]:
    """Audit entries, newest first; of one execution when ``execution_id`` is given."""
    query = AuditEntry.objects.order_by("-created_at", "-id")
    if execution_id is not None:
        subject = execution_id if execution_id.startswith(SCHEDULE_SUBJECT) else canonical_id(execution_id)
        query = query.filter(execution_id=subject)
    return [AuditRecord(e.created_at, e.actor, e.via, e.action, e.execution_id, e.detail) for e in query[:limit]]
